"""unit-scaling 0.3.5's u-muP Adam learning-rate multipliers, without torch.

    pip download unit-scaling==0.3.5 --no-deps -d /tmp/us
    python benchmarks/umup_library_lr.py /tmp/us/unit_scaling-0.3.5-py3-none-any.whl

Runs the library's own pure functions (`lr_scale_for_depth`, `_get_fan_in`,
`lr_scale_func_adam` from `unit_scaling/optim.py`, read from the wheel) on the unit
model's parameters at the test preset (L = 2, D = 32, F = 128, V = 65), each tagged as
the library's `_modules.py` tags it and in torch's layout (Linear (out, in), Embedding
(num, dim)). tests/test_transfer.py's LIBRARY_UMUP_LR is this script's output.
"""

import ast
import sys
import types
import zipfile

FUNCTIONS = ("lr_scale_for_depth", "_get_fan_in", "lr_scale_func_adam")


def library_functions(wheel: str) -> dict:
  source = zipfile.ZipFile(wheel).read("unit_scaling/optim.py").decode()
  keep = [n for n in ast.parse(source).body
          if isinstance(n, ast.FunctionDef) and n.name in FUNCTIONS]
  namespace = {"ParameterData": object}  # the only annotation they need
  exec(compile(ast.Module(keep, []), "unit_scaling/optim.py", "exec"), namespace)
  return namespace


def param(mup_type, depth, *shape):
  return types.SimpleNamespace(mup_type=mup_type, mup_scaling_depth=depth, shape=shape)


PARAMS = {"w_q": param("weight", 2, 32, 32), "w_up": param("weight", 2, 128, 32),
          "w_down": param("weight", 2, 32, 128), "ln1.scale": param("norm", 2, 32),
          "embed": param("weight", None, 65, 32), "pos_embed": param("weight", None, 32, 32),
          "ln_f.scale": param("norm", None, 32), "readout": param("output", None, 65, 32)}

if __name__ == "__main__":
  lr_scale = library_functions(sys.argv[1])["lr_scale_func_adam"]
  for name, p in PARAMS.items():
    print(f'"{name}": {lr_scale(p)!r},')
