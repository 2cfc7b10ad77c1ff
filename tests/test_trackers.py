"""Experiment trackers (config.loggers, attnscale/runtime/trackers.py).

Cheap: the loggers field's one-line errors; the sink's queue (a tracker that is
still starting never holds up a row), its summary, the id kept in the workdir,
one warning line for a tracker that fails. End to end (`slow`: train.py on the
`test` preset, as a user runs it): W&B's and trackio's offline files, a resumed
run continuing the same tracker run, a missing or failing tracker costing one
warning line. Nothing touches the network (W&B offline, trackio's local store).
"""

import glob
import json
import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from attnscale import testing
from attnscale.config import loggers
from attnscale.runtime import configlib, packing, trackers
from configs import shakespeare_char

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# The field.


@pytest.mark.parametrize("value, words", [
    ("tensorboard,jsonl,bogus", ["config.loggers", "'bogus'", "wandb"]),
    ("tensorboard,wandb", ["config.loggers", "'jsonl'"]),
    (("wandb",), ["config.loggers", "comma-separated"]),
])
def test_bad_loggers_fail_in_one_line(value, words):
  with pytest.raises(ValueError) as e:
    loggers.parse(value)
  message = str(e.value)
  assert "\n" not in message and all(w in message for w in words), message


def test_validate_checks_loggers():
  config = shakespeare_char.get_config("preset=test")
  assert loggers.parse(config.loggers) == ("tensorboard", "jsonl")  # today's default
  config.loggers = "jsonl,nope"
  with pytest.raises(ValueError, match="config.loggers"):
    configlib.validate(config)


def test_flat_row_spreads_per_head_lists():
  row = {"train/loss": 2.0, "train/attn/entropy_heads/layer_0": [1.0, 3.0], "n": 2}
  assert trackers.flat_row(row) == {"train/loss": 2.0, "n": 2.0,
                                    "train/attn/entropy_heads/layer_0/0": 1.0,
                                    "train/attn/entropy_heads/layer_0/1": 3.0}


# ---------------------------------------------------------------------------
# The sink, with trackers registered here.


class Recorder(trackers.Tracker):
  """Records what it is sent; its start waits for `release` (a slow W&B start)."""
  release = threading.Event()
  runs: list["Recorder"] = []

  def start(self, *, workdir, run_id, name, group, config):
    assert self.release.wait(30)
    self.args = dict(run_id=run_id, name=name, group=group, config=config)
    self.rows, self.summary = [], None
    Recorder.runs.append(self)
    return run_id or "id0"

  def log(self, step, row):
    self.rows.append((step, row))

  def finish(self, summary):
    self.summary = summary


trackers.register("recorder")(Recorder)


@trackers.register("broken_in_log")
class BrokenInLog(trackers.Tracker):
  def start(self, **kwargs):
    return "x"

  def log(self, step, row):
    raise RuntimeError("disk full\nsecond line")


def test_sink_never_waits_for_a_tracker_and_keeps_its_id(tmp_path):
  sweep = tmp_path / "sweep"
  workdir = sweep / "point_a"
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps({"seed": 3, "loggers": "jsonl,recorder"}))
  (workdir / "provenance.json").write_text(json.dumps([{"commit": "old"}, {"commit": "new"}]))
  Recorder.release.clear()
  Recorder.runs.clear()
  sink = trackers.Sink(str(workdir), loggers.parse("jsonl,recorder"))
  for step in range(1, 101):  # all queued while the tracker is still starting
    sink.log(step, {"train/loss": 1.0 / step, "heads": [step, -step]})
  assert not Recorder.runs
  Recorder.release.set()
  sink.close()
  (run,) = Recorder.runs
  assert run.args["config"] == {"seed": 3, "loggers": "jsonl,recorder",
                                "provenance": {"commit": "new"}}
  assert (run.args["name"], run.args["group"], run.args["run_id"]) == ("point_a", "sweep", None)
  assert [s for s, _ in run.rows] == list(range(1, 101))
  assert run.rows[-1][1] == {"train/loss": 0.01, "heads/0": 100.0, "heads/1": -100.0}
  assert run.summary == {"train/loss": 0.01, "heads/0": 100.0, "heads/1": -100.0, "step": 100}
  assert json.loads((workdir / trackers.IDS_FILE).read_text()) == {"recorder": "id0"}
  # A resumed run continues the tracker run it started.
  sink = trackers.Sink(str(workdir), ("jsonl", "recorder"))
  sink.log(101, {"train/loss": 0.5})
  sink.close()
  assert Recorder.runs[-1].args["run_id"] == "id0"


def test_a_tracker_failing_costs_one_warning_line(tmp_path, capsys):
  sink = trackers.Sink(str(tmp_path), ("jsonl", "broken_in_log"))
  for step in range(5):
    sink.log(step, {"train/loss": 1.0})
  sink.close()
  warnings = capsys.readouterr().err.strip().splitlines()
  assert len(warnings) == 1 and warnings[0].startswith("warning: tracker broken_in_log failed")
  assert "disk full second line" in warnings[0]


def test_no_tracker_no_thread(tmp_path):
  sink = trackers.Sink(str(tmp_path), ("tensorboard", "jsonl"))
  sink.log(1, {"train/loss": 1.0})
  sink.close()
  assert sink.thread is None and not os.path.exists(tmp_path / trackers.IDS_FILE)


# ---------------------------------------------------------------------------
# End to end: train.py as a user runs it.

# Trackers that cannot start, registered through config.imports as a user's would be.
BROKEN_TRACKERS = '''
from attnscale.runtime import trackers

@trackers.register("not_installed")
class NotInstalled(trackers.Tracker):
  def start(self, **kwargs):
    import attnscale_no_such_tracker_package  # noqa: F401

@trackers.register("no_network")
class NoNetwork(trackers.Tracker):
  def start(self, **kwargs):
    raise ConnectionError("no route to host")
'''


def train_py(tfds_dir, workdir, *flags, env=None):
  """train.py on the test preset, constant LR so that a longer rerun resumes."""
  return subprocess.run(
      [sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=test",
       f"--workdir={workdir}", f"--config.data_dir={tfds_dir}",
       "--config.lr_schedule=constant", *flags],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=testing.subprocess_env(JAX_PLATFORMS="cpu", **(env or {})))


@pytest.mark.slow
def test_wandb_offline_files_and_resume_into_the_same_run(tfds_dir, tmp_path):
  pytest.importorskip("wandb")
  workdir = tmp_path / "run"
  env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
  for steps in (6, 12):  # the second resumes from the first's final checkpoint
    proc = train_py(tfds_dir, workdir, "--config.loggers=tensorboard,jsonl,wandb",
                    f"--config.num_train_steps={steps}", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "warning: tracker" not in proc.stderr, proc.stderr
  run_id = json.loads((workdir / trackers.IDS_FILE).read_text())["wandb"]
  pieces = sorted(glob.glob(str(workdir / "wandb" / f"offline-run-*-{run_id}")))
  assert len(pieces) == 2, os.listdir(workdir / "wandb")  # `wandb sync` joins them, in order
  records = [open(os.path.join(p, f"run-{run_id}.wandb"), "rb").read() for p in pieces]
  for data in records:
    for key in (b"train/loss", b"val/loss", b"train/attn/max_logit/layer_0", b"provenance",
                b"learning_rate"):
      assert key in data, key
  assert glob.glob(str(workdir / "tensorboard" / "events.out.tfevents.*"))


@pytest.mark.slow
def test_trackio_local_store_and_resume(tfds_dir, tmp_path):
  pytest.importorskip("trackio")
  workdir, store = tmp_path / "run", tmp_path / "trackio"
  env = {"TRACKIO_DIR": str(store), "TRACKIO_PROJECT": "attnscale_test"}
  for steps in (6, 12):
    proc = train_py(tfds_dir, workdir, "--config.loggers=jsonl,trackio",
                    f"--config.num_train_steps={steps}", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "warning: tracker" not in proc.stderr, proc.stderr
  assert "Resumed existing run" in proc.stdout
  name = json.loads((workdir / trackers.IDS_FILE).read_text())["trackio"]
  assert name.startswith("run-")
  assert not (workdir / "tensorboard").exists()  # left out of config.loggers
  (db,) = glob.glob(str(store / "*.db"))
  with sqlite3.connect(db) as con:
    tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")]
    text = " ".join(str(row) for t in tables for row in con.execute(f"select * from {t}"))
  assert name in text and "val/loss" in text and "summary/train/loss" in text


@pytest.mark.slow
def test_missing_or_failing_tracker_costs_one_warning_line_each(tfds_dir, tmp_path):
  (tmp_path / "broken_trackers.py").write_text(BROKEN_TRACKERS)
  workdir = tmp_path / "run"
  proc = train_py(tfds_dir, workdir, f"--config.imports=('{tmp_path}/broken_trackers.py',)",
                  "--config.loggers=tensorboard,jsonl,not_installed,no_network",
                  "--config.num_train_steps=6")
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "tracker" in line]
  assert len(warnings) == 2, warnings
  assert any("not_installed could not start (ModuleNotFoundError" in w for w in warnings)
  assert any("no_network could not start (ConnectionError: no route to host)" in w
             for w in warnings)
  assert "Traceback" not in proc.stderr
  assert len(open(workdir / "metrics.jsonl").readlines()) >= 3  # trained and logged all along


@pytest.mark.slow
def test_a_packed_sweep_gives_each_point_its_own_run_grouped_by_sweep(tfds_dir, tmp_path):
  pytest.importorskip("wandb")
  sweep = tmp_path / "my_sweep"
  runs = [{"config": "configs/shakespeare_char.py:preset=test",
           "overrides": {"seed": seed, "num_train_steps": 6, "data_dir": tfds_dir,
                         "loggers": "tensorboard,jsonl,wandb"},
           "workdir": str(sweep / f"seed{seed}")} for seed in (0, 1)]
  proc = subprocess.run(packing.command(runs, sys.executable), cwd=ROOT, capture_output=True,
                        text=True, timeout=600,
                        env=testing.subprocess_env(JAX_PLATFORMS="cpu", WANDB_MODE="offline",
                                                   WANDB_SILENT="true"))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "warning: tracker" not in proc.stderr, proc.stderr
  ids = [json.loads((sweep / f"seed{s}" / trackers.IDS_FILE).read_text())["wandb"]
         for s in (0, 1)]
  assert ids[0] != ids[1]
  for seed, run_id in zip((0, 1), ids):
    (piece,) = glob.glob(str(sweep / f"seed{seed}" / "wandb" / f"offline-run-*-{run_id}"))
    data = open(os.path.join(piece, f"run-{run_id}.wandb"), "rb").read()
    assert b"my_sweep" in data and f"seed{seed}".encode() in data and b"train/loss" in data
