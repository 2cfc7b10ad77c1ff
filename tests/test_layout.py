"""The house: packages by layer with no import circle, a kernel package without Flax,
the public names, and the registry's test cases covering every scaling.

A module may import only modules of its own package or of the packages listed before
its own in LAYERS (attnscale/__init__.py says the same in words).
"""

import ast
import os
import subprocess
import sys

import pytest

from attnscale.core import scalings
from attnscale.testing import SCALING_CASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "attnscale")
# Lowest first. Top-level modules: checks (imports nothing), testing (for the tests).
# commands: the command lines (attnscale-train, ...), the top of the library.
LAYERS = ["checks", "fields", "core", "numerics", "models", "data", "tasks", "config", "runtime",
          "evaluation", "experiments", "studies", "commands", "testing"]


def _modules():
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        yield rel.removesuffix(".__init__"), path


def _imports(path):
  """Every attnscale module `path` imports, at module level or inside a function."""
  tree = ast.parse(open(path).read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnscale"):
      for alias in node.names:
        found.add(f"{node.module}.{alias.name}")
        found.add(node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("attnscale")}
  return found


def _layer(module):
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else None


def test_every_import_goes_down_the_layers():
  modules = dict(_modules())
  wrong = []
  for module, path in modules.items():
    own = _layer(module)
    if own is None:  # attnscale/__init__.py: the public names, loaded lazily
      continue
    for imported in _imports(path):
      other = _layer(imported)
      if other is None or other == own or imported not in modules:
        continue  # the package itself, its own layer, or a name inside a module
      if LAYERS.index(other) > LAYERS.index(own):
        wrong.append(f"{module} imports {imported}")
  assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circle():
  modules = dict(_modules())
  graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}

  def parents(m):  # importing a.b.c runs a/__init__ and a/b/__init__ first
    parts = m.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts))}

  for m in graph:
    graph[m] = {i for i in graph[m] if i not in parents(m) and m not in parents(i)}
  state, stack = {}, []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for n in sorted(graph[m]):
      if state.get(n) == "open":
        raise AssertionError("import circle: " + " -> ".join(stack[stack.index(n):] + [n]))
      if n not in state:
        visit(n)
    stack.pop()
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m)


def test_every_module_imports():
  for module, _ in _modules():
    if module.endswith("__main__"):
      continue
    __import__(module)


@pytest.mark.parametrize("code, absent", [
    ("import attnscale.core.attention, attnscale.core.splash_attention", "flax"),
    ("import attnscale", "jax"),
    ("import attnscale.runtime.cli", "jax"),
])
def test_light_imports(code, absent):
  check = f"import sys; {code}; assert {absent!r} not in sys.modules, sorted(sys.modules)"
  result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-1500:]


def test_public_names():
  import attnscale
  assert callable(attnscale.attention) and callable(attnscale.attention_weights)
  assert "umup" in attnscale.scalings.names()
  assert attnscale.Scaled is scalings.Scaled
  assert attnscale.unit_scaling.UnitScaledAttention is scalings.UnitScaledAttention
  with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
    attnscale.nosuch  # noqa: B018


@pytest.mark.parametrize("name, new", [
    ("add_optimizer", "attnscale.config.builders.add_optimizer"),
    ("import_modules", "attnscale.config.imports.import_modules"),
    ("migrate", "attnscale.config.migration.migrate"),
    ("RENAMED_FIELDS", "attnscale.config.schema.RENAMED_FIELDS"),
    ("run_label", "attnscale.config.labels.run_label"),
])
def test_a_name_moved_out_of_configlib_says_where_it_went(name, new):
  from attnscale.config import builders, imports, labels, migration, schema
  from attnscale.runtime import configlib
  with pytest.raises(AttributeError, match=f"^attnscale.runtime.configlib.{name} is {new}$"):
    getattr(configlib, name)
  module, attribute = new.rsplit(".", 1)
  assert getattr({"attnscale.config.builders": builders, "attnscale.config.imports": imports,
                  "attnscale.config.labels": labels, "attnscale.config.migration": migration,
                  "attnscale.config.schema": schema}[module], attribute) is not None


def test_cases_cover_registry():
  """Every registered scaling has a test case (tests across modules run them all)."""
  assert {name for _, name, _ in SCALING_CASES} == set(scalings.names())


# Scaling names that are also other fields' values, with the field: allowed as those,
# never where a scaling is meant (compared with, or assigned to, a `scaling`).
OTHER_VALUES = {
    "none": "model.qk_norm, sink, attn_gate, fp8_scaling, config.remat",
    "standard": "model.variant",
    "umup": "model.parameterization, model.unit.residual_rule",
    "cosine": "config.lr_schedule",
    "qk_layernorm": "the old field model.qk_layernorm",
    "unit_scaled": "the old model.variant value",
}


def _scaling_names():
  """Registered scalings, presets (`scaling=unit_scaled`) and renamed ones."""
  return set(scalings.names()) | set(scalings.presets()) | set(scalings.RENAMED)


def _strings(node):
  """The string constants of `node` and of a tuple, list or set it is."""
  items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
  return [n for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _scaling_uses(tree):
  """String constants where a scaling is meant: compared with an expression naming
  `scaling`, assigned to one, passed as `scaling=`, or a prefix it is tested for."""
  def names_scaling(node):  # m.scaling, scaling, m["scaling"], m.get("scaling")
    return any(getattr(n, "id", None) == "scaling" or getattr(n, "attr", None) == "scaling"
               or getattr(n, "value", None) == "scaling" for n in ast.walk(node))
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      if any(names_scaling(s) for s in sides if not _strings(s)):
        yield from (c for s in sides for c in _strings(s))
    elif isinstance(node, ast.Assign):
      for target in node.targets:
        pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple)
                 and isinstance(node.value, ast.Tuple) else [(target, node.value)])
        yield from (c for t, v in pairs if names_scaling(t) for c in _strings(v))
    elif isinstance(node, ast.keyword) and node.arg == "scaling":
      yield from _strings(node.value)
    elif isinstance(node, ast.Dict):
      yield from (c for k, v in zip(node.keys, node.values)
                  if isinstance(k, ast.Constant) and k.value == "scaling" for c in _strings(v))
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in ("startswith", "endswith") and names_scaling(node.func.value)):
      yield from (c for a in node.args for c in _strings(a))


def _violations(source, names):
  tree = ast.parse(source)
  found = {(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)
           and n.value in names and n.value not in OTHER_VALUES}
  found |= {(n.lineno, n.value) for n in _scaling_uses(tree)}
  return sorted(found)


def test_models_and_runtime_name_no_scaling():
  """What a scaling means to a model (its muP rule, q/k normalisation, variant) is
  declared where it is registered (`scalings.register`), so attnscale/models and
  attnscale/runtime never name one: a new scaling changes neither."""
  names = _scaling_names()
  wrong = []
  for package in ("models", "runtime"):
    for folder, _, files in os.walk(os.path.join(PACKAGE, package)):
      for name in sorted(f for f in files if f.endswith(".py")):
        path = os.path.join(folder, name)
        wrong += [f"{os.path.relpath(path, ROOT)}:{line}: {value!r}"
                  for line, value in _violations(open(path).read(), names)]
  assert not wrong, "scaling names outside the registry:\n" + "\n".join(wrong)


@pytest.mark.parametrize("code", [
    "if cfg.scaling == 'cosine': pass",
    "ok = m.scaling in ('standard', 'inverse_d')",
    "m.variant, m.scaling = 'unit', 'fully_scaled'",
    "model['scaling'] = 'umup'",
    "get(scaling='none')",
    "x = {'scaling': 'standard'}",
    "if cfg.scaling.startswith('key_norm'): pass",
    "if model.get('scaling') == 'unit_scaled': pass",
    "NAMES = ('qk_rmsnorm', 'log_n')",
])
def test_the_scaling_name_check_sees(code):
  assert _violations(code, _scaling_names())


def test_the_scaling_name_check_allows_other_fields():
  code = ("if m.get('variant', 'standard') != 'standard' and cfg.qk_norm != 'none': pass\n"
          "ok = cfg.lr_schedule == 'cosine' and cfg.parameterization == 'umup'\n"
          "ok = cfg.fp8_scaling != 'none'\n"
          '"""A docstring may say cosine."""\n')
  assert not _violations(code, _scaling_names())


def _package_doc(package):
  import ast as _ast
  with open(os.path.join(PACKAGE, package, "__init__.py")) as f:
    return _ast.get_docstring(_ast.parse(f.read())) or ""


@pytest.mark.parametrize("package", [p for p in LAYERS if os.path.isdir(os.path.join(PACKAGE, p))])
def test_each_package_docstring_lists_its_modules_and_what_it_may_import(package):
  doc = _package_doc(package)
  folder = os.path.join(PACKAGE, package)
  modules = [n[:-3] for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py"]
  modules += [n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n, "__init__.py"))]
  assert not [m for m in modules if m not in doc], f"attnscale/{package}/__init__.py's docstring"
  # Its "may import" sentence names every lower layer a module of it imports.
  sentence = doc[doc.lower().rindex("may import"):].split(".\n")[0].split(". ")[0]
  imported = {_layer(i) for module, path in _modules() if _layer(module) == package
              for i in _imports(path)} - {None, package}
  words = {w.strip(".").removeprefix("attnscale.") for w in
           sentence.replace(",", " ").replace(";", " ").split()}
  named = {layer for layer in LAYERS if layer in words}
  if "every package below it" in sentence or "every lower layer" in sentence:
    named = set(LAYERS[:LAYERS.index(package)])
  assert imported <= named, (package, sorted(imported - named))
