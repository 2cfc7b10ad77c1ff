"""The width study's analysis (attnscale/studies/width.py) on synthetic sweeps: run
directories as train.py leaves them (config.json, metrics.jsonl, a checkpoint
directory), losses from a known optimum, no training."""

import argparse
import math
import os

import pytest

from attnscale.studies import width
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
  rows = width.read_rows(sweep_dir)
  assert {r["label"] for r in rows} == {"sp/standard", "unit_scaled", "mup"}
  table = width.table_rows(rows)
  sp = {r["width"]: r for r in table if r["label"] == "sp/standard"}
  assert [sp[w]["best_log2_lr"] for w in (32, 64, 128)] == [-8, -9, -10]
  assert sp[64]["interp_log2_lr"] == pytest.approx(-9)
  assert sp[64]["seeds"] == 2 and sp[64]["half_range"] == pytest.approx(0.005)
  # Within 0.02 nats: |e - e*| <= sqrt(0.4) = 0.632 grid steps either side (linear).
  assert sp[64]["band_hi"] - sp[64]["band_lo"] == pytest.approx(2 * 0.4, abs=1e-9)
  # At width 128 the smallest width's best (2^-8) is two steps off: 0.05 * 4.
  assert sp[128]["transfer_gap"] == pytest.approx(0.2)
  slopes = {s["label"]: s for s in width.slope_rows(table)}
  assert slopes["sp/standard"]["slope"] == pytest.approx(-1.0)
  assert slopes["unit_scaled"]["slope"] == pytest.approx(0.0, abs=1e-9)
  assert slopes["mup"]["slope"] == pytest.approx(0.0, abs=1e-9)
  assert slopes["unit_scaled"]["worst_transfer_gap"] == pytest.approx(0.0)


def test_interpolation_and_band_edges():
  assert width.interpolated_best({-9: 1.1, -8: 1.0, -7: 1.05})[1] == pytest.approx(
      -8 + 0.5 * (1.1 - 1.05) / (1.1 - 2 + 1.05))
  assert width.interpolated_best({-9: math.nan})[0] != width.interpolated_best({-9: math.nan})[0]
  assert width.band({-9: 1.0, -8: math.nan}) == (-9, -9)  # a diverged neighbour: no extension


def test_cli_writes_tables_and_figures(sweep_dir, tmp_path):
  paths, _ = width.run_cli(argparse.Namespace(workdirs=[sweep_dir], out=str(tmp_path)))
  names = {os.path.basename(p) for p in paths}
  assert names == {"width.csv", "width.md", "width_slopes.csv", "width_slopes.md",
                   "width_lr.png", "width_best.png", "width_transfer.png", "runs.csv"}
  assert "| sp/standard | 3 | -1.00 |" in open(tmp_path / "width_slopes.md").read()


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
  slopes = {s["label"]: s for s in width.slope_rows(width.table_rows(rows, "depth"), "depth")}
  assert slopes["sp/standard"]["slope"] == pytest.approx(-1.0)
  assert slopes["sp/standard+depth_alpha1"]["slope"] == pytest.approx(0.0, abs=1e-9)
  assert slopes["sp/standard"]["depths"] == 3
  paths, _ = width.run_depth_cli(argparse.Namespace(workdirs=[root], out=str(tmp_path)))
  assert {os.path.basename(p) for p in paths} == {
      "depth.csv", "depth.md", "depth_slopes.csv", "depth_slopes.md", "depth_lr.png",
      "depth_best.png", "depth_transfer.png", "runs.csv"}
