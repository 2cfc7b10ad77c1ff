"""Packed sweeps (attnscale/runtime/packed.py, packing.py): K runs in one vmapped program.

A packed test-preset sweep of 4 points (2 rates x 2 seeds) through sweep.py's own
runner writes 4 ordinary run directories that eval.py and the sweep tables read,
equal to the same points trained alone within `TOLERANCE`; a point whose loss
turns non-finite stops alone; Ctrl-C saves every run of the pack, and kill -9
then a rerun lose nothing (every step logged once, the uninterrupted pack's
values).

Needs $ATTNSCALE_DATA (CI sets it).
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from attnscale import testing
from attnscale.evaluation import eval_lib
from attnscale.experiments import sweeps
from attnscale.experiments.run_records import checkpoint_steps
from attnscale.experiments.sweeps import Point
from attnscale.runtime import (
  metric_keys,
  metrics_writer,
  packing,
  provenance,
  run_lock,
  train_lib,
)
from attnscale.runtime import packed as packed_lib

CONFIG = os.path.join(testing.ROOT, "configs", "shakespeare_char.py")
NUM_STEPS, CHECKPOINT_EVERY = 40, 10
RATES, SEEDS = (2.0**-8, 2.0**-6), (0, 1)
# Packed against alone: vmap batches every product and reduction, which XLA may
# sum in another order, so the two runs agree to float32 rounding at first and drift
# apart as training amplifies it (measured on the test preset at 2^-8: equal or 1-2
# ulp to step 19, 1e-4 by step 26, 4e-3 at step 40; at 2^-6 with JAX 0.12, 1.3e-5 at
# step 13 and 1.2e-4 at step 15; seed-to-seed differences there are ~0.05). Losses up to EARLY_STEPS within
# EARLY, every loss within LATE.
EARLY_STEPS, EARLY, LATE = 10, 1e-4, 2e-2
COMPARED = ("train/loss", "train/grad_norm", "train/loss_last20", "train/lr", "val/loss")



@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("xla_cache_packed")


def points(tfds_dir, rates=RATES, seeds=SEEDS) -> list[Point]:
  """The sweep's points: every rate x seed at the test preset, logged every step."""
  return [Point(f"preset=test,scaling=standard,seed={seed}",
                tuple(sorted({"learning_rate": lr, "num_train_steps": NUM_STEPS,
                              "log_every": 1, "eval_every": 20,
                              "checkpoint_every": CHECKPOINT_EVERY,
                              "data_dir": tfds_dir}.items())))
          for lr in rates for seed in seeds]


@pytest.fixture(scope="module")
def env(cache_dir, monkeypatch_module):
  """Children of the sweep share one XLA cache (compiled once)."""
  monkeypatch_module.setenv("JAX_COMPILATION_CACHE_DIR", str(cache_dir))
  monkeypatch_module.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


@pytest.fixture(scope="module")
def monkeypatch_module():
  with pytest.MonkeyPatch.context() as m:
    yield m


@pytest.fixture(scope="module")
def packed_sweep(tfds_dir, env, tmp_path_factory):
  """(workdir, points) of the 4-point sweep, run packed 4 at a time, uninterrupted."""
  workdir = str(tmp_path_factory.mktemp("packed"))
  pts = points(tfds_dir)
  assert sweeps.pack_units(CONFIG, pts, workdir, 4) == [[0, 1, 2, 3]]
  assert sweeps.run_sweep(CONFIG, pts, workdir, pack=4, log=lambda _: None) == []
  return workdir, pts


def rows(run_dir) -> dict[int, dict]:
  """Step -> the compared values of metrics.jsonl (each step must appear once)."""
  out = {}
  for row in metrics_writer.read_rows(str(run_dir)):
    values = {k: row[k] for k in COMPARED if k in row}
    if values:
      out.setdefault(row["step"], {}).update(values)
  return out


@pytest.mark.slow
def test_packed_points_are_ordinary_runs_equal_to_the_points_alone(packed_sweep, tmp_path):
  workdir, pts = packed_sweep
  table = sweeps.collect(workdir, pts)
  assert [r["status"] for r in table] == ["done"] * 4
  assert all(r["steps"] == NUM_STEPS for r in table)
  for point in pts:  # each directory as train.py writes it
    run_dir = os.path.join(workdir, point.name)
    assert checkpoint_steps(run_dir)[-1] == NUM_STEPS
    assert os.listdir(os.path.join(run_dir, "tensorboard"))
    assert not os.path.exists(os.path.join(run_dir, run_lock.LOCK_FILE))
    last = metrics_writer.read_rows(run_dir)[-2]
    assert "train/attn/max_logit/layer_0" in last  # attention health on logged steps
  result = eval_lib.evaluate_run(os.path.join(workdir, pts[3].name), sample_length=5)
  assert result["step"] == NUM_STEPS and np.isfinite(result["val_loss"])
  # Two of the points alone (one at each rate), as train.py runs them.
  for point in (pts[0], pts[3]):
    config = packing.load_config(f"{CONFIG}:{point.arg}", dict(point.overrides))
    train_lib.train_and_evaluate(config, str(tmp_path / point.name))
    alone, packed = rows(tmp_path / point.name), rows(os.path.join(workdir, point.name))
    assert sorted(alone) == sorted(packed) == list(range(1, NUM_STEPS + 1))
    for step, values in alone.items():
      for key in ("train/loss", "train/loss_last20", "val/loss", "train/lr"):
        if key in values:
          tolerance = EARLY if step <= EARLY_STEPS else LATE
          assert abs(packed[step][key] - values[key]) <= tolerance, (
              point.name, step, key, packed[step][key], values[key])


@pytest.mark.slow
def test_a_non_finite_point_stops_alone(tfds_dir, env, tmp_path):
  # 1e30: Adam's first step moves every weight by about the rate, and the logits overflow.
  good, bad = points(tfds_dir, rates=(2.0**-6, 1e30), seeds=(0,))
  # Its divergence is its result: logged, not a failure, and not rerun.
  logged = []
  assert sweeps.run_sweep(CONFIG, [good, bad], str(tmp_path), pack=2, log=logged.append) == []
  assert any(line.endswith(f"{bad.name}: diverged (a result: kept, archived and not rerun; "
                           "delete its directory to retry it)") for line in logged), logged
  table = {r["run"]: r for r in sweeps.collect(str(tmp_path), [good, bad])}
  assert table[good.name]["status"] == "done" and np.isfinite(table[good.name]["final_train_loss"])
  assert table[bad.name]["status"] == "diverged"
  assert checkpoint_steps(tmp_path / bad.name) == []  # nothing non-finite was saved


def start_pack(pts, workdir, log_path):
  specs = [p.run_spec(CONFIG, str(workdir)) for p in pts]
  with open(log_path, "a") as log:
    return subprocess.Popen(packing.command(specs, sys.executable), cwd=testing.ROOT,
                            env=testing.subprocess_env(JAX_PLATFORMS="cpu"),
                            stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_ctrl_c_and_kill_9_of_a_pack_lose_nothing(packed_sweep, tmp_path):
  reference, pts = packed_sweep
  dirs = [tmp_path / p.name for p in pts]
  log_path = tmp_path / "log.txt"
  # Ctrl-C after the first step: every run saves at one step, exit 130.
  proc = start_pack(pts, tmp_path, log_path)
  testing.wait_for(proc, lambda: all(os.path.exists(d / "metrics.jsonl") and
                                     metrics_writer.read_rows(str(d)) for d in dirs),
                   "the first logged step", log_path)
  for d in dirs:  # the lock covers every directory of the pack
    assert run_lock.read(str(d / run_lock.LOCK_FILE))["pid"] == proc.pid
  proc.send_signal(signal.SIGINT)
  output = testing.finish(proc, log_path, returncode=130)
  assert "saved a checkpoint of every running run" in output
  saved = {checkpoint_steps(d)[-1] for d in dirs}
  assert len(saved) == 1 and 0 < saved.pop() < NUM_STEPS
  # Resume, then kill -9 once every run has a newer checkpoint.
  proc = start_pack(pts, tmp_path, log_path)
  testing.wait_for(proc, lambda: all(checkpoint_steps(d) and checkpoint_steps(d)[-1]
                                     >= 2 * CHECKPOINT_EVERY for d in dirs),
                   "checkpoints of step 20", log_path)
  proc.kill()
  proc.wait()
  assert sweeps.run_sweep(CONFIG, pts, str(tmp_path), pack=4, log=lambda _: None) == []
  for point, d in zip(pts, dirs):
    resumed, uninterrupted = rows(d), rows(os.path.join(reference, point.name))
    assert sorted(resumed) == list(range(1, NUM_STEPS + 1))  # every step once
    for step, values in uninterrupted.items():
      for key, value in values.items():
        assert resumed[step][key] == pytest.approx(value, rel=1e-6, abs=1e-7), (step, key)


def test_which_runs_pack_together():
  base = packing.load_config(f"{CONFIG}:preset=test")
  other_rate = packing.load_config(f"{CONFIG}:preset=test,seed=3",
                                   {"learning_rate": 0.1, "weight_decay": 0.0})
  other_model = packing.load_config(f"{CONFIG}:preset=test,scaling=cosine")
  clipped = packing.load_config(f"{CONFIG}:preset=test", {"qk_clip": 50.0})
  packing.check_packable([base, other_rate])
  assert packing.pack_key(base) == packing.pack_key(other_rate)
  with pytest.raises(ValueError, match=r"differs from run 0 in model.scaling \('cosine'"):
    packing.check_packable([base, other_model])
  with pytest.raises(ValueError, match="qk_clip must be on"):
    packing.check_packable([base, clipped])
  configs = [base, other_model, other_rate, other_model, base]
  assert packing.groups(configs, 2) == [[0, 2], [1, 3], [4]]
  with pytest.raises(ValueError, match="no field model.nosuch"):
    packing.load_config(f"{CONFIG}:preset=test", {"model.nosuch": 1})


def test_print_commands_packs_the_points(tfds_dir, tmp_path):
  lines = sweeps.shell_commands(CONFIG, points(tfds_dir), str(tmp_path), pack=3)
  assert len(lines) == 2 and all("-m attnscale.commands.train" in line for line in lines)
  runs = json.loads(lines[0].split("--runs=", 1)[1].split(" && ")[0].strip("'"))
  assert [r["workdir"] for r in runs] == [os.path.join(str(tmp_path), p.name)
                                          for p in points(tfds_dir)[:3]]
  # The short last pack trains at the sweep's K too: one run and two padding slots.
  assert all("--pack_size=3" in line for line in lines)
  assert "train.py" not in lines[1]
  assert "train.py" in sweeps.shell_commands(CONFIG, points(tfds_dir), str(tmp_path),
                                             pack=1)[0]


IDENTITY_STEPS = 6


@pytest.mark.slow  # two packed compilations: ~40 s on 2 cores
def test_a_point_is_the_same_run_with_other_pack_mates(tfds_dir, env, tmp_path):
  """One point in two packs of K = 3, with other pack-mates (the second pack short,
  padded): bit-identical metrics; each run's provenance records K and its slot."""
  def config(lr, seed):
    return packing.load_config(f"{CONFIG}:preset=test,seed={seed}", {
        "learning_rate": lr, "num_train_steps": IDENTITY_STEPS, "log_every": 1,
        "eval_every": IDENTITY_STEPS, "checkpoint_every": IDENTITY_STEPS,
        "data_dir": tfds_dir})
  point = (2.0**-8, 0)
  first = [tmp_path / "a" / n for n in ("point", "b", "c")]
  packed_lib.train_packed([config(*point), config(2.0**-6, 1), config(2.0**-7, 2)],
                      [str(d) for d in first])
  second = [tmp_path / "b" / n for n in ("point", "d")]
  results = packed_lib.train_packed([config(*point), config(2.0**-5, 3)],
                                [str(d) for d in second], pack_size=3)
  assert [r["status"] for r in results] == ["done", "done"]
  timing = (metric_keys.ELAPSED_S, metric_keys.STEPS_PER_S, metric_keys.TOKENS_PER_S)
  strip = lambda rows: [{k: v for k, v in r.items() if k not in timing} for r in rows]
  a, b = (strip(metrics_writer.read_rows(str(d))) for d in (first[0], second[0]))
  assert len(a) == IDENTITY_STEPS + 1 and a == b  # every row equal, to the last bit
  assert strip(metrics_writer.read_rows(str(first[1]))) != a  # the pack-mates differ
  records = [provenance.read(str(d))[-1] for d in (*first, *second)]
  assert [(r["pack_size"], r["slot"]) for r in records] == [(3, 0), (3, 1), (3, 2),
                                                            (3, 0), (3, 1)]
  assert records[3]["pack"] == [os.path.abspath(d) for d in second]  # padding is no run


def test_a_pack_with_z_loss_logs_each_runs_term_and_sinks(tfds_dir, tmp_path):
  """K = 2 runs that differ in z_loss (a traced switch) train; each row holds the run's
  own term (at step 1, from the same initial logits: in the ratio of the coefficients),
  the output logits' health and each layer's sinks and activations, slot k's those of
  eval.py's diagnostics of its final checkpoint on its last batch's rows (vmapped)."""
  from attnscale import tasks
  from attnscale.evaluation import diagnostics
  coefs, steps = (1e-3, 1e-2), 3
  configs = [packing.load_config(f"{CONFIG}:preset=test", {
      "z_loss": coef, "num_train_steps": steps, "log_every": 1, "eval_every": steps,
      "checkpoint_every": steps, "sink_metrics_rows": 4, "data_dir": tfds_dir})
      for coef in coefs]
  workdirs = [str(tmp_path / f"z{k}") for k in range(2)]
  results = packed_lib.train_packed(configs, workdirs)
  assert [r["status"] for r in results] == ["done", "done"]
  keys = metric_keys
  first = []
  for config, workdir in zip(configs, workdirs):
    rows = {r["step"]: r for r in metrics_writer.read_rows(workdir) if keys.LOSS in r}
    assert sorted(rows) == list(range(1, steps + 1))
    assert all(np.isfinite(r[keys.Z_LOSS]) and keys.OUT_LOG_Z in r for r in rows.values())
    first.append(rows[1][keys.Z_LOSS])
    task = tasks.get_task(config)
    batch = {k: v[:4] for k, v in task.train_batch(steps - 1).items()}
    model, _, _ = eval_lib.restore(config, workdir, steps)
    for i, layer in enumerate(diagnostics.task_attention_stats(model, task, batch)):
      for prefix, name in keys.LAYER_STATS.items():
        np.testing.assert_allclose(rows[steps][keys.attention_key(prefix, i)], layer[name],
                                   rtol=1e-4, err_msg=f"{workdir} {name} {i}")
  np.testing.assert_allclose(first[1] / first[0], coefs[1] / coefs[0], rtol=1e-5)
