"""notebooks/compare_scalings.ipynb runs end to end at a tiny size: a scaling
registered in a cell, it and standard trained through the library (test preset,
10 steps), their curves and per-layer diagnostics plotted. (scale_studies.ipynb:
tests/test_studies.py.) Needs $ATTNSCALE_DATA (CI sets it)."""

import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "compare_scalings.ipynb")


def test_compare_scalings_notebook_executes(tmp_path, tfds_dir, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), (
      "store the notebook without outputs")
  runs = tmp_path / "runs"
  monkeypatch.setenv("ATTNSCALE_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("ATTNSCALE_RUNS", str(runs))
  monkeypatch.setenv("ATTNSCALE_TFDS_DIR", tfds_dir)  # prepared once for the session
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # The kernel runs in tmp_path: import this checkout's attnscale and configs.
  monkeypatch.setenv("PYTHONPATH",
                     os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()
  images = [out for cell in nb.cells if cell.cell_type == "code"
            for out in cell.outputs if "image/png" in out.get("data", {})]
  assert len(images) == 2  # the loss curves, the per-layer diagnostics
  # Both runs trained in-process to the end and were evaluated, as eval.py would.
  assert sorted(os.listdir(runs)) == ["key_norm_sqrt", "standard"]
  for name in ("key_norm_sqrt", "standard"):
    with open(runs / name / "config.json") as f:
      assert json.load(f)["model"]["scaling"] == name
    with open(runs / name / "eval.json") as f:
      result = json.load(f)
    assert result["step"] == 10 and result["scaling"] == name
    assert len(result["attention"]) == 2  # the test preset's layers
  outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
  text = "".join(out.get("text", "") for out in outputs)
  assert "standard       std(z)" in text and "key_norm_sqrt  std(z)" in text
  tables = "".join(out.get("data", {}).get("text/markdown", "") for out in outputs)
  assert "| standard | standard | 10 | 1 |" in tables
  assert "| key_norm_sqrt | key_norm_sqrt | 10 | 1 |" in tables
