"""Faults a long run meets, with real signals and real files: Ctrl-C (once, and
twice), a truncated file in the newest checkpoint (and in every checkpoint), a
second train.py on a run directory in use, the lock a killed process left, and a
sweep's Ctrl-C and damaged final checkpoint.

Each end-to-end test ends where one uninterrupted train.py run of the same
command does (module fixture): every step logged once, the same losses, bit
for bit (CPU). The runs share one XLA cache, so only the first one compiles.

Needs $ATTNSCALE_DATA (CI sets it).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from attnscale import testing
from attnscale.evaluation import eval_lib
from attnscale.experiments import run_records
from attnscale.experiments.run_records import checkpoint_steps
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import metrics_writer, run_lock, train_lib
from attnscale.runtime.interrupts import SECOND_CTRL_C

# Checkpoints at 100, 200 and 300 (the preset keeps 3); ~100 steps/s with a row each.
NUM_STEPS, CHECKPOINT_EVERY = 300, 100
# Each row's values, without the timings (steps/s, elapsed_s).
COMPARED = ("train/loss", "train/grad_norm", "train/loss_last20", "train/lr", "val/loss")

# The in-process restores (eval_lib) compile once per module.


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("xla_cache_faults")


@pytest.fixture(scope="module")
def start(tfds_dir, cache_dir):
  """start(workdir, log_path): the test command in a subprocess."""
  def start(workdir, log_path):
    return testing.start_train_py(
        workdir, log_path, f"--config.data_dir={tfds_dir}",
        f"--config.num_train_steps={NUM_STEPS}", "--config.log_every=1",
        f"--config.checkpoint_every={CHECKPOINT_EVERY}", f"--config.eval_every={NUM_STEPS}",
        cache_dir=cache_dir)
  return start


finish = testing.finish


@pytest.fixture(scope="module")
def uninterrupted(start, tmp_path_factory):
  """The run directory of the command run once, start to end."""
  tmp = tmp_path_factory.mktemp("uninterrupted")
  finish(start(str(tmp / "run"), tmp / "log"), tmp / "log")
  return str(tmp / "run")


def trajectory(workdir):
  """[(step, {key: value})] of metrics.jsonl, in order, without the timings."""
  return [(r["step"], {k: r[k] for k in COMPARED if k in r})
          for r in metrics_writer.read_rows(workdir)]


def assert_same_run(workdir, reference):
  rows = trajectory(workdir)
  assert [s for s, r in rows if "train/loss" in r] == list(range(1, NUM_STEPS + 1))
  assert rows == trajectory(reference)  # each step once, the same values, bit for bit
  assert checkpoint_steps(workdir) == checkpoint_steps(reference)
  assert not os.path.exists(os.path.join(workdir, run_lock.LOCK_FILE))


def training(workdir):
  """A condition for `testing.wait_for`: a step after the first is logged."""
  return lambda: len(metrics_writer.read_rows(workdir)) >= 2


def lines_starting(output, prefix):
  return [line for line in output.splitlines() if line.startswith(prefix)]


def truncate(path):
  """Cuts a file to half its size, as a full disk or a failing volume leaves it."""
  os.truncate(path, os.path.getsize(path) // 2)


# ---------------------------------------------------------------------------
# Ctrl-C.


@pytest.mark.slow
def test_ctrl_c_saves_exits_130_and_rerun_equals_uninterrupted_run(start, uninterrupted,
                                                                    tmp_path):
  workdir, log = str(tmp_path / "run"), tmp_path / "log"
  proc = start(workdir, log)
  testing.wait_for(proc, training(workdir), "a logged step", log)
  proc.send_signal(signal.SIGINT)
  output = finish(proc, log, returncode=130)
  stops = lines_starting(output, "Ctrl-C")
  assert len(stops) == 1, output[-3000:]
  step = checkpoint_steps(workdir)[-1]
  assert stops[0] == (f"Ctrl-C: saved a checkpoint at step {step} in {workdir}; "
                      "rerunning the same command resumes from it")
  assert 1 < step < NUM_STEPS, "the Ctrl-C came too late to test anything"
  assert "Traceback" not in output
  assert metrics_writer.read_rows(workdir)[-1]["step"] == step  # a save also logs
  assert not os.path.exists(os.path.join(workdir, run_lock.LOCK_FILE))

  output = finish(start(workdir, log), log)
  assert f"resumed from {workdir} at step {step}" in output
  assert_same_run(workdir, uninterrupted)


# The loop's signal handling alone: a first Ctrl-C is taken at the next step
# boundary; the second, during a save that takes its time, ends the process then.
_TWO_CTRL_C = r"""
import time
from attnscale.runtime import interrupts

with interrupts.Preemption(before_exit=lambda: print("lock released", flush=True)) as stop:
  print("looping", flush=True)
  while not stop.reached(1):
    time.sleep(0.01)
  print(f"saving (interrupted: {stop.interrupted})", flush=True)
  time.sleep(120)
"""


def test_second_ctrl_c_exits_at_once(tmp_path):
  log = tmp_path / "log"
  with open(log, "w") as out:
    proc = subprocess.Popen([sys.executable, "-c", _TWO_CTRL_C], cwd=testing.ROOT,
                            env=testing.subprocess_env(JAX_PLATFORMS="cpu"),
                            stdout=out, stderr=subprocess.STDOUT)
  testing.wait_for(proc, lambda: "looping" in log.read_text(), "the loop", log)
  proc.send_signal(signal.SIGINT)
  testing.wait_for(proc, lambda: "saving" in log.read_text(), "the first stop", log)
  proc.send_signal(signal.SIGINT)
  assert finish(proc, log, returncode=130, timeout_s=60).splitlines() == [
      "looping", "saving (interrupted: True)", SECOND_CTRL_C.strip(), "lock released"]


# A Ctrl-C during start-up, while XLA compiles on threads of its own: train.py and a
# packed sweep's pack exit 130 with one line and release their locks. Before
# cli.stop_after_early_ctrl_c (os._exit), interpreter finalisation under a compiling
# thread crashed (rc 134 or 139; a pack interrupted 11 s into its start-up did it
# too). The Ctrl-C is raised just after a run has taken its lock, a compilation
# running, so the test also sees the lock released.
_CTRL_C_WHILE_COMPILING = r"""
import contextlib, os, runpy, sys, threading, time
import jax, jax.numpy as jnp
from attnscale.runtime import rundir

def long_program(x):
  for i in range(300):
    x = jnp.tanh(x @ x.T) + jnp.sin(x) * i
  return x

the_lock = rundir.workdir_lock

@contextlib.contextmanager
def compiling_then_ctrl_c(workdir, *args, **kwargs):
  with the_lock(workdir, *args, **kwargs) as lock:
    assert os.path.exists(os.path.join(workdir, "LOCK"))
    threading.Thread(target=lambda: jax.jit(long_program).lower(jnp.ones((64, 64))).compile(),
                     daemon=True).start()
    time.sleep(0.5)
    raise KeyboardInterrupt
    yield lock  # never reached: it makes this a generator, as contextmanager needs

rundir.workdir_lock = compiling_then_ctrl_c
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("what", ["one run", "a pack"])
def test_ctrl_c_while_compiling_at_start_up_exits_130_cleanly(what, tmp_path):
  workdir, command = str(tmp_path / "run"), "train.py"
  if what == "one run":
    flags = ["--config=configs/shakespeare_char.py:preset=test", f"--workdir={workdir}"]
  else:
    flags = ["--runs=" + json.dumps([{"config": "configs/shakespeare_char.py:preset=test",
                                       "overrides": {}, "workdir": workdir}])]
  proc = subprocess.run([sys.executable, "-c", _CTRL_C_WHILE_COMPILING, command, *flags],
                        cwd=testing.ROOT, env=testing.subprocess_env(JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 130, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "Ctrl-C outside the training steps: stopped without saving; rerunning the same "
      "command resumes from the last checkpoint"), proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and "Fatal Python error" not in proc.stderr
  assert not os.path.exists(os.path.join(workdir, run_lock.LOCK_FILE))


# ---------------------------------------------------------------------------
# A damaged checkpoint.


@pytest.mark.slow
def test_damaged_newest_checkpoint_is_set_aside_and_rerun_equals_uninterrupted_run(
    start, uninterrupted, tmp_path, capsys):
  workdir, log = str(tmp_path / "run"), tmp_path / "log"
  shutil.copytree(uninterrupted, workdir)
  newest = os.path.join(workdir, "checkpoints", str(NUM_STEPS))
  truncate(os.path.join(newest, "default", "_sharding"))  # the file of the report
  damaged = testing.snapshot(newest)
  previous = NUM_STEPS - CHECKPOINT_EVERY

  # eval.py reads the parameters alone, which do not need the damaged file: it
  # evaluates the newest step. Nothing on disk changes.
  config = eval_lib.load_config(workdir)
  assert eval_lib.restore(config, workdir)[1] == NUM_STEPS
  assert capsys.readouterr().err == ""
  assert testing.snapshot(newest) == damaged
  # Damage that every read meets (the tree's metadata), in a copy: the newest
  # checkpoint that can be read; a --step that cannot be read fails, naming those
  # that can.
  other = str(tmp_path / "other")
  shutil.copytree(workdir, other)
  truncate(os.path.join(other, "checkpoints", str(NUM_STEPS), "default", "_METADATA"))
  assert eval_lib.restore(config, other)[1] == previous
  warnings = capsys.readouterr().err.splitlines()
  assert len(warnings) == 1 and warnings[0].startswith(
      f"warning: checkpoint {NUM_STEPS} in {other}/checkpoints cannot be read (") and (
      warnings[0].endswith(f"); evaluating step {previous}")), warnings
  with pytest.raises(ValueError) as info:
    eval_lib.restore(config, other, step=NUM_STEPS)
  message = str(info.value)
  assert message.startswith(f"--step={NUM_STEPS}: checkpoint {NUM_STEPS} in ") and (
      message.endswith(f"; steps that can be read: {CHECKPOINT_EVERY}, {previous}")), message

  # train.py: resumes from the previous checkpoint; the damaged one is kept, moved.
  output = finish(start(workdir, log), log)
  kept = os.path.join(workdir, ckpt.DAMAGED_DIR, str(NUM_STEPS))
  assert lines_starting(output, "warning:") == [
      f"warning: checkpoint {NUM_STEPS} in {workdir}/checkpoints cannot be read "
      f"(FAILED_PRECONDITION: Error reading local file \"{newest}/default/_sharding\": "
      f"Invalid JSON); resuming from step {previous}; the damaged files are kept in "
      f"{workdir}/{ckpt.DAMAGED_DIR}"]
  assert f"resumed from {workdir} at step {previous}" in output
  assert testing.snapshot(kept) == damaged  # nothing deleted, byte for byte
  assert_same_run(workdir, uninterrupted)


def test_no_checkpoint_that_can_be_read_is_one_line_and_touches_nothing(uninterrupted,
                                                                       tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(uninterrupted, workdir)
  for step in checkpoint_steps(workdir):  # the tree's metadata: every read needs it
    truncate(os.path.join(workdir, "checkpoints", str(step), "default", "_METADATA"))
  before = testing.snapshot(workdir)
  config = eval_lib.load_config(workdir)
  for run in (lambda: train_lib.train_and_evaluate(config, workdir),
              lambda: eval_lib.restore(config, workdir)):
    with pytest.raises(ValueError) as info:
      run()
    message = str(info.value)
    assert "\n" not in message and message.startswith(
        "no checkpoint can be read: checkpoints 300, 200, 100 in "), message
    assert "the run directory is left as it is" in message
    assert testing.snapshot(workdir) == before


def test_ctrl_c_while_the_last_checkpoint_is_written_keeps_it(tfds_dir, tmp_path,
                                                             monkeypatch):
  """A Ctrl-C just as a run ends (a sweep's time limit) lands while orbax writes the
  last checkpoint in its background thread. The loops (train.py's and a pack's) wait
  for that write under their Ctrl-C handler, so the run ends done with its last
  checkpoint whole; it used to exit mid-commit and lose it (the H100 sweep of
  2026-11-27)."""
  from attnscale.experiments import run_records
  from attnscale.runtime import checkpoints as ckpt
  from attnscale.runtime import packed
  from configs import shakespeare_char

  real_wait, calls = ckpt.Checkpoints.wait, []

  def wait_after_a_ctrl_c(self):
    calls.append(self)
    if len(calls) <= 2:  # one Ctrl-C a loop (train.py's, then the pack's first run)
      os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs
    real_wait(self)

  monkeypatch.setattr(ckpt.Checkpoints, "wait", wait_after_a_ctrl_c)
  configs = []
  for lr in (1e-3, 2e-3):
    config = shakespeare_char.get_config("preset=test")
    config.update_from_flattened_dict({"data_dir": tfds_dir, "learning_rate": lr,
                                       "num_train_steps": 4, "checkpoint_every": 4,
                                       "eval_every": 4})
    configs.append(config)
  one = str(tmp_path / "one")
  assert train_lib.train_and_evaluate(configs[0], one)["step"] == 4
  pack = [str(tmp_path / f"pack{k}") for k in range(2)]
  assert [r["status"] for r in packed.train_packed(configs, pack)] == ["done", "done"]
  assert len(calls) == 3
  for workdir in [one, *pack]:
    assert run_records.status(workdir, read_checkpoint=True) == "done", workdir


# ---------------------------------------------------------------------------
# Two processes on one run directory.


@pytest.mark.slow
def test_second_process_is_refused_and_the_first_finishes_untouched(start, uninterrupted,
                                                                    tmp_path):
  workdir = str(tmp_path / "run")
  first_log, second_log = tmp_path / "first", tmp_path / "second"
  first = start(workdir, first_log)
  try:
    testing.wait_for(first, training(workdir), "a logged step", first_log)
    first.send_signal(signal.SIGSTOP)  # alive and holding the lock, and nothing changes
    before = testing.snapshot(workdir)
    output = finish(start(workdir, second_log), second_log, returncode=1)
    assert output.strip().splitlines()[-1].startswith(
        f"error: --workdir {workdir} is in use by process {first.pid} on host "
        f"{socket.gethostname()} (since "), output[-3000:]
    assert testing.snapshot(workdir) == before
  finally:
    first.send_signal(signal.SIGCONT)
  finish(first, first_log)
  assert_same_run(workdir, uninterrupted)
  assert len(os.listdir(os.path.join(workdir, "tensorboard"))) == 1  # the first's only


# What a killed train.py leaves: the lock, taken by a process that is then SIGKILLed.
_HOLD_LOCK = r"""
import sys, time
from attnscale.runtime import run_lock

run_lock.RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_lock_of_a_killed_process_is_taken_over(tmp_path):
  log = tmp_path / "log"
  with open(log, "w") as out:
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(tmp_path)],
                              cwd=testing.ROOT, stdout=out, stderr=subprocess.STDOUT)
  testing.wait_for(holder, lambda: "locked" in log.read_text(), "the lock", log)
  try:
    with pytest.raises(run_lock.LockedError, match=f"in use by process {holder.pid} "):
      run_lock.RunLock(str(tmp_path)).acquire()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  notes = []
  with run_lock.RunLock(str(tmp_path), note=notes.append) as lock:
    assert run_lock.read(lock.path)["pid"] == os.getpid()
  assert len(notes) == 1 and notes[0].startswith(
      f"note: taking over {tmp_path}/LOCK from process {holder.pid} on host "
      f"{socket.gethostname()} (since "), notes
  assert notes[0].endswith("which is no longer running")
  assert not os.path.exists(lock.path)


def test_lock_from_another_host_is_reported_with_the_ways_out(tmp_path):
  path = tmp_path / run_lock.LOCK_FILE
  other = {"host": "tpu-worker-0", "pid": os.getpid(), "since": "2025-01-01 12:00:00"}
  path.write_text(json.dumps(other) + "\n")
  with pytest.raises(run_lock.LockedError) as info:
    run_lock.RunLock(str(tmp_path)).acquire()
  assert str(info.value) == (
      f"--workdir {tmp_path} is locked by process {os.getpid()} on host tpu-worker-0 "
      "(since 2025-01-01 12:00:00), which cannot be checked from here: if that run is "
      f"over, rerun with --force_lock or delete {path}")
  assert json.loads(path.read_text()) == other  # untouched
  notes = []
  with run_lock.RunLock(str(tmp_path), force=True, note=notes.append):
    assert run_lock.read(str(path))["host"] == socket.gethostname()
  assert notes == [f"note: --force_lock: taking over {path} from process {os.getpid()} on "
                   "host tpu-worker-0 (since 2025-01-01 12:00:00)"]
  assert not path.exists()


def test_lock_of_a_reused_pid_is_stale_and_an_unreadable_one_is_reported(tmp_path):
  path = tmp_path / run_lock.LOCK_FILE
  if run_lock.process_start(os.getpid()) is not None:  # Linux: pids are told apart
    # This process's pid, but a process that started at another time wrote it.
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                "pid_start": run_lock.process_start(os.getpid()) - 1}))
    notes = []
    with run_lock.RunLock(str(tmp_path), note=notes.append):
      pass
    assert len(notes) == 1 and notes[0].endswith("which is no longer running"), notes
  path.write_text("")  # torn, or made by hand
  with pytest.raises(run_lock.LockedError, match="holds an unreadable .*--force_lock"):
    run_lock.RunLock(str(tmp_path)).acquire()


# ---------------------------------------------------------------------------
# A sweep (attnscale/experiments/sweeps.py): Ctrl-C and a damaged final checkpoint.

# A sweep of long points in a process of its own; Ctrl-C reaches it alone (its points
# run in process groups of their own, as a terminal's Ctrl-C would find them).
_SWEEP = r"""
import sys
from attnscale.experiments import sweeps
workdir, data_dir, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
points = [sweeps.Point(f"preset=test,seed={seed}", (
    ("checkpoint_every", 100000), ("data_dir", data_dir), ("eval_every", 100000),
    ("log_every", 1), ("num_train_steps", 100000))) for seed in range(jobs)]
try:
  sweeps.run_sweep("configs/shakespeare_char.py", points, workdir, jobs=jobs)
except KeyboardInterrupt:
  print("sweep: KeyboardInterrupt", flush=True)
  sys.exit(130)
"""


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_of_a_sweep_reaches_its_running_points_which_save(tfds_dir, cache_dir, tmp_path,
                                                                 jobs):
  """One SIGINT to the sweep's process: each running train.py gets it once, saves a
  checkpoint at its step and exits 130; then the sweep raises KeyboardInterrupt.
  (It used to SIGKILL them: the steps since their last checkpoint were lost.)"""
  workdir, log = tmp_path / "sweep", tmp_path / "log"
  env = testing.subprocess_env(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  with open(log, "w") as out:
    proc = subprocess.Popen([sys.executable, "-c", _SWEEP, str(workdir), tfds_dir, str(jobs)],
                            cwd=testing.ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
  running = lambda: sorted(str(p) for p in workdir.iterdir()) if workdir.exists() else []
  testing.wait_for(proc, lambda: len(running()) == jobs and all(training(r)() for r in running()),
                   "a logged step in every point", log)
  runs = running()
  proc.send_signal(signal.SIGINT)
  output = finish(proc, log, returncode=130, timeout_s=120)
  assert "sweep: KeyboardInterrupt" in output
  saved = lines_starting(output, "Ctrl-C: saved a checkpoint at step")
  assert len(saved) == jobs, output[-3000:]
  for run in runs:
    step = checkpoint_steps(run)[-1]
    assert 1 < step < 100000 and f"Ctrl-C: saved a checkpoint at step {step} in {run}; " \
        "rerunning the same command resumes from it" in saved, output[-3000:]
    assert not os.path.exists(os.path.join(run, run_lock.LOCK_FILE))
    assert run_records.status(run) == "partial"


def test_sweep_status_reads_a_damaged_final_checkpoint_as_not_done(uninterrupted, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(uninterrupted, run)
  assert run_records.status(run) == "done"
  truncate(os.path.join(run, "checkpoints", str(NUM_STEPS), "default", "_sharding"))
  assert run_records.status(run) == "partial"  # a sweep reruns it: train.py sets it aside
  assert run_records.status(run, read_checkpoint=False) == "done"  # the step numbers alone
