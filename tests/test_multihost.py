"""Several JAX processes on one machine: train.py and eval.py as on a pod.

Two real processes (2 fake CPU devices each, gloo collectives, a coordinator on
a free localhost port) run the commands of docs/guides/pods-and-gpus.md's "Try it on
one machine before a pod" section, parsed from it, so the docs cannot drift from
what is tested.
They train like one process with the same global batch (losses within 1e-5),
write each checkpoint once, log from process 0 only, save one agreed step on a
SIGTERM to both and resume to the uninterrupted run's end, and evaluate the
whole validation split to the one-process eval.json.

The pieces (which rows each process feeds, a checkpoint of FSDP shards written by
both processes, one agreed preemption step) run in two small processes in about
10 s. The end-to-end tests are `slow`: each starts 2 to 4 train.py / eval.py
processes, which compile and start up side by side on a 2-core machine (about
150 CPU-seconds for the three, 1-1.5 minutes each on a loaded machine).

Needs $ATTNSCALE_DATA (CI sets it).
"""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from attnscale import testing
from attnscale.evaluation import eval_lib
from attnscale.experiments.run_records import checkpoint_steps
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import metrics_writer, provenance, train_lib
from attnscale.runtime import train_state as ts
from configs import shakespeare_char

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join("docs", "guides", "pods-and-gpus.md")
DOC_SECTION = "## Try it on one machine before a pod"
NUM_PROCESSES = 2
TIMEOUT_S = 300
# The small two-process tests: from the signal (or the start) to both exits. A
# process that hangs fails the test here, with every process's stacks in its log
# (testing.stop_with_stacks), instead of holding the suite.
STOP_TIMEOUT_S = 120


# ---------------------------------------------------------------------------
# The README's commands.


def readme_commands() -> dict[str, list[str]]:
  """{"train": argv, "eval": argv, "env": {...}} of the README section's bash block.

  The argv still holds `$i` (the process id) and the README's port.
  """
  with open(os.path.join(ROOT, DOC)) as f:
    text = f.read()
  section = text[text.index(DOC_SECTION):]
  block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
  lines = block.replace("\\\n", " ").splitlines()
  out = {"env": {}}
  for line in lines:
    line = line.strip()
    if line.startswith("export "):
      out["env"].update(item.split("=", 1) for item in shlex.split(line)[1:])
    for name in ("train", "eval"):
      if line.startswith(f"python {name}.py"):
        argv = shlex.split(line.rstrip("&").strip())
        out[name] = [sys.executable, *argv[1:]]
  assert {"train", "eval"} <= set(out) and out["env"], f"no commands in {DOC}: {block}"
  return out


COMMANDS = readme_commands()
WORKDIR = next(a.split("=", 1)[1] for a in COMMANDS["train"] if a.startswith("--workdir="))


def readme_env(**extra: str) -> dict[str, str]:
  """os.environ with the README's variables; its XLA_FLAGS are added to the
  tests' own (-O0, tests/conftest.py)."""
  readme = {k: v for k, v in COMMANDS["env"].items() if k != "XLA_FLAGS"}
  return testing.subprocess_env(COMMANDS["env"].get("XLA_FLAGS", "").split(),
                                **readme, **extra)


def config_overrides(argv) -> dict:
  """{"log_every": 1, ...} from the `--config.FIELD=VALUE` flags (ints) of argv."""
  return {a.split("=", 1)[0][len("--config."):]: int(a.split("=", 1)[1])
          for a in argv if a.startswith("--config.")}


OVERRIDES = config_overrides(COMMANDS["train"])


def readme_config(tfds_dir):
  """The config of the README's training command."""
  config = shakespeare_char.get_config("preset=test")
  config.data_dir = tfds_dir
  config.update_from_flattened_dict(OVERRIDES)
  return config


NUM_STEPS = readme_config(None).num_train_steps


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def process_argv(argv, process_id: int, port: int, workdir: str, extra=()) -> list[str]:
  """The README's argv for one process: its id, a free port, the test's workdir."""
  out = []
  for a in argv:
    a = a.replace("$i", str(process_id))
    a = re.sub(r"^--coordinator_address=localhost:\d+$",
               f"--coordinator_address=localhost:{port}", a)
    a = re.sub(r"^--workdir=.*", f"--workdir={workdir}", a)
    out.append(a)
  return out + list(extra)


class Processes:
  """NUM_PROCESSES processes of one README command, stdout/stderr to files."""

  def __init__(self, name, workdir, logdir, cache_dir, extra=()):
    port = free_port()
    # One XLA cache for every process of the module: the reruns compile nothing.
    env = readme_env(JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                     JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    self.logs = [(logdir / f"{name}.{i}.out", logdir / f"{name}.{i}.err")
                 for i in range(NUM_PROCESSES)]
    self.procs = []
    for i, (out, err) in enumerate(self.logs):
      with open(out, "w") as o, open(err, "w") as e:
        self.procs.append(subprocess.Popen(
            process_argv(COMMANDS[name], i, port, workdir, extra), cwd=ROOT, env=env,
            stdout=o, stderr=e))

  def stdout(self, i: int) -> str:
    return self.logs[i][0].read_text()

  def tails(self, chars: int = 1500) -> str:
    return "\n".join(f"--- process {i}:\n{out.read_text()[-1500:]}\n{err.read_text()[-chars:]}"
                     for i, (out, err) in enumerate(self.logs))

  def running(self) -> bool:
    return all(p.poll() is None for p in self.procs)

  def signal(self, signum) -> None:
    for p in self.procs:
      p.send_signal(signum)

  def wait(self) -> None:
    """Waits for all; asserts exit 0. If one fails (the others would wait for it)
    or time runs out, stops the rest with their stacks and fails with the logs."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
      while any(p.poll() is None for p in self.procs):
        failed = [p for p in self.procs if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
          testing.stop_with_stacks(self.procs)
          raise AssertionError(("a process failed" if failed else
                                f"not done after {TIMEOUT_S} s") + f"; stacks of those that "
                               f"were still running at the end of their logs:\n"
                               f"{self.tails(6000)}")
        time.sleep(0.05)
    finally:
      testing.stop_with_stacks(self.procs)
    assert [p.returncode for p in self.procs] == [0] * NUM_PROCESSES, self.tails()


# ---------------------------------------------------------------------------
# What the runs leave.


def train_rows(workdir):
  return [r for r in metrics_writer.read_rows(workdir) if "train/loss" in r]


def written_chunks(workdir, step):
  """{process: {chunk key: stored bytes}} of checkpoint `step`'s array data.

  Each process writes its shards into its own OCDBT database
  (`default/ocdbt.process_<i>`); tensorstore lists the keys (`<array>/<chunk>`)
  and reads the stored (compressed) values. Counting keys, not the files on disk,
  because how OCDBT batches its writes into data files and B-tree nodes depends
  on timing (on disk the same checkpoint measured 1.2x to 2.25x).
  """
  import tensorstore
  top = os.path.abspath(os.path.join(workdir, "checkpoints", str(step), "default"))
  chunks = {}
  for name in sorted(os.listdir(top)):
    if name.startswith("ocdbt.process_"):
      kv = tensorstore.KvStore.open({"driver": "ocdbt",
                                     "base": "file://" + os.path.join(top, name)}).result()
      keys = [k.decode() for k in kv.list().result()]
      chunks[name] = {k: len(kv.read(k).result().value) for k in keys
                      if not k.rsplit("/", 1)[-1].startswith((".z", "zarr."))}
  return chunks


def restore_state(workdir):
  """The latest checkpoint of `workdir`, restored here (1 process, 1 device)."""
  return testing.restore_checkpoint(eval_lib.load_config(workdir), workdir)


def progress_steps(stdout):
  return [int(m) for m in re.findall(r"^step (\d+)/\d+ \|", stdout, re.M)]


# Words of every line train.py and eval.py print (gloo's own connection notices,
# which each process prints, interleaved, have none of them).
OUR_WORDS = re.compile(r"step|loss|resumed|SIGTERM|params|devices|validation|sample|layer")


def assert_quiet(run: Processes):
  """Only process 0 printed anything of ours."""
  assert OUR_WORDS.search(run.stdout(0)), run.tails()
  for i in range(1, NUM_PROCESSES):
    assert not OUR_WORDS.search(run.stdout(i)), f"process {i} printed: {run.stdout(i)[:500]}"


def assert_only_process_0_logged(run: Processes, workdir, segments=1):
  assert_quiet(run)
  tb = os.listdir(os.path.join(workdir, "tensorboard"))
  assert len(tb) == segments, tb  # one event file per process-0 segment
  steps = [r["step"] for r in train_rows(workdir)]
  assert steps == list(range(1, NUM_STEPS + 1))  # each step logged once


def assert_trees_close(a, b, atol):
  paths, leaves_a = zip(*jax.tree_util.tree_leaves_with_path(a))
  leaves_b = jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for path, x, y in zip(paths, leaves_a, leaves_b):
    np.testing.assert_allclose(x, y, rtol=0, atol=atol, err_msg=jax.tree_util.keystr(path))


# ---------------------------------------------------------------------------
# Fixtures: one-process and two-process runs of the README's command.


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("xla_cache_multihost")


@pytest.fixture(scope="module")
def one_process(tfds_dir, tmp_path_factory):
  """The README's training command in one process (this one, 1 device)."""
  config = readme_config(tfds_dir)
  workdir = str(tmp_path_factory.mktemp("one_process"))
  train_lib.train_and_evaluate(config, workdir)
  return workdir


@pytest.fixture(scope="module")
def two_processes(tfds_dir, tmp_path_factory, cache_dir):
  """(workdir, Processes): the README's training command in two processes."""
  tmp = tmp_path_factory.mktemp("two_processes")
  workdir = str(tmp / "run")
  run = Processes("train", workdir, tmp, cache_dir, [f"--config.data_dir={tfds_dir}"])
  run.wait()
  return workdir, run


# ---------------------------------------------------------------------------
# The tests.


def test_readme_commands_are_two_processes_of_the_test_preset():
  train, evaluate = COMMANDS["train"], COMMANDS["eval"]
  for argv in (train, evaluate):
    assert "--multihost" in argv and f"--num_processes={NUM_PROCESSES}" in argv
    assert "--process_id=$i" in argv and f"--workdir={WORKDIR}" in argv
  assert "--config=configs/shakespeare_char.py:preset=test" in train
  assert COMMANDS["env"]["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
  assert OVERRIDES["log_every"] == 1  # the whole trajectory, step by step


@pytest.mark.slow
def test_two_processes_train_like_one(one_process, two_processes):
  workdir, run = two_processes
  assert "4 devices in 2 processes" in run.stdout(0)

  # The same global batch gives the same trajectory (float rounding apart).
  one, two = train_rows(one_process), train_rows(workdir)
  assert [r["step"] for r in two] == [r["step"] for r in one]
  for r1, r2 in zip(one, two):
    for key in ("train/loss", "train/grad_norm", "train/loss_last20"):
      assert r2[key] == pytest.approx(r1[key], abs=1e-5), (r1["step"], key)
  val = [[r["val/loss"] for r in metrics_writer.read_rows(w) if "val/loss" in r]
         for w in (one_process, workdir)]
  assert len(val[1]) == len(val[0]) == 2 and val[1] == pytest.approx(val[0], abs=1e-5)

  # One set of checkpoints, each written once: the same steps as one process,
  # the arrays' bytes split between the processes, not one copy from each.
  assert checkpoint_steps(workdir) == checkpoint_steps(one_process)
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "metrics.jsonl",
                                         "provenance.json", "tensorboard"]
  assert len(provenance.read(workdir)) == 1  # process 0's record of the one start
  two, one = written_chunks(workdir, NUM_STEPS), written_chunks(one_process, NUM_STEPS)
  assert len(two) == 2 and len(one) == 1, (list(two), list(one))
  keys = [k for process in two.values() for k in process]
  assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})
  arrays = lambda chunks: {k.rsplit("/", 1)[0] for process in chunks.values() for k in process}
  assert arrays(two) == arrays(one)
  # The stored bytes add up to one copy (shards compress a little differently).
  stored = lambda chunks: sum(sum(process.values()) for process in chunks.values())
  ratio = stored(two) / stored(one)
  assert 0.9 < ratio < 1.1, ratio
  assert_trees_close(restore_state(workdir), restore_state(one_process), atol=1e-5)

  assert progress_steps(run.stdout(0)) == list(range(1, NUM_STEPS + 1))
  assert_only_process_0_logged(run, workdir)


@pytest.mark.slow
def test_sigterm_to_both_then_rerun_equals_uninterrupted_run(tfds_dir, two_processes,
                                                            tmp_path, cache_dir):
  uninterrupted, _ = two_processes
  workdir = str(tmp_path / "run")
  extra = [f"--config.data_dir={tfds_dir}"]
  run = Processes("train", workdir, tmp_path, cache_dir, extra)
  try:
    # Once the first step has run: the other steps take about a second.
    deadline = time.monotonic() + TIMEOUT_S
    while "step 1: compiled" not in run.stdout(0):
      assert run.running() and time.monotonic() < deadline, run.tails()
      time.sleep(0.01)
    run.signal(signal.SIGTERM)
  finally:
    run.wait()
  saved = re.findall(r"SIGTERM: saved a checkpoint at step (\d+)", run.stdout(0))
  assert len(saved) == 1, run.tails()
  step = int(saved[0])
  assert 1 <= step < NUM_STEPS, step
  assert checkpoint_steps(workdir)[-1] == step
  assert train_rows(workdir)[-1]["step"] == step  # a save also logs

  (tmp_path / "rerun").mkdir()  # its own logs
  rerun = Processes("train", workdir, tmp_path / "rerun", cache_dir, extra)
  rerun.wait()
  assert f"resumed from {workdir} at step {step}" in rerun.stdout(0)

  # The same processes, programs and data: bit-for-bit the uninterrupted run.
  resumed, full = train_rows(workdir), train_rows(uninterrupted)
  for key in ("train/loss", "train/grad_norm", "train/loss_last20"):
    assert [r[key] for r in resumed] == [r[key] for r in full], key
  assert_trees_close(restore_state(workdir), restore_state(uninterrupted), atol=0)
  assert_only_process_0_logged(rerun, workdir, segments=2)


@pytest.mark.slow
def test_eval_in_two_processes_matches_one(one_process, tmp_path, cache_dir):
  # eval.py of the one-process run's checkpoint, in a copy (its own eval.json).
  workdir = str(tmp_path / "run")
  shutil.copytree(one_process, workdir)
  run = Processes("eval", workdir, tmp_path, cache_dir)
  run.wait()
  length = int(next(a for a in COMMANDS["eval"] if a.startswith("--length=")).split("=")[1])
  expected = eval_lib.evaluate_run(one_process, sample_length=length)
  with open(os.path.join(workdir, "eval.json")) as f:
    got = json.load(f)

  assert got["val_tokens"] == expected["val_tokens"]  # the whole split, every target once
  assert got["step"] == expected["step"] and got["sample"] == expected["sample"]
  for key in ("val_loss", "bits_per_char"):
    assert got[key] == pytest.approx(expected[key], abs=1e-5), key
  assert_trees_close(got["attention"], expected["attention"], atol=1e-5)
  assert "validation loss" in run.stdout(0)
  assert_quiet(run)


# The pieces, in two small processes (no train.py): which rows each process's
# devices hold, a checkpoint of FSDP-sharded arrays written by both, and a
# SIGTERM or a Ctrl-C to one process stopping both at the same step.
_PIECES = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
process_id, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
import ml_collections
from jax.experimental import multihost_utils
from attnscale.runtime import checkpoints as ckpt, interrupts, steps, train_state as ts

# fsdp over all 4 devices of both processes; the batch over them too.
mesh = ts.make_mesh(ml_collections.ConfigDict({"mesh": {"data": 1, "fsdp": -1}}))
rows_GxC = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
b = 8 // jax.process_count()
batch = steps.global_batch({"x": rows_GxC[process_id * b:(process_id + 1) * b]},
                           ts.batch_sharding(mesh))
gathered_GxC = multihost_utils.process_allgather(batch["x"], tiled=True)

abstract = {"w": jax.ShapeDtypeStruct((6, 4), jnp.float32),
            "g": jax.ShapeDtypeStruct((6,), jnp.float32)}
shardings = ts.state_shardings(abstract, mesh)
state = jax.jit(lambda: {"w": jnp.arange(24.0).reshape(6, 4), "g": jnp.ones(6)},
                out_shardings=shardings)()
checkpoints = ckpt.Checkpoints(workdir, keep=1)
checkpoints.save(7, state)
checkpoints.close()

with interrupts.Preemption() as preemption:
  # Said once the handlers are in place: a signal the test sends on reading it
  # must find them (before, a Ctrl-C was Python's KeyboardInterrupt and process 1
  # died alone, leaving process 0 at its sync point until the test's limit).
  print("looping", flush=True)
  step = 0
  while not preemption.reached(step := step + 1):
    time.sleep(0.01)
print(json.dumps({"rows_in_place": bool((gathered_GxC == rows_GxC).all()),
                  "w_spec": list(shardings["w"].spec), "g_spec": list(shardings["g"].spec),
                  "local_w_shards": len(state["w"].addressable_shards),
                  "preempted_at": step, "interrupted": preemption.interrupted}), flush=True)
"""


# A Ctrl-C to one process stops both at one step, as a SIGTERM does (it becomes one).
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl_c"])
def test_two_processes_rows_checkpoint_and_preemption(tmp_path, signum):
  port, workdir = free_port(), str(tmp_path / "run")
  env = readme_env()
  logs = [tmp_path / f"{i}.out" for i in range(NUM_PROCESSES)]
  procs = []
  for i, log in enumerate(logs):
    with open(log, "w") as out:
      procs.append(subprocess.Popen(
          [sys.executable, "-c", _PIECES, str(i), str(port), workdir], cwd=ROOT, env=env,
          stdout=out, stderr=subprocess.STDOUT))
  describe = lambda: "\n".join(f"--- process {i}:\n{log.read_text()[-6000:]}"
                               for i, log in enumerate(logs))
  try:
    deadline = time.monotonic() + TIMEOUT_S
    while not all("looping" in log.read_text() for log in logs):
      if not all(p.poll() is None for p in procs) or time.monotonic() > deadline:
        testing.stop_with_stacks(procs)
        raise AssertionError(f"not both looping:\n{describe()}")
      time.sleep(0.05)
    procs[1].send_signal(signum)  # one process only: both must stop
    testing.wait_all(procs, STOP_TIMEOUT_S, describe)
  finally:
    testing.stop_with_stacks(procs)
  assert [p.returncode for p in procs] == [0, 0], describe()
  reports = [json.loads(log.read_text().strip().splitlines()[-1]) for log in logs]
  for report in reports:
    assert report["rows_in_place"]  # process p's rows are global rows [p b, (p + 1) b)
    assert report["w_spec"] == [None, "fsdp"]  # 4 devices split 4, not 6
    assert report["g_spec"] == []  # vectors stay replicated
    assert report["local_w_shards"] == 2
  assert reports[0]["preempted_at"] == reports[1]["preempted_at"] > 1
  assert [r["interrupted"] for r in reports] == [False, signum == signal.SIGINT]

  # Both processes' shards make one checkpoint, which restores here on 1 device.
  mesh = ts.make_mesh()
  template = {"w": jax.numpy.zeros((6, 4)), "g": jax.numpy.zeros(6)}
  checkpoints = ckpt.Checkpoints(workdir, keep=1)
  try:
    restored = jax.device_get(checkpoints.restore(
        template, ts.state_shardings(template, mesh)))
  finally:
    checkpoints.close()
  np.testing.assert_array_equal(restored["w"], np.arange(24.0).reshape(6, 4))
  np.testing.assert_array_equal(restored["g"], np.ones(6))


# Checkpoints 5 and 7 written by both processes; step 7 then fails to read in the
# processes named by argv[4] (a read that raises, as a truncated file does), then
# both look for the newest checkpoint they can read.
_SOME_CANNOT_READ = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
process_id, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cannot = [int(i) for i in sys.argv[4].split(",")]
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
import ml_collections
from attnscale.runtime import checkpoints as ckpt, train_state as ts

mesh = ts.make_mesh(ml_collections.ConfigDict({"mesh": {"data": 1, "fsdp": -1}}))
abstract = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}
shardings = ts.state_shardings(abstract, mesh)
checkpoints = ckpt.Checkpoints(workdir, keep=2)
for step in (5, 7):
  checkpoints.save(step, jax.jit(lambda s=step: {"w": jnp.full((8, 4), float(s))},
                                 out_shardings=shardings)())
checkpoints.manager.wait_until_finished()
if process_id in cannot:
  restore = ckpt.Checkpoints.restore
  def restore_but_7(self, state, shardings, step=None, **kwargs):
    if step == 7:
      raise ckpt.DamagedCheckpointError(self.directory, 7, "simulated")
    return restore(self, state, shardings, step, **kwargs)
  ckpt.Checkpoints.restore = restore_but_7
try:
  state, step, damaged = checkpoints.restore_newest_intact(abstract, shardings)
  shard = np.asarray(state["w"].addressable_shards[0].data)
  out = {"step": step, "damaged": [e.step for e in damaged], "w": float(shard.mean())}
except ValueError as e:
  out = {"error": str(e)}
checkpoints.close()
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("cannot", ["1", "0,1"], ids=["one_process", "every_process"])
def test_a_checkpoint_some_processes_cannot_read(tmp_path, cannot):
  """Every process ends within seconds, none at orbax's barrier after a read (which a
  process whose read failed never reaches): a step that no process reads is
  damaged and both take the previous one; a step that only some read stops
  both with one line."""
  port, workdir = free_port(), str(tmp_path / "run")
  logs = [tmp_path / f"{i}.out" for i in range(NUM_PROCESSES)]
  procs = []
  for i, log in enumerate(logs):
    with open(log, "w") as out:
      procs.append(subprocess.Popen(
          [sys.executable, "-c", _SOME_CANNOT_READ, str(i), str(port), workdir, cannot],
          cwd=ROOT, env=readme_env(), stdout=out, stderr=subprocess.STDOUT))
  describe = lambda: "\n".join(f"--- process {i}:\n{log.read_text()[-6000:]}"
                               for i, log in enumerate(logs))
  try:
    testing.wait_all(procs, STOP_TIMEOUT_S, describe)
  finally:
    testing.stop_with_stacks(procs)
  assert [p.returncode for p in procs] == [0, 0], describe()
  reports = [json.loads(log.read_text().strip().splitlines()[-1]) for log in logs]
  if cannot == "0,1":
    assert reports == [{"step": 5, "damaged": [7], "w": 5.0}] * 2
    return
  directory = os.path.join(workdir, "checkpoints")
  assert reports == [
      {"error": f"checkpoint 7 in {directory} cannot be read by process 1 of 2 but can by "
                "the others: do all processes see the same --workdir? Nothing was changed"},
      {"error": f"checkpoint 7 in {directory} cannot be read by process 1 of 2 (simulated) "
                "but can by the others: do all processes see the same --workdir? Nothing "
                "was changed"}]
  assert checkpoint_steps(workdir) == [5, 7]


def test_process_flags_need_multihost(tmp_path):
  proc = subprocess.run(
      [sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=test",
       f"--workdir={tmp_path / 'run'}", "--process_id=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines() == ["error: --process_id needs --multihost"]
  assert not (tmp_path / "run").exists()
