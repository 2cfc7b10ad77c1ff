"""The sensitivity study's analysis (attnscale/studies/sensitivity.py) on synthetic
sweeps (run directories as train.py leaves them, no training)."""

import argparse
import math
import os

import pytest

from attnscale.studies import sensitivity
from attnscale.testing import fake_run

INIT = math.log(65)


def test_wortsman_sensitivity():
  # Mean of min(L, L0) minus the best; NaN (diverged) and above-init count as L0.
  assert sensitivity.sensitivity([1.5, 2.0, math.nan, 9.0], INIT) == pytest.approx(
      (1.5 + 2.0 + INIT + INIT) / 4 - 1.5)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
  """standard diverges above 2^-6 and its logits grow with the rate; qk_clip stays
  finite and its logits stop at 50."""
  root = str(tmp_path_factory.mktemp("sens"))
  for e in range(11, 1, -1):
    for seed in (0, 1):
      for label, overrides in (("standard", {}), ("clip", {"qk_clip": 50.0})):
        clipped = label == "clip"
        loss = 1.8 + 0.05 * (e - 9)**2 + 0.01 * seed
        if not clipped and e < 6:
          loss = math.nan
        peak = 10.0 * 2**(9 - e)
        records = [{"step": s, "train/loss": loss, "train/loss_last20": loss,
                    "train/attn/max_logit/layer_0": min(peak * s / 100, 50 if clipped else 1e9),
                    "train/attn/max_logit/layer_1": 1.0}
                   for s in (20, 40, 60, 80, 100)]
        overrides = {**overrides, "learning_rate": 2.0**-e}
        fake_run(root, f"{label}-{e}-{seed}", f"preset=test,seed={seed}", overrides, records,
                 done=math.isfinite(loss))
  return root


def test_summary_and_logits(sweep_dir):
  rows = sensitivity.read_rows(sweep_dir)
  assert {r["label"] for r in rows} == {"standard", "standard+qk_clip50"}
  summary = {r["label"]: r for r in sensitivity.summary_rows(rows)}
  clip, std = summary["standard+qk_clip50"], summary["standard"]
  assert clip["sensitivity"] < std["sensitivity"]
  # S per seed differs by a constant offset only through the L0 cap: a paired interval
  # of the clip's S minus standard's lies below 0.
  assert std["vs_standard"] == "baseline" and clip["vs_standard"].endswith(": better")
  assert clip["S_lo"] <= clip["sensitivity"] <= clip["S_hi"]
  assert std["best_lr"] == clip["best_lr"] == 2.0**-9
  assert std["diverged_runs"] == 2 * 4 and clip["diverged_runs"] == 0
  assert clip["max_logit_any_run"] == 50.0 and std["max_logit_any_run"] > 50
  assert std["largest_trained_lr"] == 2.0**-7  # within 0.2 nats: |e - 9| <= 2
  last = {(r["label"], r["learning_rate"]): r for r in sensitivity.logit_rows(rows)}
  assert last["standard", 2.0**-9]["max_logit_last"] == pytest.approx(10.0)
  by_rate = {r["label"]: r for r in sensitivity.by_rate_rows(rows)}
  # 1.80 and 1.81: the 95% t half-width with 2 seeds, 12.71 x 0.00707 / sqrt(2) = 0.064
  assert by_rate["standard"]["2^-9"] in ("1.80 +-0.06", "1.81 +-0.06")
  assert by_rate["standard"]["2^-2"] == "div"
  assert by_rate["standard+qk_clip50"]["S"].startswith(f"{clip['sensitivity']:.2f} +-")


def test_cli_writes_tables_and_figures(sweep_dir, tmp_path):
  paths, _ = sensitivity.run_cli(argparse.Namespace(workdirs=[sweep_dir], out=str(tmp_path)))
  assert {os.path.basename(p) for p in paths} == {
      "sensitivity.csv", "sensitivity.md", "sensitivity_logits.csv", "sensitivity_logits.md",
      "sensitivity_by_rate.csv", "sensitivity_by_rate.md", "sensitivity_loss.png",
      "sensitivity_logits.png", "runs.csv"}
