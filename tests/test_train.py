"""End-to-end training on the `test` preset, through what train.py calls.

Loss goes down and the workdir holds config, metrics, TensorBoard events and
checkpoints; a stopped run resumes bit-for-bit; 8 fake CPU devices match 1;
every scaling trains; bad configs fail at start without touching the workdir;
a NaN stops the run and keeps the last good checkpoint; a golden one-step loss;
SIGTERM saves and exits cleanly.

Needs $ATTNSCALE_DATA (CI sets it); nothing touches the network.
"""

import glob
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from attnscale import tasks, testing
from attnscale.core import scalings
from attnscale.experiments.run_records import checkpoint_steps
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import loop, run_summary, train_lib
from configs import shakespeare_char

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_STEPS = 20  # the test preset's num_train_steps
LN_VOCAB = math.log(65)  # the loss of a uniform prediction: where training starts


# ---------------------------------------------------------------------------
# Fixtures and helpers.


# A persistent XLA cache for this module (conftest): reruns of one config compile once.


def make_config(tfds_dir, arg="preset=test", **overrides):
  """The test preset with `overrides` ("model.x" keys reach config.model)."""
  config = shakespeare_char.get_config(arg)
  config.data_dir = tfds_dir
  config.update_from_flattened_dict(overrides)
  return config


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def train_losses(workdir):
  """{step: train/loss} from metrics.jsonl."""
  return {m["step"]: m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m}


restore = testing.restore_checkpoint


def assert_states_equal(a, b):
  paths_a, leaves_a = zip(*jax.tree_util.tree_leaves_with_path(a))
  paths_b, leaves_b = zip(*jax.tree_util.tree_leaves_with_path(b))
  assert paths_a == paths_b
  for path, x, y in zip(paths_a, leaves_a, leaves_b):
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


snapshot = testing.snapshot


def _crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
  return crc ^ 0xFFFFFFFF


def _masked_crc32c(data: bytes) -> int:
  crc = _crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_tb_scalars(logdir):
  """{tag: {step: value}} from TFRecord event files, CRCs checked.

  Parsed by hand (the `tensorboard` package is not a dependency): each record
  is an 8-byte length, its masked CRC-32C, the payload, the payload's CRC.
  """
  scalars = {}
  files = glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)
  assert files, f"no event file under {logdir}"
  for path in files:
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      header = data[pos:pos + 8]
      (length,) = struct.unpack("<Q", header)
      (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
      payload = data[pos + 12:pos + 12 + length]
      (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
      assert header_crc == _masked_crc32c(header), f"bad length CRC in {path}"
      assert payload_crc == _masked_crc32c(payload), f"bad payload CRC in {path}"
      pos += 16 + length
      event = event_pb2.Event.FromString(payload)
      for value in event.summary.value:
        scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


def test_crc32c_reference_value():
  assert _crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)


@pytest.fixture(scope="module")
def run_a(tfds_dir, tmp_path_factory):
  """An uninterrupted test-preset run, a loss logged at every step."""
  config = make_config(tfds_dir, log_every=1)
  workdir = str(tmp_path_factory.mktemp("run_a"))
  result = train_lib.train_and_evaluate(config, workdir)
  return config, workdir, result


# ---------------------------------------------------------------------------
# 1. A run learns and leaves config, metrics, TensorBoard events and checkpoints.


def test_loss_goes_down_and_workdir_holds_outputs(run_a):
  config, workdir, result = run_a
  assert set(result) == {"step", "loss", "grad_norm", "lr", "steps_per_s", "tokens_per_s",
                         "val_loss", "loss_last20", "elapsed_s"}
  assert result["step"] == NUM_STEPS
  losses = train_losses(workdir)
  assert sorted(losses) == list(range(1, NUM_STEPS + 1))  # one line per log step
  assert losses[1] == pytest.approx(LN_VOCAB, abs=0.05)  # uniform at init
  assert result["loss"] == losses[NUM_STEPS]
  assert result["loss"] < LN_VOCAB - 0.5, losses
  assert result["loss_last20"] == pytest.approx(np.mean([losses[s] for s in range(1, 21)]))
  assert 0 < result["elapsed_s"] < 600
  assert math.isfinite(result["val_loss"]) and result["val_loss"] < LN_VOCAB - 0.4

  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f) == json.loads(config.to_json())

  metrics = read_metrics(workdir)
  assert all(isinstance(m, dict) and isinstance(m["step"], int) for m in metrics)
  val = {m["step"]: m["val/loss"] for m in metrics if "val/loss" in m}
  assert sorted(val) == [10, 20] and val[20] == result["val_loss"]

  tb = read_tb_scalars(os.path.join(workdir, "tensorboard"))
  assert sorted(tb["train/loss"]) == sorted(losses)
  for step, loss in losses.items():
    assert tb["train/loss"][step] == pytest.approx(loss, rel=1e-6)  # float32 in the event
  assert tb["val/loss"][20] == pytest.approx(result["val_loss"], rel=1e-6)

  assert checkpoint_steps(workdir) == [10, 20]
  checkpoints = ckpt.Checkpoints(workdir, config.keep_checkpoints)
  assert checkpoints.latest_step() == 20
  checkpoints.close()
  state = restore(config, workdir)
  assert int(state["step"]) == NUM_STEPS
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state["params"]))


# ---------------------------------------------------------------------------
# 2. Stop at step k, resume: bit-for-bit the uninterrupted run (on CPU).

STOP_AT = 7  # not an eval or checkpoint step of the preset


def test_stop_and_resume_equals_uninterrupted_run(run_a, tmp_path, monkeypatch):
  config, workdir_a, _ = run_a
  workdir_b = str(tmp_path / "run_b")
  train_batch = tasks.CharLMTask.train_batch

  def train_batch_then_preempt(self, step):
    # A preemption at step k, as the cluster would send it: train_and_evaluate
    # saves at the next step boundary and returns. Without its handler SIGTERM
    # would kill pytest itself, so check that one is installed.
    if step == STOP_AT - 1:
      handler = signal.getsignal(signal.SIGTERM)
      assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None), "no SIGTERM handler"
      os.kill(os.getpid(), signal.SIGTERM)
    return train_batch(self, step)

  with monkeypatch.context() as m:
    m.setattr(tasks.CharLMTask, "train_batch", train_batch_then_preempt)
    stopped = train_lib.train_and_evaluate(config, workdir_b)
  assert stopped["step"] == STOP_AT
  assert checkpoint_steps(workdir_b) == [STOP_AT]

  resumed = train_lib.train_and_evaluate(config, workdir_b)
  assert resumed["step"] == NUM_STEPS
  assert_states_equal(restore(config, workdir_a), restore(config, workdir_b))
  losses_a, losses_b = train_losses(workdir_a), train_losses(workdir_b)
  assert sorted(losses_b) == list(range(1, NUM_STEPS + 1))  # no step lost or repeated
  assert losses_b == losses_a  # exactly, before and after the stop


def test_more_steps_on_resume_refused_under_cosine(run_a, tmp_path):
  # num_train_steps is the cosine decay length: changing it on resume would
  # silently follow neither schedule, so it is refused (and nothing is touched).
  config, _, _ = run_a
  workdir_b = str(tmp_path / "run_b")
  train_lib.train_and_evaluate(make_config(config.data_dir, log_every=1,
                                           num_train_steps=STOP_AT), workdir_b)
  before = snapshot(workdir_b)
  expect_one_line_error(lambda: train_lib.train_and_evaluate(config, workdir_b),
                        "num_train_steps")
  assert snapshot(workdir_b) == before


def test_more_steps_on_resume_under_constant_lr_equals_uninterrupted_run(run_a, tmp_path):
  config, _, _ = run_a
  constant = dict(log_every=1, lr_schedule="constant", warmup_steps=0)
  workdir_a, workdir_b = str(tmp_path / "run_a"), str(tmp_path / "run_b")
  train_lib.train_and_evaluate(make_config(config.data_dir, **constant), workdir_a)
  train_lib.train_and_evaluate(make_config(config.data_dir, num_train_steps=STOP_AT,
                                           **constant), workdir_b)
  full = make_config(config.data_dir, **constant)
  train_lib.train_and_evaluate(full, workdir_b)  # extends the run to NUM_STEPS
  assert train_losses(workdir_b) == train_losses(workdir_a)
  assert_states_equal(restore(full, workdir_a), restore(full, workdir_b))


# ---------------------------------------------------------------------------
# 3. Data parallel: 8 fake CPU devices give the 1-device losses.

_EIGHT_DEVICES = """
import json, os, sys
import jax
from attnscale.runtime import train_lib
from configs import shakespeare_char

overrides, workdir = json.loads(sys.argv[1]), sys.argv[2]
assert jax.device_count() == 8, jax.devices()
config = shakespeare_char.get_config("preset=test")
config.update_from_flattened_dict(overrides)
train_lib.train_and_evaluate(config, workdir)

def listing(path):
  return sorted((root, sorted(files)) for root, _, files in os.walk(path))

def error_of(workdir):
  try:
    train_lib.train_and_evaluate(config, workdir)
  except ValueError as e:
    return str(e)

config.batch_size = 12  # not divisible by 8
before = listing(workdir)
errors = [error_of(workdir), error_of(workdir + "_fresh")]
print(json.dumps({"device_count": jax.device_count(), "batch_errors": errors,
                  "workdir_unchanged": listing(workdir) == before,
                  "fresh_created": os.path.exists(workdir + "_fresh")}))
"""


def test_eight_devices_match_one_device(run_a, tmp_path):
  config, workdir_a, _ = run_a
  workdir = str(tmp_path / "run_8")
  env = testing.cpu_devices_env(8)
  overrides = {"log_every": 1, "data_dir": config.data_dir}
  proc = subprocess.run([sys.executable, "-c", _EIGHT_DEVICES, json.dumps(overrides), workdir],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["device_count"] == 8
  assert "8 devices" in proc.stdout

  one, eight = read_metrics(workdir_a), read_metrics(workdir)
  assert [sorted(m) for m in one] == [sorted(m) for m in eight]
  for m1, m8 in zip(one, eight):
    for key in ("train/loss", "train/grad_norm", "val/loss"):
      if key in m1:
        assert m8[key] == pytest.approx(m1[key], abs=1e-5), (m1["step"], key)

  # Validation knows the device count: a batch that does not split fails at
  # start, in a workdir with checkpoints as in a fresh one.
  for error in report["batch_errors"]:
    assert error and "config.batch_size" in error and "\n" not in error, error
  assert report["workdir_unchanged"] and not report["fresh_created"]


# ---------------------------------------------------------------------------
# 4. Every scaling (and the model options) trains without NaN.

MODEL_OPTIONS = {
    "qk_layernorm_standard": {"model.qk_norm": "layernorm"},
    "qk_rmsnorm_standard": {"model.qk_norm": "rmsnorm"},
    "shared_kv": {"model.shared_kv": True},
    "sigmoid": {"model.normalizer": "sigmoid"},
    "mqa": {"model.num_kv_heads": 1},
    "differential": {"model.differential": True},
    "selective": {"model.selective": True},
    "bf16_compute": {"model.dtype": "bfloat16"},
    "unit_variant_bf16": {"model.variant": "unit", "model.dtype": "bfloat16"},
    "unit_variant_2023_rule": {"model.variant": "unit", "model.unit.residual_rule": "2023"},
}
# The README's command trains three of them (the seeds' standard, cosine and the
# unit-scaled model); the rest are `heavy`, in CI's own leg (docs/development.md).
SMOKE_DEFAULT = ("standard", "cosine", "unit_scaled")
SMOKE_CASES = [pytest.param(*p.values, id=p.id,
                            marks=() if p.id in SMOKE_DEFAULT else pytest.mark.heavy)
               for p in ([pytest.param(f"scaling={name}", {}, id=name)
                          for name in scalings.names()] +
                         [pytest.param("scaling=standard", o, id=i)
                          for i, o in MODEL_OPTIONS.items()] +
                         [pytest.param("scaling=key_norm_power,p=0.5", {},
                                       id="key_norm_power_half")])]


@pytest.mark.parametrize("arg, overrides", SMOKE_CASES)
def test_trains_without_nan(tfds_dir, tmp_path, arg, overrides):
  config = make_config(tfds_dir, f"preset=test,{arg}", num_train_steps=3, eval_batches=1,
                       **overrides)
  result = train_lib.train_and_evaluate(config, str(tmp_path))
  assert result["step"] == 3
  for key in ("loss", "grad_norm", "val_loss"):
    assert math.isfinite(result[key]), (key, result)
  assert result["loss"] < LN_VOCAB + 0.5


# ---------------------------------------------------------------------------
# 5, 6. Bad configs and other experiments fail at start and touch nothing.

BAD_VALUES = {  # id: (config argument, overrides, the field the message must name)
    "unknown_scaling": ("preset=test,scaling=bogus", {}, "model.scaling"),
    "seq_len_over_block_size": ("preset=test", {"seq_len": 64}, "config.seq_len"),
    "negative_learning_rate": ("preset=test", {"learning_rate": -1e-3},
                               "config.learning_rate"),
    "zero_learning_rate": ("preset=test", {"learning_rate": 0.0}, "config.learning_rate"),
    "unknown_optimizer": ("preset=test", {"optimizer": "sgd"}, "config.optimizer"),
    "heads_not_dividing_width": ("preset=test", {"model.num_heads": 3}, "model.num_heads"),
    "unknown_normalizer": ("preset=test", {"model.normalizer": "softmin"}, "model.normalizer"),
    "unknown_dtype": ("preset=test", {"model.dtype": "float64"}, "model.dtype"),
}
LATE_BAD_VALUES = {  # need the data (vocab) or the scaling's factory: still before the workdir
    "vocab_size_mismatch": ("preset=test", {"model.vocab_size": 64}, "model.vocab_size"),
    "unknown_scaling_param": ("preset=test", {"model.scaling_params": {"bogus": 1.0}},
                              "bogus"),
}


def expect_one_line_error(fn, field):
  with pytest.raises(ValueError) as info:
    fn()
  message = str(info.value)
  assert field in message and "\n" not in message, message
  return message


@pytest.mark.parametrize("arg, overrides, field",
                         [pytest.param(*v, id=k) for k, v in BAD_VALUES.items()] +
                         [pytest.param(*v, id=k) for k, v in LATE_BAD_VALUES.items()])
def test_bad_value_fails_at_start_and_touches_nothing(run_a, tfds_dir, tmp_path, arg,
                                                      overrides, field):
  _, existing, _ = run_a
  config = make_config(tfds_dir, arg, **overrides)
  before = snapshot(existing)
  expect_one_line_error(lambda: train_lib.train_and_evaluate(config, existing), field)
  assert snapshot(existing) == before  # byte-identical, checkpoints and all
  fresh = str(tmp_path / "fresh")
  expect_one_line_error(lambda: train_lib.train_and_evaluate(config, fresh), field)
  assert not os.path.exists(fresh)


def test_unknown_preset_fails_in_get_config():
  expect_one_line_error(lambda: shakespeare_char.get_config("preset=bogus"), "preset")
  expect_one_line_error(lambda: shakespeare_char.get_config("preset=test,size=2"), "size")


def run_train_py(*args):
  return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)


def test_train_py_bad_value_exits_with_one_line_error(run_a):
  config, existing, _ = run_a
  before = snapshot(existing)
  proc = run_train_py("--config=configs/shakespeare_char.py:preset=test,scaling=bogus",
                      f"--workdir={existing}", f"--config.data_dir={config.data_dir}")
  assert proc.returncode != 0
  last_line = proc.stderr.strip().splitlines()[-1]
  assert last_line.startswith("error:") and "model.scaling" in last_line, proc.stderr
  assert snapshot(existing) == before


def test_train_py_ends_with_a_summary_for_a_person(tfds_dir, tmp_path):
  """The last lines: steps and time, the final training loss (mean of the last 20
  steps), the last validation loss, where the files are, and the eval command."""
  workdir = str(tmp_path / "run")
  proc = run_train_py("--config=configs/shakespeare_char.py:preset=test",
                      f"--workdir={workdir}", f"--config.data_dir={tfds_dir}",
                      "--config.num_train_steps=3", "--config.log_every=1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = read_metrics(workdir)
  last20 = [r["train/loss_last20"] for r in rows if "train/loss_last20" in r][-1]
  val = [r["val/loss"] for r in rows if "val/loss" in r][-1]
  tail = proc.stdout.strip().splitlines()[-5:]
  assert re.fullmatch(r"done: 3 steps, \d+ s \(this start\), \d+ s of training in all",
                      tail[0]), tail
  assert tail[1] == f"  final training loss {last20:.4f} (mean of the last 20 steps, step 3)"
  assert tail[2].startswith(f"  last validation loss {val:.4f} (step 3, "), tail
  assert tail[3].startswith(f"  run files: {workdir} ("), tail
  assert tail[4] == f"  evaluate the whole split: python eval.py --workdir={workdir}"
  # Every progress line after the compiling step: the time so far and the time left.
  progress = [line for line in proc.stdout.splitlines() if line.startswith("step ")
              and "| loss" in line]
  assert re.search(r" \| \d+ s elapsed$", progress[0]), progress  # step 1: no rate yet
  assert re.search(r" steps/s \| [\d.]+k tok/s \| \d+ s elapsed, \d+ s left$",
                   progress[1]), progress
  assert re.search(r" \| \d+ s elapsed$", progress[-1]), progress  # nothing left


def test_the_summary_names_the_command_that_trained():
  """After train.py the repository's eval.py, as the user typed its folder; after the
  console command (or anything else) attnscale-eval, which runs from any folder."""
  assert run_summary.eval_command("train.py") == "python eval.py"
  assert run_summary.eval_command(os.path.join(ROOT, "train.py")) == (
      f"python {os.path.join(ROOT, 'eval.py')}")
  assert run_summary.eval_command("/usr/local/bin/attnscale-train") == "attnscale-eval"
  assert run_summary.eval_command(os.path.join(ROOT, "attnscale", "commands", "train.py")) == (
      "attnscale-eval")


def test_a_stopped_run_s_summary_says_the_time_left(tmp_path):
  testing.fake_run(tmp_path, "run", "preset=test", {}, [
      {"step": 10, "train/loss_last20": 2.0, "train/elapsed_s": 30.0,
       "train/steps_per_s": 0.5}], done=False)
  first = run_summary.lines(str(tmp_path / "run"), wall_s=31, num_train_steps=70)[0]
  assert first == ("stopped at step 10 of 70, 31 s (this start), about 2 min 0 s left at "
                   "0.50 steps/s: the same command resumes it"), first


def test_train_py_unknown_preset_exits_with_one_line_error(tmp_path):
  fresh = str(tmp_path / "fresh")
  proc = run_train_py("--config=configs/shakespeare_char.py:preset=bogus",
                      f"--workdir={fresh}")
  assert proc.returncode != 0
  assert not os.path.exists(fresh)
  last_line = proc.stderr.strip().splitlines()[-1]
  assert last_line.startswith("error:") and "preset" in last_line, proc.stderr


@pytest.mark.parametrize("arg, overrides, field", [
    pytest.param("preset=test,scaling=key_norm_sum", {}, "model.scaling", id="scaling"),
    pytest.param("preset=test,seed=1", {}, "seed", id="seed"),
    pytest.param("preset=test", {"learning_rate": 1e-3}, "learning_rate", id="lr"),
])
def test_resuming_another_experiment_fails(run_a, tfds_dir, arg, overrides, field):
  config, existing, _ = run_a
  other = make_config(tfds_dir, arg, log_every=1, **overrides)
  before = snapshot(existing)
  message = expect_one_line_error(lambda: train_lib.train_and_evaluate(other, existing),
                                  field)
  assert "different config" in message
  assert snapshot(existing) == before


# ---------------------------------------------------------------------------
# 7. A NaN stops the run; the last good checkpoint stays.


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tfds_dir, tmp_path):
  # lr(step 0) = 0 (warm-up), lr(1) = 5e29: steps 1 and 2 see the initial
  # params, the update of step 2 makes them ~1e29, and step 3's forward pass
  # overflows float32. The NaN at step 3 is only read at step 4, the next save:
  # that save must not happen. The overflow is flax's LayerNorm's (its mean of
  # squares); the native kernel's centred statistics stay finite a step longer.
  config = make_config(tfds_dir, learning_rate=1e30, checkpoint_every=2, log_every=5,
                       **{"model.layernorm_impl": "xla"})
  workdir = str(tmp_path)
  with pytest.raises(loop.NonFiniteLossError) as info:
    train_lib.train_and_evaluate(config, workdir)
  message = str(info.value)
  assert "at step 3" in message, message
  assert "last good checkpoint (step 2)" in message and workdir in message, message
  assert "\n" not in message
  assert checkpoint_steps(workdir) == [2]
  state = restore(config, workdir)
  assert int(state["step"]) == 2
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state))
  # The save at step 2 logged steps 1-2; then only the bad step, on record, so
  # that a sweep reads the run as diverged (a rerun resumes at 2 and drops it).
  losses = train_losses(workdir)
  assert sorted(losses) == [2, 3] and not np.isfinite(losses[3])
  assert all(m["step"] <= 3 for m in read_metrics(workdir))
  from attnscale.experiments import run_records
  assert run_records.read_run(workdir)["status"] == "diverged"


# ---------------------------------------------------------------------------
# 8. Golden metrics after one step.

# The test preset, seed 0, scaling standard, CPU, on each CPU kernel set
# (model.attention_impl and model.layernorm_impl): "xla" pins today's values (XLA's
# attention, flax's LayerNorm), "native" its twin (both native kernels). The step's
# learning rate is 0 (warm-up), so these pin init, data and loss; step 2 pins the
# first update (optimizer, schedule, dropout) too.
GOLDEN_ONE_STEP = {"loss": 4.16920, "grad_norm": 0.78324, "val_loss": 4.17722}
GOLDEN_STEP_2_LOSS = 4.17656
# The native kernel's: equal to the XLA kernel's to 5 decimals (measured 2026-12-01).
GOLDEN_ONE_STEP_NATIVE = {"loss": 4.16920, "grad_norm": 0.78324, "val_loss": 4.17722}
GOLDEN_STEP_2_LOSS_NATIVE = 4.17656
GOLDEN = {"xla": (GOLDEN_ONE_STEP, GOLDEN_STEP_2_LOSS),
          "native": (GOLDEN_ONE_STEP_NATIVE, GOLDEN_STEP_2_LOSS_NATIVE)}
GOLDEN_MESSAGE = ("update this golden value only if the change to the "
                  "model/data/optimizer was intended")


@pytest.mark.parametrize("impl", list(GOLDEN))
def test_golden_loss_after_one_step(impl, tfds_dir, tmp_path):
  if impl == "native":
    from attnscale.core import cpu_kernel
    if jax.default_backend() != "cpu" or not cpu_kernel.available():
      pytest.skip("the native CPU kernel did not build here")
  golden_one_step, golden_step_2 = GOLDEN[impl]
  kernels = {"model.attention_impl": impl, "model.layernorm_impl": impl}
  config = make_config(tfds_dir, num_train_steps=1, log_every=1, **kernels)
  result = train_lib.train_and_evaluate(config, str(tmp_path / "one"))
  from attnscale.runtime import provenance
  record = provenance.read(str(tmp_path / "one"))[-1]
  assert record["attention_kernel"] == impl and record["layernorm_kernel"] == impl
  got = {k: round(result[k], 5) for k in golden_one_step}
  for key, golden in golden_one_step.items():
    assert result[key] == pytest.approx(golden, abs=1e-5), f"{key}: {got}: {GOLDEN_MESSAGE}"
  config = make_config(tfds_dir, num_train_steps=2, log_every=1, **kernels)
  train_lib.train_and_evaluate(config, str(tmp_path / "two"))
  step_2 = train_losses(str(tmp_path / "two"))[2]
  assert step_2 == pytest.approx(golden_step_2, abs=1e-5), (
      f"step 2 loss {step_2:.7f}: {GOLDEN_MESSAGE}")


# ---------------------------------------------------------------------------
# 9. SIGTERM (preemption): train.py saves where it stopped and exits cleanly.


def test_sigterm_saves_and_exits_cleanly(tfds_dir, tmp_path):
  workdir, log = tmp_path / "run", tmp_path / "log"
  total, every = 2000, 1000
  proc = testing.start_train_py(
      workdir, log, f"--config.data_dir={tfds_dir}", f"--config.num_train_steps={total}",
      f"--config.checkpoint_every={every}", f"--config.eval_every={every}")
  metrics = workdir / "metrics.jsonl"
  testing.wait_for(proc, lambda: metrics.exists() and metrics.read_text().strip(),
                   "metrics", log, timeout_s=120)
  proc.send_signal(signal.SIGTERM)
  stdout = testing.finish(proc, log, timeout_s=120)
  saved = re.search(r"SIGTERM: saved a checkpoint at step (\d+)", stdout)
  assert saved, stdout[-3000:]
  step = int(saved.group(1))
  assert 0 < step < total and step % every, step
  assert checkpoint_steps(str(workdir))[-1] == step
  assert read_metrics(str(workdir))[-1]["step"] == step  # a save also logs


@pytest.mark.parametrize("verbose", [
    pytest.param(False, id="quiet"),
    pytest.param(True, id="data_progress", marks=pytest.mark.slow),
])
def test_the_first_run_prepares_its_dataset_in_one_line(tmp_path, verbose):
  """A new data_dir: one line says the dataset was prepared, where and that it is
  done once; --data_progress shows TFDS's own progress bars instead."""
  if not os.environ.get("ATTNSCALE_DATA"):
    pytest.skip("needs ATTNSCALE_DATA (CI sets it) or network access")
  proc = run_train_py("--config=configs/shakespeare_char.py:preset=test",
                      f"--workdir={tmp_path / 'run'}", f"--config.data_dir={tmp_path / 'tfds'}",
                      "--config.num_train_steps=1", *(["--data_progress"] if verbose else []))
  assert proc.returncode == 0, proc.stderr[-2000:]
  output = proc.stdout + proc.stderr
  if verbose:
    assert "Downloading and preparing dataset" in output, output
    return
  assert "Generating" not in output and "preparing dataset" not in output, output
  (line,) = proc.stdout.split("char_lm | ")[0].strip().splitlines()
  assert line.startswith(f"prepared the dataset tiny_shakespeare_char in {tmp_path / 'tfds'}"), line
