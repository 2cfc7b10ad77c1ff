"""Experiment trackers beside TensorBoard and metrics.jsonl: Weights & Biases, trackio, yours.

`config.loggers` names where a run's metrics go, comma-separated:
"tensorboard,jsonl" (the default: WORKDIR/tensorboard event files and
WORKDIR/metrics.jsonl, which `MetricsWriter` writes itself), plus any
registered tracker:

  python train.py --config=configs/shakespeare_char.py:preset=cpu --workdir=runs/a \
      --config.loggers=tensorboard,jsonl,wandb

  wandb    (pip install -e ".[wandb]") offline unless WANDB_MODE says otherwise:
           WORKDIR/wandb/offline-run-*; `wandb sync WORKDIR/wandb/offline-run-*`
           uploads them (a resumed run's pieces, one run id, in order). Project:
           WANDB_PROJECT, default "attnscale".
  trackio  (pip install -e ".[trackio]") its local store (TRACKIO_DIR, default
           ~/.cache/huggingface/trackio; `trackio show` opens it). Project:
           TRACKIO_PROJECT, default "attnscale".

Each tracker run gets the resolved config (WORKDIR/config.json) with this
start's provenance under "provenance", every metric row (attention health
included: per-head lists become `<name>/<head>` scalars) and, at the end, the
last value of every metric as its summary. The run is named after the workdir
and grouped by the folder above it (a sweep's points: the sweep), and its id is
kept in WORKDIR/tracker_ids.json, so a resumed run continues the same tracker
run. metrics.jsonl stays the run's record (resume, eval.py and sweeps read it):
it cannot be left out.

A tracker never stops or slows training: each workdir's trackers run on one
background thread fed by a queue (started at the first metric row, when the
provenance exists), and one that cannot start or fails later (not installed,
no login, no network, any exception) costs one warning line and is dropped.
`close()` waits up to CLOSE_TIMEOUT_S for the last rows to be written.

Your own: subclass `Tracker` and register it, in a module named in
`config.imports`:

    @trackers.register("mine")
    class Mine(trackers.Tracker):
      def start(self, *, workdir, run_id, name, group, config):
        ...; return run_id or new_id()   # the id to resume into next time
      def log(self, step, row): ...
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import string
import sys
import threading
from typing import Any

# The names config.loggers takes are the config's (attnscale/config/loggers.py): a
# tracker registers its class under its name there, and the sink starts it from there.
from attnscale.config.loggers import BUILTIN, register
from attnscale.config.loggers import registered as _registered

IDS_FILE = "tracker_ids.json"
EXTRAS = ("wandb", "trackio")  # trackers with a pyproject.toml extra of their name
CLOSE_TIMEOUT_S = 60.0  # at the end of training: how long the last rows may take

# One tracker start at a time in a process: a packed sweep starts one per point,
# and the trackers' init (W&B's service, trackio's SQLite store) is not made for
# concurrent starts.
_START_LOCK = threading.Lock()


class Tracker:
  """One experiment tracker's run. Every method runs on the sink's thread."""

  def start(self, *, workdir: str, run_id: str | None, name: str, group: str,
            config: dict) -> str:
    """Starts (or, with the `run_id` it returned before, resumes) the run; returns its id."""
    raise NotImplementedError

  def log(self, step: int, row: dict[str, float]) -> None:
    raise NotImplementedError

  def finish(self, summary: dict[str, float]) -> None:
    """Sets the run's summary (each metric's last value) and closes it."""


def new_id() -> str:
  """A fresh tracker run id: 8 lowercase letters and digits (W&B's form)."""
  alphabet = string.ascii_lowercase + string.digits
  return "".join(secrets.choice(alphabet) for _ in range(8))


def _read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def warn(msg: str) -> None:
  print(f"warning: {msg}", file=sys.stderr, flush=True)


def flat_row(row: dict[str, Any]) -> dict[str, float]:
  """A metric row as scalars: per-head lists become `<name>/<index>` entries."""
  out = {}
  for name, value in row.items():
    if isinstance(value, (list, tuple)):
      out.update({f"{name}/{i}": float(v) for i, v in enumerate(value)})
    else:
      out[name] = float(value)
  return out


class Sink:
  """The trackers of one workdir, on a background thread fed by a queue.

  `log` only enqueues (microseconds): the training loop never waits for a
  tracker, nor for its start (W&B's takes seconds). The thread starts the
  trackers at the first row, with WORKDIR/config.json and the newest
  provenance record; a tracker that raises is dropped with one warning line.
  """

  def __init__(self, workdir: str, tracker_names: tuple[str, ...]):
    self.workdir = workdir
    self.names = [n for n in tracker_names if n not in BUILTIN]
    self.last: dict[str, float] = {}
    self.queue: queue.SimpleQueue | None = None
    self.thread: threading.Thread | None = None

  def log(self, step: int, row: dict[str, Any]) -> None:
    if not self.names:
      return
    row = flat_row(row)
    self.last.update(row)
    self.last["step"] = step
    if self.thread is None:
      self.queue = queue.SimpleQueue()
      self.thread = threading.Thread(target=self._run, name="trackers", daemon=True)
      self.thread.start()
    self.queue.put((step, row))

  def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
    """Sends the summary, closes the tracker runs and waits up to `timeout` s."""
    if self.thread is None:
      return
    self.queue.put(None)
    self.thread.join(timeout)
    if self.thread.is_alive():
      warn(f"trackers {self.names} still writing after {timeout:.0f} s; training is "
           "done, their last rows may be missing")

  def _run(self) -> None:
    running = self._start_all()
    while True:
      item = self.queue.get()
      if item is None:
        break
      for name, tracker in list(running.items()):
        try:
          tracker.log(*item)
        except Exception as e:  # a tracker never stops training
          warn(f"tracker {name} failed ({type(e).__name__}: {_one_line(e)}); training "
               "goes on without it")
          del running[name]
    for name, tracker in running.items():
      try:
        tracker.finish(dict(self.last))
      except Exception as e:
        warn(f"tracker {name} could not finish ({type(e).__name__}: {_one_line(e)})")

  def _start_all(self) -> dict[str, Tracker]:
    config = _read_json(os.path.join(self.workdir, "config.json")) or {}
    records = _read_json(os.path.join(self.workdir, "provenance.json"))
    if isinstance(records, list) and records:
      config = {**config, "provenance": records[-1]}
    ids_path = os.path.join(self.workdir, IDS_FILE)
    ids = _read_json(ids_path) or {}
    workdir = os.path.abspath(self.workdir)
    name = os.path.basename(workdir)
    group = os.path.basename(os.path.dirname(workdir))
    running = {}
    for tracker_name in self.names:
      try:
        tracker = _registered(tracker_name)()
        with _START_LOCK:
          ids[tracker_name] = tracker.start(workdir=workdir, run_id=ids.get(tracker_name),
                                            name=name, group=group, config=config)
        running[tracker_name] = tracker
      except Exception as e:  # ImportError, no login, no network, ...
        hint = (f"; pip install -e '.[{tracker_name}]'"
                if isinstance(e, ImportError) and tracker_name in EXTRAS else "")
        warn(f"tracker {tracker_name} could not start ({type(e).__name__}: "
             f"{_one_line(e)}{hint}); training goes on without it")
    if running:
      with open(ids_path + ".tmp", "w") as f:
        json.dump(ids, f, indent=2)
      os.replace(ids_path + ".tmp", ids_path)
    return running


def _one_line(e: BaseException) -> str:
  text = " ".join(str(e).split())
  return text if len(text) <= 200 else text[:197] + "..."


@register("wandb")
class WandB(Tracker):
  """Weights & Biases: offline by default (WANDB_MODE=online to upload live)."""

  def start(self, *, workdir, run_id, name, group, config):
    import wandb
    self.run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "attnscale"), name=name, group=group,
        id=run_id or new_id(), resume="allow", config=config, dir=workdir,
        mode=os.environ.get("WANDB_MODE", "offline"),
        reinit="create_new")  # several runs in one process: a packed sweep's points
    return self.run.id

  def log(self, step, row):
    self.run.log(row, step=step)

  def finish(self, summary):
    self.run.summary.update(summary)
    self.run.finish()


@register("trackio")
class Trackio(Tracker):
  """trackio's local store (TRACKIO_DIR); a run resumes by its name, so the kept id is it."""

  def start(self, *, workdir, run_id, name, group, config):
    import trackio
    run_name = run_id or f"{name}-{new_id()}"  # unique in the project: trackio resumes by name
    self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "attnscale"),
                            name=run_name, group=group, config=config, resume="allow",
                            embed=False)
    return run_name

  def log(self, step, row):
    self.run.log(row, step=step)

  def finish(self, summary):
    step = int(summary.pop("step", 0))
    self.run.log({f"summary/{k}": v for k, v in summary.items()}, step=step)
    self.run.finish()
