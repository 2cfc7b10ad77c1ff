"""eval.py --lengths: the loss at several context lengths and by position, through the
user's path (a trained rotary run, its checkpoint, eval_lib/eval.py)."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnscale import testing
from attnscale.data import char_lm
from attnscale.evaluation import eval_lib, length_eval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(tmp_path_factory, positions):
  run = testing.train_tiny_run(tmp_path_factory, "preset=test,scaling=log_n", steps=10,
                               overrides={"model.positions": positions}, name=positions)
  return run.config, run.workdir


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
  return _train(tmp_path_factory, "rope")


def test_lengths_in_eval_json(rope_run):
  config, workdir = rope_run  # trained at 32
  result = eval_lib.evaluate_run(workdir, sample_length=5, lengths=[32, 64, 256])
  data = char_lm.load_tiny_shakespeare(config.data_dir)
  assert list(result["lengths"]) == ["32", "64", "256"]
  for length, r in result["lengths"].items():
    assert r["targets"] == len(data.validation) - 1  # every target once
    assert len(r["loss_by_position"]) == int(length)
    assert r["bits_per_char"] == pytest.approx(r["val_loss"] / math.log(2))
    assert np.isfinite(r["loss_by_position"]).all()
    # Attention entropy by keys seen, per layer: 0 with one key, never above log n.
    bins = r["keys_bins"]
    assert bins[0] == [1, 1] and bins[-1][1] == int(length)
    assert [a for a, _ in bins[1:]] == [b + 1 for _, b in bins[:-1]]  # contiguous
    assert len(r["entropy_by_keys"]) == config.model.num_layers
    for entropy in r["entropy_by_keys"]:
      assert len(entropy) == len(bins) and entropy[0] == pytest.approx(0, abs=1e-6)
      assert all(0 <= e <= math.log(b) + 1e-5 for e, (_, b) in zip(entropy, bins))
  # At the training length the whole-split number is eval's own.
  assert result["lengths"]["32"]["val_loss"] == pytest.approx(result["val_loss"], rel=1e-5)
  with open(os.path.join(workdir, "eval.json")) as f:
    assert json.load(f)["lengths"]["256"]["val_loss"] == result["lengths"]["256"]["val_loss"]
  assert "length | val loss" in eval_lib.format_summary(result)


def test_loss_by_position_matches_direct_computation(rope_run):
  config, workdir = rope_run
  model, _, mesh = eval_lib.restore(eval_lib.load_config(workdir), workdir)
  task = type("T", (), {})()
  data = char_lm.load_tiny_shakespeare(config.data_dir)
  task.data = char_lm.CharDataset(train=data.train, validation=data.validation[:1 + 3 * 64],
                                   vocab=data.vocab)
  task.config = config
  r = length_eval.evaluate_lengths(model, task, [64], mesh=mesh, tokens_per_batch=64)["64"]
  tokens = task.data.validation
  x, y = tokens[:-1].reshape(3, 64), tokens[1:].reshape(3, 64)
  logp = jax.nn.log_softmax(model(jnp.asarray(x)))
  nll_BL = -np.take_along_axis(np.asarray(logp), y[..., None], -1)[..., 0]
  np.testing.assert_allclose(r["loss_by_position"], nll_BL.mean(0), rtol=1e-5)
  assert r["val_loss"] == pytest.approx(nll_BL.mean(), rel=1e-5)


def test_bad_lengths_fail_in_one_line_before_any_work(rope_run, tmp_path_factory):
  _, workdir = rope_run
  for text in ("0,128", "abc", ""):
    with pytest.raises(ValueError, match="--lengths must be comma-separated positive"):
      length_eval.parse_lengths(text)
  assert length_eval.parse_lengths("256, 128,128") == [128, 256]
  with pytest.raises(ValueError, match="longer than the validation split"):
    eval_lib.evaluate_run(workdir, lengths=[10**7])
  _, learned = _train(tmp_path_factory, "learned")
  proc = subprocess.run([sys.executable, "eval.py", f"--workdir={learned}", "--lengths=32,64"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith("error: --lengths: sequence length 64 exceeds model.block_size 32")
  assert "'rope' or 'none'" in lines[-1]
  assert not os.path.exists(os.path.join(learned, "eval.json"))  # failed before any work


@pytest.mark.slow
def test_length_sweep_and_study(tmp_path):
  """The study's user path: sweep.py's length_test sweep (train, then eval.py
  --lengths), then `python -m attnscale.studies length`."""
  if not os.environ.get("ATTNSCALE_DATA"):
    pytest.skip("needs ATTNSCALE_DATA (CI sets it) or network access")
  from attnscale.experiments import sweeps
  from attnscale.studies import __main__ as studies_main
  config_file = os.path.join(ROOT, "configs", "shakespeare_char.py")
  points = sweeps.load_sweep(config_file, "length_test")
  assert [p.eval_flags for p in points] == [("--lengths=32,64", "--length=100")] * 2
  assert " && python eval.py " in sweeps.shell_commands(config_file, points, "w")[0]
  # Both points at once, each pinned to its share of the CPUs (as --jobs=2).
  assert sweeps.run_sweep(config_file, points, str(tmp_path), log=lambda _: None, jobs=2) == []
  workdirs = [str(tmp_path / p.name) for p in points]
  out = tmp_path / "out"
  studies_main.main(["length", "--out", str(out), "--workdirs", *workdirs])
  md = (out / "length.md").read_text()
  assert "| standard | rope | 1 |" in md and "| log_n | rope | 1 |" in md
  assert (out / "length.png").stat().st_size > 0
  rows = (out / "length_runs.csv").read_text().splitlines()
  assert len(rows) == 1 + 2 * 2  # header, 2 runs x 2 lengths
  runs = (out / "runs.csv").read_text().splitlines()  # a row a run, with its provenance
  assert len(runs) == 1 + 2 and "val_loss_L32" in runs[0] and ",done," in runs[1]
  # Rerunning skips both the training and the evaluation.
  log = []
  sweeps.run_sweep(config_file, points, str(tmp_path), log=log.append)
  assert all("done, skipped" in line for line in log)


def test_length_study_groups_seeds(tmp_path):
  """The study's table and figure from eval.json files (what eval.py --lengths writes)."""
  from attnscale.studies import __main__ as studies_main
  workdirs = []
  for scaling, positions, seed, losses in [("standard", "rope", 0, (2.0, 2.5)),
                                           ("standard", "rope", 1, (2.2, 2.9)),
                                           ("log_n", "none", 0, (2.1, 2.2))]:
    w = tmp_path / f"{scaling}-{positions}-{seed}"
    w.mkdir()
    (w / "config.json").write_text(json.dumps(
        {"seed": seed, "seq_len": 4, "learning_rate": 0.01, "num_train_steps": 10,
         "model": {"scaling": scaling, "positions": positions}}))
    lengths = {str(L): {"val_loss": x, "bits_per_char": x / math.log(2), "targets": 100,
                        "loss_by_position": [x] * L} for L, x in zip((4, 16), losses)}
    (w / "eval.json").write_text(json.dumps({"scaling": scaling, "lengths": lengths}))
    workdirs.append(str(w))
  out = tmp_path / "out"
  studies_main.main(["length", "--out", str(out), "--workdirs", *workdirs])
  md = (out / "length.md").read_text()
  # Two seeds: mean 2.1, standard error |2.0 - 2.2| / 2 = 0.1; growth (0.5, 0.7) -> 0.6 +- 0.1.
  assert "| standard | rope | 2 | 2.100 ± 0.100 | 2.700 ± 0.200 | +0.600 ± 0.100 |" in md
  assert "| log_n | none | 1 | 2.100 | 2.200 | +0.100 |" in md
  assert "runs from 1 commit: unknown (3 runs)" in md  # no provenance.json
  assert (out / "length.png").stat().st_size > 0
  runs = (out / "runs.csv").read_text().splitlines()
  assert runs[0].split(",")[:3] == ["label", "learning_rate", "positions"]
  assert "val_loss_L4" in runs[0] and "val_loss_L16" in runs[0] and len(runs) == 1 + 3
  # log_n has no positions twin of standard here and one seed: nothing to pair.
  compare = (out / "length_compare.md").read_text()
  assert "| log_n | none | standard, none |" not in compare
  # Runs of two commits: refused, unless told (then said under the table).
  (tmp_path / "standard-rope-1" / "provenance.json").write_text(json.dumps([{"commit": "b" * 40}]))
  with pytest.raises(SystemExit, match="length: runs from 2 commits.*--allow_mixed_code"):
    studies_main.main(["length", "--out", str(out), "--workdirs", *workdirs])
  studies_main.main(["length", "--out", str(out), "--workdirs", *workdirs, "--allow_mixed_code"])
  assert "runs from 2 commits: unknown (2 runs), bbbbbbb (1 run)" in (out / "length.md").read_text()
  with pytest.raises(SystemExit, match="has no eval.json"):
    studies_main.main(["length", "--out", str(out), "--workdirs", str(tmp_path)])


def test_length_comparisons_are_paired_by_seed():
  """comparison_rows: each group against standard (same positions) and rope against
  none, paired by seed: differences 0.1, 0.2, 0.3 give +0.200 +- t(0.975, 2) 0.1 / sqrt 3."""
  from attnscale.studies import length
  def run(scaling, positions, seed, at_4, at_16):
    return length.RunLengths(f"w/{scaling}-{positions}-{seed}", scaling, positions, seed, 4,
                             {4: {"val_loss": at_4}, 16: {"val_loss": at_16}})
  runs = [run("standard", "rope", s, 2.0 + s, 2.5 + s) for s in range(3)]
  runs += [run("cosine", "rope", s, 2.1 + 0.1 * s + s, 2.5 + s) for s in range(3)]
  runs += [run("cosine", "none", s, 2.1 + 0.1 * s + s, 2.6 + s) for s in range(3)]
  rows = {(r["scaling"], r["positions"], r["against"]): r
          for r in length.comparison_rows(length.LengthResult(runs))}
  assert set(rows) == {("cosine", "rope", "standard, rope"), ("cosine", "none", "cosine, rope")}
  vs_standard = rows["cosine", "rope", "standard, rope"]
  assert vs_standard["L=4"] == "+0.200 [-0.048, +0.448] paired n=3: within noise"
  assert vs_standard["L=16"] == "+0.000 [+0.000, +0.000] paired n=3: within noise"
  # Growth: standard 0.5 each seed; cosine 0.4, 0.3, 0.2 -> -0.2 with the same spread.
  assert vs_standard["growth 4->16"] == "-0.200 [-0.448, +0.048] paired n=3: within noise"
  assert rows["cosine", "none", "cosine, rope"]["L=16"].startswith("+0.100 [+0.100, +0.100]")
