"""The transfer study (attnscale/studies/transfer.py) on a synthetic sweep with known
answers: run directories as train.py leaves them (config.json, metrics.jsonl with the
attention logits, a checkpoint directory, provenance.json), no training.

The sweep, at widths 32 ... 256, laid out as the study protocol leaves it (seed 0 at
each searched rate, seeds 1 and 2 at the three band rates e* - 1, e*, e* + 1, and the
smallest width's best rate at every width, seed 0):

  mup_adam_standard  e* = 9 at every width (the rate transfers); 2^-7 diverges (seed 0)
  sp_adam_standard   e* = 8 + log2(w / 32): the best halves per doubling (slope -1)

Loss = 2 - 0.1 log2(w / 32) + 0.015 (e - e*)^2 + noise; the noise is 0 on seed 0 and
+-0.004 (alternating with e) on seeds 1 and 2, so every seed mean is the noiseless
curve and the bests are exact, while seeds still spread for the intervals.
"""

import argparse
import csv
import json
import math
import os
import shutil

import numpy as np
import pytest

from attnscale.experiments import stats
from attnscale.studies import __main__ as studies_main
from attnscale.studies import transfer, transfer_runs, transfer_sensitivity, transfer_summary
from attnscale.testing import fake_run
from configs import shakespeare_char
from configs import shakespeare_char_sweeps as sweep_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTHS = (32, 64, 128, 256)
STEPS = shakespeare_char.get_config("preset=test").num_train_steps
L0 = math.log(65)  # the test preset's vocabulary
A = 0.004  # seeds 1 and 2's noise
MUP = {"model.parameterization": "mup"}


def _best(label, w):
  return 9 if label == "mup_adam_standard" else 8 + round(math.log2(w / 32))


def _loss(label, w, e, seed):
  if label == "mup_adam_standard" and e == 7:
    return math.nan
  noise = (0.0, A, -A)[seed] * (-1) ** e
  return 2.0 - 0.1 * math.log2(w / 32) + 0.015 * (e - _best(label, w)) ** 2 + noise


def _points(label, w):
  """(exponent, seed) of every run of one label and width."""
  e = _best(label, w)
  searched = {e - 2, e - 1, e, e + 1} if label == "mup_adam_standard" else {e - 1, e, e + 1}
  points = {(x, 0) for x in searched} | {(x, s) for x in (e - 1, e, e + 1) for s in (1, 2)}
  return points | {(_best(label, 32), 0)}


def _logit(e):
  return 2.0 ** (12 - e)  # the largest logit at the end of a run at 2^-e


def _sweep(root, commit_of=lambda name: "a" * 40):
  for label, overrides in (("mup_adam_standard", MUP), ("sp_adam_standard", {})):
    for w in WIDTHS:
      for e, seed in sorted(_points(label, w)):
        loss, name = _loss(label, w, e, seed), f"{label}-{w}-{e}-{seed}"
        m = _logit(e)
        records = [{"step": 10, "train/loss": 3.0, "train/loss_last20": 3.0,
                    "train/elapsed_s": 1.0, "train/attn/max_logit/layer_0": 2 * m,
                    "train/attn/max_logit/layer_1": 1.0},
                   {"step": STEPS, "train/loss": loss, "train/loss_last20": loss,
                    "train/elapsed_s": 2.0, "train/attn/max_logit/layer_0": m / 2,
                    "train/attn/max_logit/layer_1": m}]
        run = fake_run(root, name, f"preset=test,scaling=standard,seed={seed}",
                       {"model.width": w, "learning_rate": 2.0**-e, **overrides}, records,
                       done=math.isfinite(loss))
        with open(os.path.join(run, "provenance.json"), "w") as f:
          json.dump([{"commit": commit_of(name), "dirty": False}], f)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("transfer")
  _sweep(root)
  return str(root)


@pytest.fixture(scope="module")
def rows(sweep_dir):
  return transfer_runs.read_rows(sweep_dir)


@pytest.fixture(scope="module")
def fits(rows):
  return transfer.slopes(rows)


def test_every_sweep_label_maps_back_from_its_config():
  for label, (scaling, overrides) in sweep_configs.TRANSFER_LABELS.items():
    config = shakespeare_char.get_config(f"preset=graphcore_cpu,scaling={scaling},seed=1")
    config.update_from_flattened_dict(overrides | {"model.width": 128})
    assert transfer_runs.transfer_label(config.to_dict()) == label
  assert set(transfer_runs.LABELS) == set(sweep_configs.TRANSFER_LABELS)
  for label, (scaling, overrides) in sweep_configs.MUP_MULT_LABELS.items():  # mup_mults
    config = shakespeare_char.get_config(f"preset=graphcore_cpu,scaling={scaling},seed=0")
    config.update_from_flattened_dict(overrides | {"model.width": 32})
    assert transfer_runs.transfer_label(config.to_dict()) == label
  for point in sweep_configs.SWEEPS["mup_vector_lr_256"].points("unused"):  # the ablation
    config = shakespeare_char.get_config(point["arg"])
    config.update_from_flattened_dict(point["overrides"])
    assert transfer_runs.transfer_label(config.to_dict()) == sweep_configs.MUP_VECTOR_LABEL
  for width in (32, 256):  # muon_adam_width: the AdamW branch's rate as 64 / width
    config = shakespeare_char.get_config("preset=graphcore_cpu,scaling=standard")
    config.update_from_flattened_dict({"optimizer": "muon", "model.width": width,
                                       "muon_adam_lr_base_width": 64})
    assert transfer_runs.transfer_label(config.to_dict()) == sweep_configs.MUON_ADAM_LABEL
  config.update_from_flattened_dict({"muon_adam_lr_mult": 0.5, "qk_clip": 50.0})
  assert transfer_runs.transfer_label(config.to_dict()) == "sp_muon_qk_clip_adam_lr0.5_adam_per_width64"
  # Anything else that changes attention keeps its run_label; another tau says so.
  config = shakespeare_char.get_config("preset=test,scaling=standard")
  config.update_from_flattened_dict({"model.logit_softcap": 50.0})
  assert transfer_runs.transfer_label(config.to_dict()) == "standard+softcap50"
  config = shakespeare_char.get_config("preset=test,scaling=cosine")
  config.update_from_flattened_dict({"qk_clip": 100.0, "optimizer": "muon"})
  assert transfer_runs.transfer_label(config.to_dict()) == "sp_muon_cosine_qk_clip100"


@pytest.mark.parametrize("study", ["transfer", "mup_mults"])
def test_every_committed_run_declares_its_label_and_the_study_reads_it(study, tmp_path):
  """The committed runs carry the label their sweep declared (config.label; backfilled
  by `results_store label` for runs made before), each the one `transfer_label`
  derives; a run's declared label is the one the study groups it by."""
  import pandas as pd

  from attnscale.config import migration
  from attnscale.experiments import results_store
  store = os.path.join(ROOT, "docs", "results", study, "runs.parquet")
  if not os.path.exists(store):
    pytest.skip(f"no {store} in this checkout")
  configs = [json.loads(c) for c in pd.read_parquet(store, columns=["config.json"])["config.json"]]
  assert all(c.get("label") for c in configs)
  assert all(c["label"] == transfer_runs.transfer_label(migration.migrate(c)) for c in configs)
  first = results_store.runs_frame(store)["run"].iloc[0]
  run = results_store.unpack(store, str(tmp_path), only=f"^{first}$")[0]
  config_path = os.path.join(run, "config.json")
  with open(config_path) as f:
    config = json.load(f)
  with open(config_path, "w") as f:
    json.dump(config | {"label": "declared"}, f)
  assert [r["label"] for r in transfer_runs.read_rows(str(tmp_path))] == ["declared"]


def test_best_rates_bands_and_transfer_losses(rows, fits):
  assert transfer_runs.labels_of(rows) == ["sp_adam_standard", "mup_adam_standard"]
  table = {(r["label"], r["width"]): r for r in transfer.table_rows(rows, fits)}
  for (label, w), r in table.items():
    e = _best(label, w)
    assert (r["best_log2_lr"], r["interp_log2_lr"]) == (-e, pytest.approx(-e)), (label, w)
    assert r["interp_lo"] <= -e <= r["interp_hi"]
    # Neighbours 0.015 worse, their paired differences within noise: all three in the band.
    assert r["band"] == " ".join(f"2^-{x}" for x in (e + 1, e, e - 1)) and r["band_short"] == 0
    at_best = [_loss(label, w, e, s) for s in (0, 1, 2)]
    ci = stats.mean_interval(at_best)
    assert r["seeds"] == 3 and (r["loss"], r["loss_lo"], r["loss_hi"]) == pytest.approx(
        (ci.mean, ci.lo, ci.hi))
    assert r["max_logit"] == _logit(e)  # the last row's max over layers, mean over seeds
  assert table["mup_adam_standard", 256]["transfer_basis"] == "same rate"
  assert table["sp_adam_standard", 32]["transfer_basis"] == "the reference"
  # At 64 the reference 2^-8 is a band rate: paired over 3 seeds, exactly 0.015.
  sp64 = table["sp_adam_standard", 64]
  assert sp64["transfer_basis"] == "paired n=3"
  assert sp64["transfer_loss"] == pytest.approx(0.015) and sp64["transfer_lo"] < 0.015
  # Further out only seed 0 ran it: 0.015 (e - e*)^2, no interval.
  for w, k in ((128, 2), (256, 3)):
    r = table["sp_adam_standard", w]
    assert r["transfer_basis"] == "seed 0" and math.isnan(r["transfer_lo"])
    assert r["transfer_loss"] == pytest.approx(0.015 * k**2)


def test_slopes_say_which_rate_transfers(rows, fits):
  table = transfer.table_rows(rows, fits)
  by_label = {r["label"]: r for r in transfer.slope_rows(table, fits)}
  mup, sp = by_label["mup_adam_standard"], by_label["sp_adam_standard"]
  assert mup["slope"] == pytest.approx(0.0, abs=1e-9) and sp["slope"] == pytest.approx(-1.0)
  assert (mup["covers_0"], mup["covers_minus_1"], mup["reading"]) == ("yes", "no", "transfers")
  assert (sp["covers_0"], sp["covers_minus_1"], sp["reading"]) == (
      "no", "yes", "falls as 1/width")
  assert sp["worst_transfer_loss"] == pytest.approx(0.135) and mup["worst_transfer_loss"] == 0


def test_sensitivity_is_over_two_octaves_each_side_of_the_best(rows):
  """Seed 0 runs further below muP's best at 32 (2^-11, 2^-12, contiguous with the
  search's 2^-7 ... 2^-10): 2^-11 is in S's window of two octaves, 2^-12 is left out."""
  base = next(r for r in rows if r["label"] == "mup_adam_standard" and r["width"] == 32
              and r["seed"] == 0 and r["learning_rate"] == 2.0**-9)
  more = [dict(base, learning_rate=2.0**-e, final_train_loss=_loss("mup_adam_standard", 32, e, 0))
          for e in (11, 12)]
  r = next(r for r in transfer_sensitivity.sensitivity_rows(list(rows) + more)
           if (r["label"], r["width"]) == ("mup_adam_standard", 32))
  assert (r["rates"], r["left_out"], r["rate_range"]) == (5, 1, "2^-11 ... 2^-7")
  # 2^-7 diverged (L0); 2^-8 ... 2^-11 at 2 + 0.015 (1, 0, 1, 4).
  assert r["S"] == pytest.approx((L0 + 4 * 2.0 + 0.015 * (1 + 0 + 1 + 4)) / 5 - 2.0)


def test_sensitivity_by_hand(rows):
  sens = {(r["label"], r["width"]): r for r in transfer_sensitivity.sensitivity_rows(rows)}
  # sp at 32: every seed ran 2^-7, 2^-8, 2^-9, so S per seed, mean and t over 3 seeds.
  s_by_seed = [0.01, (2.011 + 2.004 + 2.011) / 3 - 2.004, (2.019 + 1.996 + 2.019) / 3 - 1.996]
  ci = stats.mean_interval(s_by_seed)
  r = sens["sp_adam_standard", 32]
  assert (r["S"], r["S_lo"], r["S_hi"]) == pytest.approx((ci.mean, ci.lo, ci.hi))
  assert (r["seeds"], r["basis"], r["rates"], r["left_out"]) == (3, "3 seeds", 3, 0)
  # sp at 256: the transfer run (2^-8) is two octaves off the search's 2^-10 ... 2^-12.
  r = sens["sp_adam_standard", 256]
  assert (r["rates"], r["left_out"], r["rate_range"]) == (3, 1, "2^-12 ... 2^-10")
  # mup: seed 0 alone ran the diverged 2^-7 (it counts as L0): seed 0 only.
  for w in WIDTHS:
    r = sens["mup_adam_standard", w]
    lw = 2.0 - 0.1 * math.log2(w / 32)
    assert r["S"] == pytest.approx((L0 + 3 * lw + 0.03) / 4 - lw)
    assert r["basis"].startswith("seed 0") and r["diverged"] == 1 and math.isnan(r["S_lo"])
  # sp at 128: the transfer run (2^-8) adjoins the search's 2^-9 ... 2^-11, so it stays,
  # and seeds 1 and 2 did not run it: seed 0, 0.015 (4 + 1 + 0 + 1) / 4.
  r = sens["sp_adam_standard", 128]
  assert (r["rates"], r["left_out"], r["seeds"]) == (4, 0, 1)
  assert r["S"] == pytest.approx(0.0225)
  # So mup's S grows by 0.1 / 4 per doubling, exactly; sp's 0.01, 0.01, 0.0225, 0.01 is
  # flat within its scatter (slope 0.00125, t with 2 degrees of freedom).
  slopes = {r["label"]: r for r in transfer_sensitivity.sensitivity_slope_rows(list(sens.values()))}
  assert slopes["mup_adam_standard"]["slope"] == pytest.approx(0.025)
  assert slopes["mup_adam_standard"]["reading"] == "grows with width"
  sp = slopes["sp_adam_standard"]
  assert sp["slope"] == pytest.approx(0.00125) and sp["reading"] == "flat within noise"
  x, y = [0, 1, 2, 3], [0.01, 0.01, 0.0225, 0.01]
  resid = [yi - (0.013125 + 0.00125 * (xi - 1.5)) for xi, yi in zip(x, y)]
  half = stats.t_multiplier(2) * math.sqrt(sum(e * e for e in resid) / 2 / 5)
  assert (sp["lo"], sp["hi"]) == pytest.approx((0.00125 - half, 0.00125 + half))
  # Through every seed's S: muP has seed 0 alone at each width, so the same line as
  # through the means; sp's line goes through each seed's S at each width (at 32 the
  # three by hand above), its interval on (points - 2) degrees of freedom.
  per_seed = transfer_sensitivity.seed_sensitivities(rows)
  slopes = {r["label"]: r for r in transfer_sensitivity.sensitivity_slope_rows(list(sens.values()),
                                                                   per_seed)}
  mup = slopes["mup_adam_standard"]
  assert (mup["seed_points"], mup["seed_reading"]) == (4, "grows with width")
  assert (mup["seed_slope"], mup["seed_lo"], mup["seed_hi"]) == pytest.approx(
      (mup["slope"], mup["lo"], mup["hi"]))
  assert per_seed["sp_adam_standard", 32] == pytest.approx(dict(enumerate(s_by_seed)))
  xy = [(math.log2(w / 32), v) for w in WIDTHS
        for v in per_seed["sp_adam_standard", w].values()]
  x, y = np.array([p[0] for p in xy]), np.array([p[1] for p in xy])
  b, a = np.polyfit(x, y, 1)
  half = stats.t_multiplier(len(x) - 2) * math.sqrt(
      np.sum((y - a - b * x) ** 2) / (len(x) - 2) / np.sum((x - x.mean()) ** 2))
  sp = slopes["sp_adam_standard"]
  assert sp["seed_points"] == len(xy) == sum(len(per_seed["sp_adam_standard", w])
                                             for w in WIDTHS)
  assert (sp["seed_slope"], sp["seed_lo"], sp["seed_hi"]) == pytest.approx((b, b - half, b + half))


def test_versus_is_paired_at_each_ones_best(rows):
  """mup_adam_standard's best is 2^-9 at every width, sp's 2^-b, b = 8 + log2(w/32);
  at its own best each loss is the same curve plus seed s's noise (0, A, -A) x (-1)^e,
  so the per-seed differences are (0, x, -x), x = A ((-1)^9 - (-1)^b): mean 0, and
  the paired 95% t half-width t(2) sqrt(x^2 / 3)."""
  versus = {r["width"]: r for r in transfer.versus_rows(rows, "sp_adam_standard")}
  assert sorted(versus) == list(WIDTHS)
  for w, r in versus.items():
    b = _best("sp_adam_standard", w)
    assert (r["best_lr"], r["reference_lr"], r["method"], r["n"]) == (
        2.0**-9, 2.0**-b, "paired", 3)
    x = A * ((-1) ** 9 - (-1) ** b)
    half = stats.t_multiplier(2) * abs(x) / math.sqrt(3)
    assert (r["effect"], r["lo"], r["hi"]) == pytest.approx((0.0, -half, half), abs=1e-12)
    assert r["verdict"] == "within noise"


def test_logits_last_and_peak(rows):
  logits = {(r["label"], r["width"], r["learning_rate"]): r for r in transfer.logit_rows(rows)}
  r = logits["sp_adam_standard", 64, 2.0**-9]
  assert (r["max_logit_last"], r["max_logit_peak"]) == (_logit(9), 2 * _logit(9))
  assert logits["mup_adam_standard", 32, 2.0**-7]["status"] == "diverged"
  assert len(logits) == sum(len({e for e, s in _points(k, w) if s == 0})
                            for k in ("sp_adam_standard", "mup_adam_standard") for w in WIDTHS)


def test_cli_writes_every_file_the_same_twice(sweep_dir, tmp_path):
  outs = []
  for name in ("a", "b"):
    out = tmp_path / name
    studies_main.main(["transfer", "--out", str(out), "--workdirs", sweep_dir])
    outs.append({p: (out / p).read_bytes() for p in sorted(os.listdir(out))})
  assert set(outs[0]) == {f"{n}.{x}" for n in (
      "transfer", "transfer_slopes", "transfer_sensitivity", "transfer_sensitivity_slopes",
      "transfer_sensitivity_versus", "transfer_summary",
      "transfer_logits", "transfer_versus") for x in ("csv", "md")} | {
      f"transfer_{n}.png" for n in ("lr", "best", "sensitivity", "logits")} | {"runs.csv"}
  assert outs[0] == outs[1]
  runs = outs[0]["runs.csv"].decode().splitlines()
  assert runs[0].startswith("label,learning_rate,width,seed,final_train_loss")
  assert len(runs) - 1 == len(os.listdir(sweep_dir))
  assert "runs from 1 commit: aaaaaaa" in outs[0]["transfer.md"].decode()


def test_mixed_commits_need_the_flag(tmp_path):
  workdir = tmp_path / "sweep"
  _sweep(workdir, commit_of=lambda name: ("b" if name.endswith("-2") else "a") * 40)
  argv = ["transfer", "--out", str(tmp_path / "out"), "--workdirs", str(workdir)]
  with pytest.raises(SystemExit, match="transfer: runs from 2 commits.*--allow_mixed_code"):
    studies_main.main(argv)
  studies_main.main(argv + ["--allow_mixed_code"])
  assert "runs from 2 commits" in (tmp_path / "out" / "transfer.md").read_text()


def test_bad_workdirs_are_one_line_errors(sweep_dir, tmp_path):
  def run(*workdirs):
    return transfer.run_cli(argparse.Namespace(out=str(tmp_path / "out"),
                                               workdirs=list(workdirs)))
  with pytest.raises(SystemExit, match="^transfer: give --workdirs SWEEP_DIR"):
    run()
  with pytest.raises(SystemExit, match=r"^transfer: --labels '\(' is not a regular "):
    transfer.run_cli(argparse.Namespace(out=str(tmp_path / "out"), workdirs=[sweep_dir],
                                        labels="("))
  with pytest.raises(SystemExit, match="^transfer: --workdirs .* is not a directory$"):
    run(str(tmp_path / "missing"))
  empty = tmp_path / "empty"
  shutil.copytree(os.path.join(sweep_dir, "mup_adam_standard-32-7-0"), empty / "diverging")
  os.remove(empty / "diverging" / "metrics.jsonl")  # started, nothing logged: not finished
  with pytest.raises(SystemExit, match="^transfer: no finished runs in --workdirs"):
    run(str(empty))
  with pytest.raises(SystemExit, match=r"^transfer: --reference umup is not a label of "
                                       r"these runs \(sp_adam_standard, mup_adam_standard\)$"):
    transfer.run_cli(argparse.Namespace(out=str(tmp_path / "out"), workdirs=[sweep_dir],
                                        reference="umup"))


def test_several_workdirs_count_a_run_once_and_labels_select(sweep_dir, rows):
  """The same folder twice reads as once (a run name met again is the first's), and
  --labels keeps the labels its expression matches."""
  assert transfer_runs.read_workdirs([sweep_dir, sweep_dir]) == rows
  mup = transfer_runs.read_workdirs([sweep_dir], labels="^mup_")
  assert mup == [r for r in rows if r["label"] == "mup_adam_standard"] and mup


def test_a_partial_sweep_reads(tmp_path):
  """Mid-search: one label at one finished width and one where every rate diverged,
  seed 0 only. NaN where there is nothing to say, never an error."""
  for w, e, loss in ((32, 6, 2.1), (32, 5, math.nan), (64, 6, math.nan)):
    fake_run(tmp_path / "sweep", f"{w}-{e}", "preset=test,scaling=standard,seed=0",
             {"model.width": w, "learning_rate": 2.0**-e, "optimizer": "muon",
              "qk_clip": 50.0},
             [{"step": STEPS, "train/loss": loss, "train/loss_last20": loss}],
             done=math.isfinite(loss))
  paths, _ = transfer.run_cli(argparse.Namespace(out=str(tmp_path / "out"),
                                                 workdirs=[str(tmp_path / "sweep")]))
  assert len(paths) == 21
  rows = transfer_runs.read_rows(str(tmp_path / "sweep"))
  table = {r["width"]: r for r in transfer.table_rows(rows, transfer.slopes(rows))}
  assert table[32]["best_lr"] == 2.0**-6 and table[32]["seeds"] == 1
  assert math.isnan(table[32]["loss_lo"]) and math.isnan(table[32]["interp_lo"])
  assert math.isnan(table[64]["best_lr"]) and table[64]["transfer_basis"] == "no best"
  sens = {r["width"]: r for r in transfer_sensitivity.sensitivity_rows(rows)}
  assert sens[32]["S"] == pytest.approx((L0 + 2.1) / 2 - 2.1)
  assert math.isnan(sens[64]["S"]) and sens[64]["basis"] == "every rate diverged"
  (slope,) = transfer.slope_rows(list(table.values()), transfer.slopes(rows))
  assert slope["label"] == "sp_muon_qk_clip" and slope["reading"].startswith("fewer than 2")


def test_sensitivity_against_a_reference_is_paired_by_seed(rows):
  """A label whose every loss is 2 L - 2 of sp's (no rate near L0) has twice sp's S on
  each seed: its S minus sp's is sp's S, seed by seed, so the paired interval is sp's
  t-interval over its seeds, and the line through those differences is sp's own
  seed line; a label with seed 0 alone has no interval."""
  double = [dict(r, label="sp_double", final_train_loss=2 * r["final_train_loss"] - 2)
            for r in rows if r["label"] == "sp_adam_standard"]
  everything = list(rows) + double
  per_seed = transfer_sensitivity.seed_sensitivities(everything)
  versus = {(r["label"], r["width"]): r for r in
            transfer_sensitivity.sensitivity_versus_rows(everything, "sp_adam_standard")}
  ci = stats.mean_interval(per_seed["sp_adam_standard", 32].values())
  r = versus["sp_double", 32]
  assert (r["effect"], r["lo"], r["hi"]) == pytest.approx((ci.mean, ci.lo, ci.hi))
  assert (r["method"], r["n"], r["reference_S"]) == ("paired", 3, pytest.approx(ci.mean))
  assert versus["mup_adam_standard", 32]["method"] == "none"
  sens = transfer_sensitivity.sensitivity_rows(everything)
  slopes = {r["label"]: r for r in transfer_sensitivity.sensitivity_slope_rows(
      sens, per_seed, "sp_adam_standard")}
  sp, double = slopes["sp_adam_standard"], slopes["sp_double"]
  assert (sp["vs_points"], sp["vs_reading"]) == (0, "the reference")
  assert double["vs_points"] == sp["seed_points"]
  assert (double["vs_slope"], double["vs_lo"], double["vs_hi"]) == pytest.approx(
      (sp["seed_slope"], sp["seed_lo"], sp["seed_hi"]))


def _summary(rows, fits, reference="sp_adam_standard"):
  table = transfer.table_rows(rows, fits)
  sens = transfer_sensitivity.tables(rows, reference)["transfer_sensitivity_slopes"]
  return {r["label"]: r for r in transfer_summary.summary_rows(
      rows, table, transfer.slope_rows(table, fits), transfer.versus_rows(rows, reference),
      sens, reference)}


def test_summary_reads_off_the_other_tables(rows, fits):
  summary = _summary(rows, fits)
  sp, mup = summary["sp_adam_standard"], summary["mup_adam_standard"]
  assert sp["widths"] == mup["widths"] == "32 64 128 256"
  assert sp["best"] == "2^-8 2^-9 2^-10 2^-11" and mup["best"] == "2^-9 2^-9 2^-9 2^-9"
  assert sp["unfinished"] == mup["unfinished"] == "-"  # bracketed, 3 seeds in every band
  assert sp["slope"].startswith("-1.00 [") and sp["reading"] == "falls as 1/width"
  assert mup["slope"][1:].startswith("0.00 [") and mup["reading"] == "transfers"
  # At 256 sp's width-32 rate is three octaves off and ran on seed 0 alone.
  assert sp["at_width"] == 256 and sp["transfer"] == f"{0.015 * 9:.3f} seed 0"
  assert mup["transfer"] == "0 (same rate)" and sp["vs_reference"] == "the reference"
  ci = stats.mean_interval([_loss("sp_adam_standard", 256, 11, s) for s in (0, 1, 2)])
  assert sp["loss"] == f"{ci.mean:.3f} [{ci.lo:.3f}, {ci.hi:.3f}]"
  # Both labels' losses at their bests are the same noiseless curve: a paired 0.
  assert mup["vs_reference"].startswith("+0.000 [")


def test_summary_says_which_widths_are_unfinished_and_why(rows, fits):
  """Seed 2 gone from sp's best at 256 and seed 1 from a band rate at 128; seed 0's
  rates below muP's best at 64 gone, so its best there sits at the grid's edge."""
  kept = [r for r in rows if not (
      (r["label"], r["width"], r["seed"], r["learning_rate"]) == (
          "sp_adam_standard", 256, 2, 2.0**-11)
      or (r["label"], r["width"], r["seed"], r["learning_rate"]) == (
          "sp_adam_standard", 128, 1, 2.0**-9)
      or (r["label"] == "mup_adam_standard" and r["width"] == 64
          and r["learning_rate"] < 2.0**-9))]
  summary = _summary(kept, transfer.slopes(kept))
  assert summary["sp_adam_standard"]["unfinished"] == (
      "128: 1 band rate short of seeds; 256: 2 seeds at the best")
  assert summary["mup_adam_standard"]["unfinished"] == "64: not bracketed"


def test_the_pages_glance_table_is_the_committed_summary():
  """The transfer page's at-a-glance table is transfer_summary.csv's, printed by
  `python -m attnscale.studies.transfer_summary` (regenerate both together)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "docs", "results", "transfer", "transfer_summary.csv")) as f:
    table = transfer_summary.page_table({r["label"]: r for r in csv.DictReader(f)})
  with open(os.path.join(root, "docs", "experiments", "transfer.md")) as f:
    page = f.read()
  assert table in page
  assert len(table.splitlines()) == 2 + len(transfer_summary.PAGE_NAMES)


def test_a_name_asked_of_the_wrong_module_says_where_it_lives():
  with pytest.raises(AttributeError, match="transfer_runs.transfer_label"):
    transfer.transfer_label  # noqa: B018
