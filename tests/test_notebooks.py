"""notebooks/compare_scalings.ipynb runs end to end at a tiny size: a scaling
registered in a cell, it and standard trained through the library (test preset,
10 steps), their curves and per-layer diagnostics plotted. (scale_studies.ipynb:
tests/test_studies.py.) Needs $ATTNSCALE_DATA (CI sets it)."""

import json
import os

import pytest

from attnscale import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "compare_scalings.ipynb")


@pytest.mark.slow
def test_compare_scalings_notebook_executes(tmp_path, tfds_dir):
  runs = tmp_path / "runs"
  nb = testing.execute_notebook(NOTEBOOK, tmp_path, timeout_s=120, ATTNSCALE_RUNS=str(runs),
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
