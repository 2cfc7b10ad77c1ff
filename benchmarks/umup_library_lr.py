"""Records unit_scaling 0.3.5's u-muP Adam LR multipliers without torch: the three
pure functions of unit_scaling/optim.py are executed from the wheel's source."""
import ast, sys, types, zipfile
src = zipfile.ZipFile(sys.argv[1]).read("unit_scaling/optim.py").decode()
tree = ast.parse(src)
keep = [n for n in tree.body if isinstance(n, ast.FunctionDef)
        and n.name in ("lr_scale_for_depth", "_get_fan_in", "lr_scale_func_adam")]
ns = {"ParameterData": object}
exec(compile(ast.Module(keep, []), "optim.py", "exec"), ns)
P = lambda t, d, *shape: types.SimpleNamespace(mup_type=t, mup_scaling_depth=d, shape=shape)
# torch layouts: Linear (out, in), Embedding (num, dim); L = 2 layers, D = 32, F = 128.
for name, p in {"w_q": P("weight", 2, 32, 32), "w_up": P("weight", 2, 128, 32),
                "w_down": P("weight", 2, 32, 128), "ln1.scale": P("norm", 2, 32),
                "embed": P("weight", None, 65, 32), "pos_embed": P("weight", None, 32, 32),
                "ln_f.scale": P("norm", None, 32), "readout": P("output", None, 65, 32)}.items():
  print(f'"{name}": {ns["lr_scale_func_adam"](p)!r},')
