"""Bad input at train.py, eval.py and sweep.py: one `error: ...` line naming the
flag or config field, a nonzero exit, no traceback, nothing created."""

import os
import subprocess
import sys

import ml_collections
import pytest

from attnscale.config import schema
from attnscale.runtime import cli
from attnscale.testing import assert_one_line_error
from configs import shakespeare_char

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "--config=configs/shakespeare_char.py:preset=test"


def run(script, *args):
  return subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.fixture
def a_file(tmp_path):
  path = tmp_path / "a_file"
  path.write_text("not a run directory")
  return str(path)


TRAIN_CASES = {  # id: (flags after --workdir, names the error must hold)
    "missing_config_file": (["--config=configs/nope.py"], ["--config", "configs/nope.py"]),
    "missing_config_file_with_override": (["--config=configs/nope.py", "--config.seed=1"],
                                          ["--config", "configs/nope.py"]),
    "unknown_field": ([CONFIG, "--config.model.nosuch=1"], ["--config.model.nosuch"]),
    "unknown_top_level_field": ([CONFIG, "--config.nosuch=1"], ["--config.nosuch"]),
    "misspelt_field": ([CONFIG, "--config.model.scalin=cosine"], ["model.scaling"]),
    "wrong_type_int": ([CONFIG, "--config.batch_size=abc"], ["--config.batch_size", "int"]),
    "wrong_type_float": ([CONFIG, "--config.learning_rate=fast"],
                         ["--config.learning_rate", "float"]),
    "wrong_type_bool": ([CONFIG, "--config.model.shared_kv=maybe"],
                        ["--config.model.shared_kv", "bool"]),
}


@pytest.mark.parametrize("flags, names", [pytest.param(*v, id=k) for k, v in TRAIN_CASES.items()])
def test_train_py_bad_flag(tmp_path, flags, names):
  workdir = tmp_path / "run"
  assert_one_line_error(run("train.py", f"--workdir={workdir}", *flags), *names)
  assert not workdir.exists()


def test_train_py_renamed_field_names_the_replacement(tmp_path):
  # Whatever RENAMED_FIELDS holds when the test runs; the message builder is
  # tested with a dict of its own below.
  if not schema.RENAMED_FIELDS:
    pytest.skip("no renamed fields")
  old, new = next(iter(schema.RENAMED_FIELDS.items()))
  proc = run("train.py", f"--workdir={tmp_path / 'run'}", CONFIG, f"--config.{old}=1")
  assert_one_line_error(proc, f"--config.{old}", f"--config.{new}")


@pytest.mark.parametrize("sub", ["", "sub"])
def test_train_py_workdir_that_is_a_file(a_file, sub):
  workdir = os.path.join(a_file, sub) if sub else a_file
  assert_one_line_error(run("train.py", CONFIG, f"--workdir={workdir}"), "--workdir", a_file)
  assert open(a_file).read() == "not a run directory"


def test_eval_py_bad_flags(a_file, tmp_path):
  assert_one_line_error(run("eval.py", f"--workdir={a_file}"), "--workdir", "is a file")
  assert_one_line_error(run("eval.py", f"--workdir={tmp_path}", "--step=abc"), "--step", "int")
  assert_one_line_error(run("eval.py", f"--workdir={tmp_path}", "--nosuch"), "nosuch")


def test_sweep_py_bad_flags(a_file, tmp_path):
  args = ["--sweep=test", f"--workdir={tmp_path / 'sweep'}"]
  assert_one_line_error(run("sweep.py", "--config=configs/nope.py", *args),
                        "--config", "configs/nope.py")
  assert_one_line_error(run("sweep.py", "--config=configs/shakespeare_char.py", "--sweep=test",
                            f"--workdir={a_file}"), "--workdir", "is a file")
  assert not (tmp_path / "sweep").exists()


# ---------------------------------------------------------------------------
# The message builders, directly.


def test_override_error_names_the_replacement_of_a_renamed_field():
  config = shakespeare_char.get_config("preset=test")
  renamed = {"model.old_name": "model.unit.residual_mult", "optim": "optimizer"}
  message = cli.override_error("model.old_name", config, renamed=renamed)
  assert message.startswith("--config.model.old_name:")
  assert "use --config.model.unit.residual_mult" in message and "\n" not in message
  # A field under a renamed parent moves with it.
  assert "use --config.optimizer.kind" in cli.override_error("optim.kind", config,
                                                             renamed=renamed)


def test_override_error_reads_renamed_fields_when_called(monkeypatch):
  config = shakespeare_char.get_config("preset=test")
  monkeypatch.setattr(schema, "RENAMED_FIELDS", {"model.gone": "model.width"})
  assert "use --config.model.width" in cli.override_error("model.gone", config)


def test_override_error_of_an_unknown_field_lists_close_or_all_fields():
  config = ml_collections.ConfigDict({"model": {"scaling": "standard", "width": 8}, "seed": 0})
  close = cli.override_error("model.scalin", config, renamed={})
  assert close == ("--config.model.scalin: the config has no field model.scalin "
                   "(did you mean model.scaling?)")
  unrelated = cli.override_error("model.zzz", config, renamed={})
  assert "model.zzz" in unrelated and "scaling, width" in unrelated
  deep = cli.override_error("nosuch.deeper", config, renamed={})
  assert "no field nosuch " in deep


def test_workdir_problem(a_file, tmp_path):
  assert cli.workdir_problem(str(tmp_path / "new" / "run")) is None
  assert cli.workdir_problem(str(tmp_path)) is None
  assert cli.workdir_problem(a_file) == f"--workdir={a_file}: is a file, not a directory"
  assert a_file in cli.workdir_problem(os.path.join(a_file, "x", "y"))
