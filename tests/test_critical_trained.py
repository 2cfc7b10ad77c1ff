"""The critical_length_trained study (attnscale/studies/critical_trained.py) on
synthetic run records: its gamma choice, paired comparisons and entropy slopes."""

import json
import math

import numpy as np
import pytest

from attnscale.evaluation.length_eval import position_bins
from attnscale.studies import __main__ as cli
from attnscale.studies import critical_trained

LENGTHS = (64, 128, 256, 512)


def _run(root, label, scaling, positions, seed, losses, slope):
  """A finished, evaluated run of a sweep (its declared label): loss losses[i] at LENGTHS[i], entropy H(n) = slope *
  log n + 0.5 past the training length (64)."""
  run = root / f"{label}-{positions}-{seed}"
  run.mkdir()
  config = {"seed": seed, "seq_len": 64, "num_train_steps": 10, "label": label,
            "model": {"scaling": scaling, "positions": positions}}
  (run / "config.json").write_text(json.dumps(config))
  (run / "provenance.json").write_text(json.dumps([{"commit": "abc1234", "dirty": False}]))
  lengths = {}
  for L, loss in zip(LENGTHS, losses):
    bins = [[a + 1, b] for a, b in position_bins(L)]
    h = [slope * math.log(math.sqrt(lo * hi)) + 0.5 for lo, hi in bins]
    lengths[str(L)] = {"val_loss": loss + 0.01 * seed, "bits_per_char": loss / math.log(2),
                       "targets": 100, "loss_by_position": [loss] * L, "keys_bins": bins,
                       "entropy_by_keys": [h, h]}
  (run / "eval.json").write_text(json.dumps({"step": 10, "scaling": label,
                                             "lengths": lengths}))


def test_law_and_gamma():
  assert critical_trained.law_and_gamma("log_n_power(gamma=2,p=1)") == ("log_n_power(p=1)", 2.0)
  assert critical_trained.law_and_gamma("n_power(a=0.133,gamma=0.5)") == (
      "n_power(a=0.133)", 0.5)
  assert critical_trained.law_and_gamma("standard") == ("standard", None)


def test_the_study_chooses_gamma_and_compares_three_seeded_labels(tmp_path):
  runs = tmp_path / "runs"
  runs.mkdir()
  for seed in (0, 1, 2):
    _run(runs, "standard", "standard", "rope", seed, (2.0, 2.2, 2.6, 3.0), 1.0)
  for gamma, losses in ((0.5, (2.1, 2.3, 2.7, 3.1)), (1.0, (2.0, 2.1, 2.3, 2.5)),
                        (2.0, (2.2, 2.2, 2.4, 2.6))):
    label = f"log_n_power(gamma={gamma:g},p=1)"
    _run(runs, label, "log_n_power", "rope", 0, losses, 0.2)
  for seed in (1, 2):
    _run(runs, "log_n_power(gamma=1,p=1)", "log_n_power", "rope", seed,
         (2.0, 2.1, 2.3, 2.5), 0.2)
  out = tmp_path / "out"
  cli.main(["critical_length_trained", "--out", str(out), "--choose_at", "256",
            "--workdirs", *map(str, sorted(runs.iterdir()))])
  gamma = (out / "critical_length_gamma.csv").read_text().splitlines()
  assert gamma[0].startswith("law,positions,gamma,chosen")
  chosen = [line for line in gamma[1:] if ",yes," in line]
  assert len(chosen) == 1 and chosen[0].startswith("log_n_power(p=1),rope,1,yes")
  compare = (out / "critical_length_compare.md").read_text()
  assert "| log_n_power(gamma=1,p=1) | rope | standard, rope |" in compare
  assert "-0.500 [-0.500, -0.500] paired n=3: better" in compare  # at 512: 2.5 vs 3.0
  entropy = (out / "critical_length_entropy.csv").read_text()
  assert '"log_n_power(gamma=1,p=1)",rope,3,"0.200 [0.200, 0.200]"' in entropy
  assert 'standard,rope,3,"1.000 [1.000, 1.000]"' in entropy
  assert (out / "critical_length_trained.png").stat().st_size > 0
  with pytest.raises(SystemExit, match="--choose_at 100 is not an evaluated length"):
    cli.main(["critical_length_trained", "--out", str(out), "--choose_at", "100",
              "--workdirs", *map(str, sorted(runs.iterdir()))])


def test_entropy_slope_reads_past_the_training_length():
  bins = [[1, 1], [2, 3], [4, 7], [8, 15], [16, 31], [32, 63], [64, 127], [128, 255],
          [256, 256]]
  n = np.array([math.sqrt(a * b) for a, b in bins])
  h = np.where(n > 64, 3.0 - 0.5 * np.log(n), np.log(n))  # falls past 64: supercritical
  run = critical_trained.RunLengths("w", "x", "rope", 0, 64, {
      256: {"keys_bins": bins, "entropy_by_keys": [list(h)]}})
  assert critical_trained.entropy_slope(run, 256) == pytest.approx(-0.5)
