"""Metrics to TensorBoard event files and a plain JSON-lines log in the workdir.

A resumed run continues from its last checkpoint, so whatever a killed process
logged after that checkpoint is history that never happened: the writer drops
those rows of metrics.jsonl and tells TensorBoard to hide those events
(`resume_step`), and the rerun logs them again, once.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import time

import jax

from attnscale.runtime import trackers


def _import_tensorboardx_without_torch():
  """Imports tensorboardX's record protos without PyTorch.

  tensorboardX's package __init__ imports its SummaryWriter, which imports torch
  wherever it is installed, only to accept torch tensors: 2.5-3.5 s and about
  600 MB resident in every train.py process on 2 CPU cores, a fifth of a sweep point's
  start-up at graphcore_cpu (docs/benchmarks.md). attnscale writes events with EventsWriter and
  the protos alone, so torch is hidden while tensorboardX imports (its
  `try: import torch / except ImportError` takes the numpy-only branch) and is
  importable again afterwards.
  """
  hide = "torch" not in sys.modules and "tensorboardX" not in sys.modules
  if hide:
    sys.modules["torch"] = None  # makes `import torch` raise ImportError
  try:
    import tensorboardX.event_file_writer  # noqa: F401
    from tensorboardX.proto import event_pb2, summary_pb2
  finally:
    if hide and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]
  return event_pb2, summary_pb2


event_pb2, summary_pb2 = _import_tensorboardx_without_torch()

METRICS_FILE = "metrics.jsonl"
# An archived run's metrics (run_records.archive): the same lines gzipped, about a
# tenth of the size (most of what a committed archive of runs weighs).
ARCHIVED_METRICS_FILE = METRICS_FILE + ".gz"


def metrics_path(workdir: str) -> str | None:
  """WORKDIR/metrics.jsonl, else an archive's WORKDIR/metrics.jsonl.gz, else None."""
  for name in (METRICS_FILE, ARCHIVED_METRICS_FILE):
    if os.path.exists(os.path.join(workdir, name)):
      return os.path.join(workdir, name)
  return None


def read_lines(workdir: str) -> list[str]:
  """The lines of WORKDIR's metrics (`metrics_path`; [] if there are none)."""
  path = metrics_path(workdir)
  return _read_lines(path) if path else []


def read_rows(workdir: str) -> list[dict]:
  """The rows of WORKDIR/metrics.jsonl (or an archive's .gz; [] if absent); a torn
  last line is skipped."""
  rows = []
  for line in read_lines(workdir):
    row = _parse(line)
    if row is not None:
      rows.append(row)
  return rows


def value_at(workdir: str, name: str, step: int) -> float | None:
  """`name`'s value in the last row of metrics.jsonl at or before `step`, or None.

  How a resumed run picks up a running total (train/elapsed_s) where its
  checkpoint left it: every save also logs, so the checkpoint's step has a row.
  """
  value = None
  for row in read_rows(workdir):
    if row["step"] <= step and name in row:
      value = row[name]
  return value


def _read_lines(path: str) -> list[str]:
  if not os.path.exists(path):
    return []
  with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
    return f.readlines()


def _parse(line: str) -> dict | None:
  try:
    row = json.loads(line)
  except ValueError:  # the half-written last line of a killed process
    return None
  return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def drop_rows_after(path: str, step: int) -> int:
  """Removes the rows of the JSON-lines file `path` with a step > `step`.

  The file is rewritten to a temporary file and renamed over the original, so
  a kill at any moment leaves either the old or the new file, never a mix.

  Returns:
    How many lines were dropped (unparseable ones included).
  """
  lines = _read_lines(path)
  kept = [line if line.endswith("\n") else line + "\n" for line in lines
          if (row := _parse(line)) is not None and row["step"] <= step]
  if len(kept) == len(lines) and all(line.endswith("\n") for line in lines):
    return 0
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(kept)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return len(lines) - len(kept)


class MetricsWriter:
  """Writes scalars to WORKDIR/tensorboard (event files) and WORKDIR/metrics.jsonl,
  and to the experiment trackers of the run's config.loggers (attnscale/runtime/trackers.py).

  Only process 0 writes: the values are global (already averaged over devices).
  Events are written synchronously (tensorboardX's record format, without its
  SummaryWriter: that one queues events to a background thread, and its flush()
  does not wait for the queue, so a SIGKILL right after a checkpoint could lose
  events from before it). `flush()` puts everything written so far on disk.

  Args:
    workdir: the run directory.
    resume_step: the step this process starts from (the restored checkpoint's,
      0 for a fresh start). A previous process's rows after it are dropped from
      metrics.jsonl and its TensorBoard events after it are superseded (a
      SessionLog START at resume_step + 1, tensorboardX's `purge_step`:
      TensorBoard hides the older files' events at steps >= resume_step + 1).
      None: append to whatever is there.
  """

  def __init__(self, workdir: str, *, resume_step: int | None = None,
               loggers: tuple[str, ...] = ("tensorboard", "jsonl")):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    from tensorboardX.event_file_writer import EventsWriter  # no TensorFlow needed
    jsonl_path = os.path.join(workdir, METRICS_FILE)
    tb_dir = os.path.join(workdir, "tensorboard")
    purge_step = None
    if resume_step is not None:
      drop_rows_after(jsonl_path, resume_step)
      if glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")):
        purge_step = resume_step + 1
    # `loggers`: config.loggers as `attnscale.config.loggers.parse` gives it (the
    # default: no tracker).
    self.trackers = trackers.Sink(workdir, loggers)
    # events.out.tfevents.<unix time>.<host>.<pid>: a rerun within the same second
    # gets its own file (the time and host alone would name the killed run's).
    self.events = (EventsWriter(_makedirs(tb_dir, "events"), f".{os.getpid()}")
                   if "tensorboard" in loggers else _NoEvents())
    if purge_step is not None:
      self.events.write_event(event_pb2.Event(
          wall_time=time.time(), step=purge_step,
          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    self.jsonl = open(jsonl_path, "a")

  def write(self, step: int, scalars: dict[str, float | list[float]]) -> None:
    """One row: every value to metrics.jsonl, the numbers (not lists) to TensorBoard."""
    if not self.enabled:
      return
    wall_time = time.time()
    for name, value in scalars.items():
      if isinstance(value, (list, tuple)):  # per-head lists: metrics.jsonl only
        continue
      self.events.write_event(event_pb2.Event(
          wall_time=wall_time, step=step,
          summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(
              tag=name, simple_value=float(value))])))
    self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self.jsonl.flush()
    self.trackers.log(step, scalars)  # enqueued: a tracker never holds up the step

  def flush(self) -> None:
    """Puts every event and row written so far on disk (fsync), so that a
    checkpoint saved next never has metrics missing from before it. (Rows reach
    the OS at every write: a killed process loses none; this also survives a
    machine crash.)"""
    if self.enabled:
      self.events.flush()
      os.fsync(self.jsonl.fileno())

  def close(self) -> None:
    if self.enabled:
      self.events.close()
      self.jsonl.close()
      self.trackers.close()  # the summary; waits for the last rows (trackers.CLOSE_TIMEOUT_S)


def _makedirs(folder: str, name: str) -> str:
  os.makedirs(folder, exist_ok=True)
  return os.path.join(folder, name)


class _NoEvents:
  """The events writer when config.loggers leaves out tensorboard."""

  def write_event(self, event) -> None:
    pass

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass
