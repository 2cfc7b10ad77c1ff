"""eval.py on a real checkpoint: whole-split loss, bits/char, sample, diagnostics."""

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
from attnscale.evaluation import diagnostics, eval_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  run = testing.train_tiny_run(tmp_path_factory, steps=10)
  return run.config, run.workdir


def test_eval_on_checkpoint(trained):
  config, workdir = trained
  result = eval_lib.evaluate_run(workdir, sample_length=20, seed=1)
  data = char_lm.load_tiny_shakespeare(config.data_dir)
  assert result["step"] == 10
  assert result["val_tokens"] == len(data.validation) - 1
  assert 1.0 < result["val_loss"] < math.log(65) + 0.5
  assert result["bits_per_char"] == pytest.approx(result["val_loss"] / math.log(2))
  assert len(result["attention"]) == config.model.num_layers
  for layer in result["attention"]:
    assert set(layer) == {"output_std", "entropy", "max_logit", "sink_rate", "sink_heads",
                          "top_key_weight", "uniform_sink_rate", "row_mass", "first_value_norm",
                          "first_value_ratio", "max_act", "median_act", "act_ratio", "kurtosis",
                          "heads"}
    assert all(np.isfinite(v) for k, v in layer.items() if k != "heads")
    assert set(layer["heads"]) == {"entropy", "max_logit", "sink_rate", "top_key_weight",
                                   "row_mass", "first_value_norm", "first_value_ratio"}
    assert all(len(v) == config.model.num_heads for v in layer["heads"].values())
  assert len(result["sample"]["text"]) == 20
  with open(os.path.join(workdir, "eval.json")) as f:
    assert json.load(f)["val_loss"] == result["val_loss"]
  # Seeded: the same sample again.
  again = eval_lib.evaluate_run(workdir, sample_length=20, seed=1)
  assert again["sample"]["text"] == result["sample"]["text"]


def test_whole_split_loss_matches_direct_computation(trained):
  config, workdir = trained
  model, _, _ = eval_lib.restore(eval_lib.load_config(workdir), workdir)
  data = char_lm.load_tiny_shakespeare(config.data_dir)
  tokens = data.validation[:1 + 4 * config.seq_len]  # 4 windows, computed directly
  x = tokens[:-1].reshape(4, config.seq_len)
  y = tokens[1:].reshape(4, config.seq_len)
  logp = jax.nn.log_softmax(model(jnp.asarray(x)))
  direct = -float(jnp.mean(jnp.take_along_axis(logp, jnp.asarray(y)[..., None], -1)))
  batches = char_lm.eval_batches(tokens, batch_size=8, seq_len=config.seq_len)
  total = count = 0.0
  for b in batches:
    _, sums = model_loss(model, b)
    total, count = total + float(sums["loss_sum"]), count + float(sums["count"])
  assert total / count == pytest.approx(direct, rel=1e-5)


def model_loss(model, batch):
  from attnscale.tasks import cross_entropy
  logits = model(jnp.asarray(batch["inputs"]))
  total, count = cross_entropy(logits, batch["targets"], batch["weights"])
  return total / count, {"loss_sum": total, "count": count}


def test_eval_cli(trained):
  _, workdir = trained
  proc = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--length=10"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "bits/char" in proc.stdout and "max logit" in proc.stdout


def test_eval_cli_bad_workdir(tmp_path):
  proc = subprocess.run([sys.executable, "eval.py", f"--workdir={tmp_path}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1].startswith("error: --workdir")


def test_attention_stats_standard_numbers():
  # Uniform attention over n keys has entropy log n; the output std follows Graphcore.
  q = jnp.zeros((1, 16, 1, 8))
  k = v = jax.random.normal(jax.random.key(0), (1, 16, 1, 8))
  stats = diagnostics.attention_stats(q, k, v)
  assert float(stats["entropy"]) == pytest.approx(math.log(16), rel=1e-5)
  assert float(stats["max_logit"]) == 0.0
  causal = diagnostics.attention_stats(q, k, v, is_causal=True)
  want = np.mean([math.log(i) for i in range(1, 17)])
  assert float(causal["entropy"]) == pytest.approx(want, rel=1e-5)


def test_sweeps_evaluate_finished_then_archive(trained, tmp_path):
  """`sweep.py --evaluate`: every finished run with weights gets its eval.json once,
  so `archive` (no weights) keeps it; archived runs are not evaluated again."""
  import shutil

  from attnscale.experiments import run_records
  _, workdir = trained
  work = tmp_path / "sweep"
  shutil.copytree(workdir, work / "a")
  (work / "a" / "eval.json").unlink(missing_ok=True)
  assert run_records.evaluate_finished(str(work)) == ["a"] and run_records.evaluated(str(work / "a"))
  assert run_records.evaluate_finished(str(work)) == []  # done once
  run_records.archive(str(work), str(tmp_path / "raw"))
  assert (tmp_path / "raw" / "a" / "eval.json").exists()
  shutil.copytree(tmp_path / "raw", tmp_path / "fresh")  # another machine: no weights
  (tmp_path / "fresh" / "a" / "eval.json").unlink()
  assert run_records.evaluate_finished(str(tmp_path / "fresh")) == []  # nothing to read


def test_evaluation_reads_the_parameters_alone(trained):
  """eval.py restores `params` only (orbax's partial restore): the same arrays as a
  full restore, and a target whose optimizer state could not hold the saved one
  (another optimizer's layout) does not matter to it."""
  from attnscale.runtime import checkpoints as ckpt
  config, workdir = trained
  s = eval_lib.evaluation_start(config, data=False, workdir=workdir)
  checkpoints = ckpt.Checkpoints(workdir, s.run.keep_checkpoints)
  try:
    full = checkpoints.restore(s.shapes, s.shardings)
    alone = checkpoints.restore(s.shapes, s.shardings, only=("params",))
    other = dict(s.shapes, opt_state={"not": jax.ShapeDtypeStruct((3,), jnp.float32)})
    sharded = dict(s.shardings, opt_state={"not": None})
    newest, step, damaged = checkpoints.restore_newest_intact(other, sharded, only=("params",))
  finally:
    checkpoints.close()
  assert set(alone) == {"params"} and set(newest) == {"params"} and (step, damaged) == (10, [])
  for a, b, c in zip(jax.tree.leaves(full["params"]), jax.tree.leaves(alone["params"]),
                     jax.tree.leaves(newest["params"]), strict=True):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
