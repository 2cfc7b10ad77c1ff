"""The notebooks: committed with the outputs of a full-size run (a reader on the web
sees the results), and executed here at a tiny size the way the README opens them
(the kernel in notebooks/, $ATTNSCALE_DATA as the quick start exports it; CI
exports it the same way).

compare_scalings.ipynb runs end to end: a scaling registered in a cell, it and
standard trained through the library (test preset, 10 steps), their curves and
per-layer diagnostics plotted. (scale_studies.ipynb: tests/test_studies.py.)"""

import json
import os
import re
import sys

import pytest

from attnscale import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "compare_scalings.ipynb")
NOTEBOOKS = sorted(os.path.join(ROOT, "notebooks", name)
                   for name in os.listdir(os.path.join(ROOT, "notebooks"))
                   if name.endswith(".ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_committed_with_the_outputs_of_one_clean_run(path):
  """Every code cell ran, once, in order, without an error, and nothing in the
  outputs names this machine (a temporary folder, a home directory) or a time."""
  with open(path, encoding="utf-8") as f:
    nb = json.load(f)
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
  assert [c["execution_count"] for c in cells] == list(range(1, len(cells) + 1)), (
      "store it with testing.store_notebook_outputs (docs/development.md, Notebooks)")
  outputs = [out for c in cells for out in c["outputs"]]
  assert outputs and not [out for out in outputs if out["output_type"] == "error"]
  assert not [c for c in cells if "execution" in c.get("metadata", {})], "timing metadata"
  text = json.dumps(outputs)
  for machine_specific in ("/tmp/", "/home/", "/root/", "/work/", "compare_scalings_"):
    assert machine_specific not in text, machine_specific


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_saved_with_the_attnscale_kernel_and_where_its_outputs_were_made(path):
  """Jupyter opens them in the "Python (attnscale)" kernel (`python -m
  attnscale.runtime.hostmem install-kernel`), and the first cell's output says the
  machine, JAX and the commit that made the stored outputs."""
  with open(path, encoding="utf-8") as f:
    nb = json.load(f)
  assert nb["metadata"]["kernelspec"] == {"display_name": "Python (attnscale)",
                                          "language": "python", "name": "attnscale"}
  first = next(c for c in nb["cells"] if c["cell_type"] == "code")
  text = "".join(t for out in first["outputs"] for t in out.get("text", []))
  assert re.search(r"made on \d+ cores of .+ \| JAX \d+\.\d+\.\d+, Python 3\.\d+\.\d+ \| "
                   r"attnscale [0-9a-f]{12}\n", text), text


def test_the_kernel_falls_back_to_python3_where_attnscale_s_is_not_installed(
    tmp_path, monkeypatch):
  """testing.notebook_kernel: the notebook's own kernel when it runs this Python,
  python3 when it is missing or belongs to another environment."""
  nbformat = pytest.importorskip("nbformat")
  pytest.importorskip("jupyter_client")
  with open(NOTEBOOK, encoding="utf-8") as f:
    nb = nbformat.read(f, as_version=4)
  kernels = tmp_path / "kernels" / "attnscale"
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
  monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "none"))
  monkeypatch.setattr(sys, "prefix", str(tmp_path / "no-prefix"))
  assert testing.notebook_kernel(nb) == "python3"  # not installed
  kernels.mkdir(parents=True)
  for python, expected in (("/usr/bin/another-python", "python3"), (sys.executable, "attnscale")):
    (kernels / "kernel.json").write_text(json.dumps(
        {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
         "display_name": "Python (attnscale)", "language": "python"}))
    assert testing.notebook_kernel(nb) == expected, python


@pytest.mark.slow
def test_compare_scalings_notebook_executes(tmp_path, tfds_dir):
  runs = tmp_path / "runs"
  nb = testing.execute_notebook(NOTEBOOK, timeout_s=120, ATTNSCALE_RUNS=str(runs),
                                ATTNSCALE_TFDS_DIR=tfds_dir)  # prepared once for the session
  assert len(testing.notebook_outputs(nb, "image/png")) == 2  # the curves, the diagnostics
  # Both runs trained in-process to the end and were evaluated, as eval.py would.
  assert sorted(os.listdir(runs)) == ["key_norm_sqrt", "standard"]
  for name in ("key_norm_sqrt", "standard"):
    with open(runs / name / "config.json") as f:
      assert json.load(f)["model"]["scaling"] == name
    with open(runs / name / "eval.json") as f:
      result = json.load(f)
    assert result["step"] == 10 and result["scaling"] == name
    assert len(result["attention"]) == 2  # the test preset's layers
  text = "".join(testing.notebook_outputs(nb, "text"))
  assert "standard       std(z)" in text and "key_norm_sqrt  std(z)" in text
  tables = "".join(testing.notebook_outputs(nb, "text/markdown"))
  assert "| standard | standard | 10 | 1 |" in tables
  assert "| key_norm_sqrt | key_norm_sqrt | 10 | 1 |" in tables
