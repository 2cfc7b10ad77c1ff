"""Resuming after a hard kill: train.py killed with SIGKILL, rerun, equals the
uninterrupted run; what the killed process logged past its last checkpoint is
superseded, once; checkpoints from before the loss window still restore.

Needs $ATTNSCALE_DATA for the end-to-end test (CI sets it).
"""

import json
import os
import signal
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tensorboardX.proto import event_pb2

from attnscale import testing
from attnscale.experiments.run_records import checkpoint_steps
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import metrics_writer
from attnscale.runtime import train_state as ts

NUM_STEPS, CHECKPOINT_EVERY = 600, 100  # ~100 steps/s on 2 CPU cores: seconds to kill in


def read_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def tb_events(logdir):
  """[(file, event)] of every event file under `logdir`, oldest file first."""
  out = []
  for name in sorted(os.listdir(logdir)):  # events.out.tfevents.<time>...: oldest first
    with open(os.path.join(logdir, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      out.append((name, event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])))
      pos += 16 + length
  return out


def tb_scalars_as_shown(logdir):
  """{tag: {step: value}} as TensorBoard shows it: a SessionLog START at step s
  in a later file hides the earlier files' events at steps >= s (purge_step)."""
  scalars = {}
  for _, event in tb_events(logdir):
    if event.HasField("session_log") and event.session_log.status == event.session_log.START:
      for by_step in scalars.values():
        for step in [s for s in by_step if s >= event.step]:
          del by_step[step]
    for value in event.summary.value:
      scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


# ---------------------------------------------------------------------------
# The end-to-end test: a real SIGKILL.


def start_train_py(workdir, tfds_dir, cache_dir, log_path):
  # One XLA cache for the three processes: the run compiles once.
  return testing.start_train_py(
      workdir, log_path, f"--config.data_dir={tfds_dir}",
      f"--config.num_train_steps={NUM_STEPS}", "--config.log_every=1",
      f"--config.checkpoint_every={CHECKPOINT_EVERY}", f"--config.eval_every={NUM_STEPS}",
      cache_dir=cache_dir)


def run_to_end(workdir, tfds_dir, cache_dir, log_path):
  testing.finish(start_train_py(workdir, tfds_dir, cache_dir, log_path), log_path)


@pytest.mark.slow
def test_sigkill_then_rerun_equals_uninterrupted_run(tfds_dir, tmp_path):
  cache, log = tmp_path / "xla_cache", tmp_path / "log"
  uninterrupted, resumed = str(tmp_path / "a"), str(tmp_path / "b")
  run_to_end(uninterrupted, tfds_dir, cache, log)

  # Kill once a checkpoint is on disk and steps after it are logged.
  def past_a_checkpoint():
    saved = checkpoint_steps(resumed)
    logged = [r["step"] for r in metrics_writer.read_rows(resumed)]
    return bool(saved and logged and logged[-1] >= saved[-1] + 5)

  proc = start_train_py(resumed, tfds_dir, cache, log)
  try:
    testing.wait_for(proc, past_a_checkpoint, "a checkpoint and 5 steps past it", log)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  restored_step = checkpoint_steps(resumed)[-1]
  killed_rows = read_rows(resumed)
  assert restored_step < NUM_STEPS and killed_rows[-1]["step"] > restored_step
  assert killed_rows[-1]["step"] < NUM_STEPS, "the kill came too late to test anything"

  run_to_end(resumed, tfds_dir, cache, log)
  assert f"resumed from {resumed} at step {restored_step}" in log.read_text()
  # The killed process's WORKDIR/LOCK: its pid is gone, so the rerun took it over.
  assert f"taking over {resumed}/LOCK from process {proc.pid} " in log.read_text()
  assert not os.path.exists(os.path.join(resumed, "LOCK"))  # released at the end

  rows_a, rows_b = read_rows(uninterrupted), read_rows(resumed)
  train_a = {r["step"]: r for r in rows_a if "train/loss" in r}
  train_b = [r for r in rows_b if "train/loss" in r]
  steps_b = [r["step"] for r in train_b]
  assert steps_b == list(range(1, NUM_STEPS + 1))  # each step once, in order: no duplicates
  for key in ("train/loss", "train/grad_norm", "train/loss_last20"):
    # loss_last20 of the 19 steps after the restore covers steps before it too.
    assert [r[key] for r in train_b] == [train_a[s][key] for s in steps_b], key
  assert [r["step"] for r in rows_b if "val/loss" in r] == [NUM_STEPS]
  assert [r["val/loss"] for r in rows_b if "val/loss" in r] == [
      r["val/loss"] for r in rows_a if "val/loss" in r]

  # Training time continues from the restored step's value: never goes back.
  elapsed = [r["train/elapsed_s"] for r in train_b]
  assert all(a <= b for a, b in zip(elapsed, elapsed[1:])), elapsed
  kept = {r["step"]: r for r in killed_rows if "train/elapsed_s" in r}
  assert elapsed[restored_step] >= kept[restored_step]["train/elapsed_s"]

  # TensorBoard: the rerun's file supersedes the killed process's events after the
  # restored step; what TensorBoard shows is every step once, the same losses.
  starts = [(name, e.step) for name, e in tb_events(os.path.join(resumed, "tensorboard"))
            if e.HasField("session_log")]
  assert starts and starts[-1][1] == restored_step + 1, starts
  shown = tb_scalars_as_shown(os.path.join(resumed, "tensorboard"))
  assert sorted(shown["train/loss"]) == steps_b
  for step, loss in shown["train/loss"].items():
    assert loss == pytest.approx(train_a[step]["train/loss"], rel=1e-6)


# ---------------------------------------------------------------------------
# The pieces, fast.


def test_writer_drops_rows_past_the_resume_step_atomically(tmp_path):
  path = tmp_path / "metrics.jsonl"
  lines = [json.dumps({"step": s, "train/loss": 5.0 - s / 10}) for s in range(1, 16)]
  lines.insert(10, json.dumps({"step": 10, "val/loss": 4.0}))
  path.write_text("\n".join(lines) + '\n{"step": 16, "train/lo')  # torn by the kill
  tb = tmp_path / "tensorboard"
  tb.mkdir()
  (tb / "events.out.tfevents.1.host").write_bytes(b"")  # an earlier process's file
  writer = metrics_writer.MetricsWriter(str(tmp_path), resume_step=10)
  writer.write(11, {"train/loss": 1.0})
  writer.close()
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert [r["step"] for r in rows] == list(range(1, 11)) + [10, 11]
  assert rows[-1] == {"step": 11, "train/loss": 1.0}
  assert not os.path.exists(f"{path}.tmp")
  new = [n for n in os.listdir(tb) if n != "events.out.tfevents.1.host"]
  starts = [e.step for _, e in tb_events(tb) if e.HasField("session_log")]
  assert len(new) == 1 and starts == [11]


def test_flush_puts_every_event_so_far_on_disk(tmp_path):
  # What a SIGKILL after a checkpoint leaves: the writer is never closed. Every
  # event written before flush() must be in the file (tensorboardX's
  # SummaryWriter.flush left queued events to a thread; CI lost step 100 of 600).
  writer = metrics_writer.MetricsWriter(str(tmp_path), resume_step=0)
  for step in range(1, 501):
    writer.write(step, {"train/loss": 1.0 / step, "train/grad_norm": float(step)})
  writer.flush()
  events = [e for _, e in tb_events(tmp_path / "tensorboard") if e.HasField("summary")]
  assert [e.step for e in events] == [s for s in range(1, 501) for _ in range(2)]
  assert {v.tag for e in events for v in e.summary.value} == {"train/loss", "train/grad_norm"}
  assert events[-2].summary.value[0].simple_value == pytest.approx(1.0 / 500)
  writer.close()


def test_the_writer_does_not_import_torch():
  # tensorboardX's __init__ imports torch where installed (2.5-3 s and ~600 MB
  # resident in every train.py here); the writer hides it, and leaves it
  # importable. Where torch is absent this checks only that nothing breaks.
  script = ("import importlib.util, sys\n"
            "import attnscale.commands.train, attnscale.runtime.packed\n"
            "print('torch' in sys.modules)\n"
            "if importlib.util.find_spec('torch'):\n"
            "  import torch; assert torch.ones(2).sum().item() == 2.0\n")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=120, check=True)
  assert proc.stdout.strip().splitlines()[-1] == "False"


def test_fresh_start_drops_a_killed_first_segment(tmp_path):
  # Killed before its first checkpoint: the rerun starts at step 0.
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 4.0}\n')
  metrics_writer.MetricsWriter(str(tmp_path), resume_step=0).close()
  assert (tmp_path / "metrics.jsonl").read_text() == ""
  assert metrics_writer.value_at(str(tmp_path), "train/loss", 0) is None


def test_value_at_reads_the_restored_step(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(
      "".join(json.dumps({"step": s, "train/elapsed_s": 2.0 * s}) + "\n" for s in (5, 10, 15))
      + json.dumps({"step": 10, "val/loss": 3.0}) + "\n")
  assert metrics_writer.value_at(str(tmp_path), "train/elapsed_s", 10) == 20.0
  assert metrics_writer.value_at(str(tmp_path), "train/elapsed_s", 12) == 20.0
  assert metrics_writer.value_at(str(tmp_path), "train/elapsed_s", 4) is None


def test_loss_window_keeps_the_last_losses_in_order():
  window = ts.init_last_losses()
  assert np.isnan(ts.mean_last_losses(window))
  push = jax.jit(ts.push_loss)
  for i in range(ts.LAST_LOSSES + 5):
    window = push(window, jnp.float32(i))
    count = min(i + 1, ts.LAST_LOSSES)
    assert int(window["count"]) == count
    assert ts.mean_last_losses(window) == np.mean(np.arange(i + 1 - count, i + 1))


def _tiny_state():
  mesh = ts.make_mesh()
  state = {"step": jnp.int32(0), "params": {"w": jnp.zeros(3)}, "opt_state": {"mu": jnp.zeros(3)},
           "last_losses": ts.init_last_losses()}
  return state, jax.tree.map(lambda _: NamedSharding(mesh, P()), state)


def _save_raw(workdir, step, tree):
  manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                  options=ocp.CheckpointManagerOptions(create=True))
  manager.save(step, args=ocp.args.StandardSave(tree), force=True)
  manager.wait_until_finished()
  manager.close()


def test_checkpoint_from_before_the_loss_window_restores(tmp_path):
  state, shardings = _tiny_state()
  _save_raw(str(tmp_path), 7, {"step": jnp.int32(7), "params": {"w": jnp.ones(3)},
                               "opt_state": {"mu": jnp.full(3, 2.0)}})
  checkpoints = ckpt.Checkpoints(str(tmp_path), keep=3)
  try:
    restored = jax.device_get(checkpoints.restore(state, shardings))
  finally:
    checkpoints.close()
  assert int(restored["step"]) == 7
  np.testing.assert_array_equal(restored["params"]["w"], np.ones(3))
  np.testing.assert_array_equal(restored["opt_state"]["mu"], np.full(3, 2.0))
  assert int(restored["last_losses"]["count"]) == 0  # empty: it was not saved


def test_checkpoint_of_another_layout_is_a_one_line_error(tmp_path):
  state, shardings = _tiny_state()
  _save_raw(str(tmp_path), 7, {"step": jnp.int32(7), "params": {"w": jnp.ones(3)},
                               "ema": {"w": jnp.ones(3)}})
  checkpoints = ckpt.Checkpoints(str(tmp_path), keep=3)
  try:
    with pytest.raises(ValueError) as info:
      checkpoints.restore(state, shardings)
    message = str(info.value)
    assert "ema" in message and "opt_state" in message and "\n" not in message, message
    with pytest.raises(ValueError, match=r"no checkpoint of step 3 .*\[7\]"):
      checkpoints.restore(state, shardings, step=3)
  finally:
    checkpoints.close()
