"""A study is its sweep entry, its module and its page: the extending guide says so,
and this checks the claim against the repository (docs/guides/extending.md, "A study")."""

import glob
import os
import re

import pytest

from attnscale.experiments import sweeps
from attnscale.studies import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(glob.glob(os.path.join(ROOT, "docs/experiments/*.md")))
DOCS = PAGES + sorted(glob.glob(os.path.join(ROOT, "docs/guides/*.md"))) + [
    os.path.join(ROOT, "README.md")]
# A sweep command: sweep.py ... --config=configs/X.py ... --sweep=NAME (either order).
CONFIG_RE = re.compile(r"--config[= ](configs/\w+\.py)")
SWEEP_RE = re.compile(r"--sweep[= ](\w+)")


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def _sweep_commands(text: str) -> list[tuple[str, str]]:
  """(config file, sweep name) of every `sweep.py` command line in `text`, with
  backslash-continued lines joined."""
  out = []
  for line in text.replace("\\\n", " ").splitlines():
    if "sweep.py" not in line:
      continue
    config, sweep = CONFIG_RE.search(line), SWEEP_RE.search(line)
    if config and sweep:
      out.append((config.group(1), sweep.group(1)))
  return out


def _study_section() -> str:
  text = _read(os.path.join(ROOT, "docs/guides/extending.md"))
  return text.split("## A study\n", 1)[1].split("\n## ", 1)[0]


def test_every_file_the_guide_lists_for_a_study_exists():
  """Each path the list names (`configs/<config>_sweeps.py`, with <...> any name)
  matches a file; the list names the sweep, the module, the registry and the page."""
  listed = _study_section().split("\n\n")[1]
  paths = set(re.findall(r"`([\w/<>.]+\.(?:py|md))`", listed))
  assert {"configs/<config>_sweeps.py", "attnscale/studies/<study>.py",
          "attnscale/studies/registry.py", "docs/experiments/<study>.md"} <= paths
  for path in paths:
    pattern = re.sub(r"<\w+>", "*", path)
    assert glob.glob(os.path.join(ROOT, pattern)), f"extending.md lists {path}: no such file"
  assert os.path.isfile(os.path.join(ROOT, "tests/test_study_layout.py"))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_sweep_a_page_runs_exists(path):
  for config, sweep in _sweep_commands(_read(path)):
    assert os.path.isfile(os.path.join(ROOT, config)), f"{path}: no {config}"
    assert sweep in sweeps.sweep_names(os.path.join(ROOT, config)), (
        f"{os.path.relpath(path, ROOT)} runs --sweep={sweep}, which "
        f"{config.removesuffix('.py')}_sweeps.py does not define")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_sweeps_file_a_page_names_exists(path):
  for name in re.findall(r"configs/[a-z]\w*_sweeps\.py", _read(path)):  # not X_sweeps.py
    assert os.path.isfile(os.path.join(ROOT, name)), f"{path} names {name}: no such file"


STUDY_PAGES = [name for name in registry.REGISTRY
               if os.path.isfile(os.path.join(ROOT, f"docs/experiments/{name}.md"))]


def test_the_sweep_studies_have_pages():
  assert {"bert", "length", "precision", "sensitivity", "shared_kv", "transfer",
          "width"} <= set(STUDY_PAGES)


@pytest.mark.parametrize("name", STUDY_PAGES)
def test_a_study_page_names_its_sweep_its_command_and_its_module(name):
  text = _read(os.path.join(ROOT, f"docs/experiments/{name}.md"))
  assert f"python -m attnscale.studies {name}" in text, f"{name}.md: no study command"
  assert _sweep_commands(text), f"{name}.md: no sweep.py --config=... --sweep=... command"
  module = registry.REGISTRY[name].split(":")[0]
  assert module == f"attnscale.studies.{name}", f"{name}: its module is {module}"
  assert os.path.isfile(os.path.join(ROOT, module.replace(".", "/") + ".py"))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_study_a_page_runs_is_registered(path):
  for name in re.findall(r"python -m attnscale\.studies (\w+)", _read(path)):
    assert name == "all" or name in registry.REGISTRY, f"{path}: no study {name!r}"
