"""The width study's analysis (attnscale/studies/width.py) on synthetic sweeps: run
directories as train.py leaves them (config.json, metrics.jsonl, a checkpoint
directory), losses from a known optimum, no training."""

import argparse
import math
import os

import pytest

from attnscale.studies import transfer, width
from attnscale.testing import fake_run


def _run(root, name, arg, overrides, loss):
  fake_run(root, name, arg, overrides,
           [{"step": 20, "train/loss": loss, "train/loss_last20": loss}])


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
  """sp's best rate halves per doubling of width (2^-(8 + log2(w/32))); the unit-scaled
  model's stays at 2^-5. Loss = 1 + 0.05 (e - e*)^2 + 0.01 seed; 2^-3 diverges for sp."""
  root = str(tmp_path_factory.mktemp("width"))
  for w in (32, 64, 128):
    for label, arg, best in (("sp", "scaling=standard", 8 + math.log2(w / 32)),
                             ("unit", "scaling=unit_scaled", 5.0), ("mup", "", 8.0)):
      for e in range(3, 12):
        for seed in (0, 1) if e == round(best) else (0,):
          loss = math.nan if (label == "sp" and e == 3) else 1 + 0.05 * (e - best)**2 + 0.01 * seed
          mup = {"model.parameterization": "mup"} if label == "mup" else {}
          _run(root, f"{label}-{w}-{e}-{seed}", f"preset=test,{arg},seed={seed}".replace(",,", ","),
               {"model.width": w, "learning_rate": 2.0**-e, **mup}, loss)
  return root


def test_best_rates_slopes_and_transfer(sweep_dir):
  """The transfer study's statistics over the width axis: the best on the seed means,
  the loss interval at it, the transfer loss, and the bootstrap slope."""
  rows = width.read_rows(sweep_dir)
  assert {r["label"] for r in rows} == {"sp/standard", "unit_scaled", "mup"}
  table = width.table_rows(rows)
  sp = {r["width"]: r for r in table if r["label"] == "sp/standard"}
  assert [sp[w]["best_log2_lr"] for w in (32, 64, 128)] == [-8, -9, -10]
  assert sp[64]["interp_log2_lr"] == pytest.approx(-9)
  assert sp[64]["seeds"] == 2 and sp[64]["loss"] == pytest.approx(1.005)
  # At width 128 the smallest width's best (2^-8) is two steps off: 0.05 * 4, seed 0.
  assert sp[128]["transfer_loss"] == pytest.approx(0.2)
  assert sp[128]["transfer_basis"] == "seed 0"
  fits = width.slopes(rows)
  slopes = {s["label"]: s for s in transfer.slope_rows(table, fits)}
  assert slopes["sp/standard"]["slope"] == pytest.approx(-1.0)
  assert slopes["sp/standard"]["reading"] == "falls as 1/width"
  assert slopes["unit_scaled"]["slope"] == pytest.approx(0.0, abs=1e-9)
  assert slopes["mup"]["slope"] == pytest.approx(0.0, abs=1e-9)
  assert slopes["unit_scaled"]["worst_transfer_loss"] == pytest.approx(0.0)


def test_cli_writes_tables_and_figures(sweep_dir, tmp_path):
  paths, _ = width.run_cli(argparse.Namespace(workdirs=[sweep_dir], out=str(tmp_path)))
  names = {os.path.basename(p) for p in paths}
  assert names == {"width.csv", "width.md", "width_slopes.csv", "width_slopes.md",
                   "width_lr.png", "width_best.png", "width_transfer.png", "runs.csv"}
  assert "| sp/standard | 3 | -1.00 |" in open(tmp_path / "width_slopes.md").read()
  assert "falls as 1/width" in open(tmp_path / "width_slopes.md").read()


def test_depth_study_reads_num_layers(tmp_path_factory, tmp_path):
  """The depth variant: the same analysis over model.num_layers. sp's best rate
  halves per doubling of depth, CompleteP's (depth_alpha 1) stays at 2^-7."""
  root = str(tmp_path_factory.mktemp("depth"))
  for n in (1, 2, 4):
    for label, alpha, best in (("sp", 0.0, 7 + math.log2(n)), ("cp", 1.0, 7.0)):
      for e in range(4, 11):
        loss = 1 + 0.05 * (e - best)**2
        _run(root, f"{label}-{n}-{e}", "preset=test,seed=0",
             {"model.num_layers": n, "model.depth_alpha": alpha, "learning_rate": 2.0**-e},
             loss)
  rows = width.read_rows(root, "depth")
  assert {r["label"] for r in rows} == {"sp/standard", "sp/standard+depth_alpha1"}
  table = width.table_rows(rows, "depth")
  assert {r["depth"] for r in table} == {1, 2, 4}
  slopes = {s["label"]: s for s in transfer.slope_rows(table, width.slopes(rows, "depth"),
                                                      "depth")}
  assert slopes["sp/standard"]["slope"] == pytest.approx(-1.0)
  assert slopes["sp/standard"]["reading"] == "falls as 1/depth"
  assert slopes["sp/standard+depth_alpha1"]["slope"] == pytest.approx(0.0, abs=1e-9)
  assert slopes["sp/standard"]["depths"] == 3
  paths, _ = width.run_depth_cli(argparse.Namespace(workdirs=[root], out=str(tmp_path)))
  assert {os.path.basename(p) for p in paths} == {
      "depth.csv", "depth.md", "depth_slopes.csv", "depth_slopes.md", "depth_lr.png",
      "depth_best.png", "depth_transfer.png", "runs.csv"}
