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
LAYERS = ["checks", "core", "numerics", "models", "data", "tasks", "runtime", "evaluation",
          "experiments", "studies", "commands", "testing"]


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


def test_cases_cover_registry():
  """Every registered scaling has a test case (tests across modules run them all)."""
  assert {name for _, name, _ in SCALING_CASES} == set(scalings.names())
