"""config.profile_steps (attnscale/runtime/profiling.py): a jax.profiler trace of a
few steps of a real run, where TensorBoard's profile plugin looks for it."""

import glob
import gzip
import json
import os
import subprocess
import sys

import pytest

from attnscale import testing
from attnscale.config import validation
from attnscale.runtime import configlib, profiling
from configs import shakespeare_char

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_profile_steps_parse_to_a_window_and_the_old_name_points_there():
  assert validation.profile_window("") is None
  assert validation.profile_window("20:25", 100) == (20, 25)
  assert validation.profile_window(" 0 : 3 ") == (0, 3)
  with pytest.raises(AttributeError, match="attnscale.config.validation.profile_window"):
    profiling.parse  # noqa: B018


@pytest.mark.parametrize("value", ["20", "25:20", "5:5", "a:b", "-1:3", "10:20", 7])
def test_bad_values_fail_in_one_line_naming_the_field_and_the_form(value):
  with pytest.raises(ValueError) as e:
    validation.profile_window(value, num_train_steps=20)
  message = str(e.value)
  assert "\n" not in message and message.startswith("config.profile_steps must be 'START:STOP'")


def test_validate_checks_profile_steps():
  config = shakespeare_char.get_config("preset=test")  # 20 steps
  assert config.profile_steps == ""
  config.profile_steps = "15:20"  # no step after 20 to stop before
  with pytest.raises(ValueError, match="config.profile_steps"):
    configlib.validate(config)


@pytest.mark.slow
def test_train_py_writes_a_trace_tensorboard_reads(tfds_dir, tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=test",
       f"--workdir={workdir}", f"--config.data_dir={tfds_dir}", "--config.profile_steps=5:8"],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=testing.subprocess_env(JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "profiling steps 6-8 into" in proc.stdout
  # TensorBoard's profile plugin (and XProf) read LOGDIR/plugins/profile/<run>/<host>.xplane.pb.
  (run,) = glob.glob(str(workdir / "tensorboard" / "plugins" / "profile" / "*"))
  assert glob.glob(os.path.join(run, "*.xplane.pb"))
  (trace,) = glob.glob(os.path.join(run, "*.trace.json.gz"))  # Perfetto opens it as it is
  with gzip.open(trace) as f:
    events = json.load(f)["traceEvents"]
  names = {e.get("name", "") for e in events if e.get("ph") == "X"}
  assert any(name.startswith("dot") or "matmul" in name for name in names), sorted(names)[:50]
  assert glob.glob(str(workdir / "tensorboard" / "events.out.tfevents.*"))  # scalars as ever
