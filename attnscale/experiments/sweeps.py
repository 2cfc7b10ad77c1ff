"""Learning-rate x scaling sweeps: points as data, ordinary train.py runs, one table.

A sweep is a list of points, each a config argument plus field overrides,
defined in `sweeps.py` next to its config (configs/sweeps.py: `get_sweep(name)`
for configs/shakespeare_char.py; see `load_sweep`):

    {"arg": "preset=graphcore,scaling=fully_scaled,seed=0",
     "overrides": {"learning_rate": 2**-9}}

Each point is one `train.py` command in its own sub-directory of the sweep's
workdir, so a point can run anywhere (a cluster array job, a second machine)
and `train.py` resumes it where it stopped. `run_sweep` runs the points (one
after another, or `jobs` at a time), skipping finished ones; `collect` reads
every point's `config.json` and `metrics.jsonl` into rows, which
`attnscale/experiments/sweep_results.py` turns into tables and figures (`write_results`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import inspect
import json
import math
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import ml_collections

# The results' tables and figures, also reachable as sweeps.<name> (notebooks).
from attnscale.experiments.sweep_results import (  # noqa: F401
  COLUMNS,
  TEXT_COLUMNS,
  best_per_scaling,
  best_runs,
  best_table,
  markdown_table,
  plot_best,
  plot_loss_curves,
  plot_loss_vs_lr,
  standard_error,
  within_noise,
  write_results,
)
from attnscale.runtime import configlib, packing

# Where train.py is: the repository root, above attnscale/experiments/.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of a sweep: `train.py --config=FILE:arg --config.K=V ...`."""

  arg: str
  overrides: tuple[tuple[str, object], ...] = ()
  # eval.py flags to run after training (e.g. ("--lengths=64,128",)); () = no eval.
  eval_flags: tuple[str, ...] = ()

  @property
  def name(self) -> str:
    """A directory name: the argument's values and the overrides, e.g.
    `graphcore-fully_scaled-0-lr0.001953125` (no shell metacharacters)."""
    parts = [v for _, _, v in (kv.partition("=") for kv in self.arg.split(",") if kv)]
    for key, value in self.overrides:
      parts.append(f"{_short(key)}{value:g}" if isinstance(value, float) else
                   f"{_short(key)}{value}")
    return "-".join(parts).replace("/", "_")

  def command(self, config_file: str, workdir: str, python: str = sys.executable) -> list[str]:
    """The train.py command line of this point (runs from the repository root)."""
    cmd = [python, "train.py", f"--config={config_file}:{self.arg}",
           f"--workdir={os.path.join(workdir, self.name)}"]
    # An argv list, not a shell line: a string goes as it is (shell_commands quotes).
    return cmd + [f"--config.{key}={value}" for key, value in self.overrides]


  def run_spec(self, config_file: str, workdir: str) -> dict:
    """This point as one run of a pack (`attnscale.runtime.packing.command`)."""
    return {"config": f"{config_file}:{self.arg}", "overrides": dict(self.overrides),
            "workdir": os.path.join(workdir, self.name)}

  def eval_command(self, workdir: str, python: str = sys.executable) -> list[str]:
    """The eval.py command line run after training ([] when the point has none)."""
    if not self.eval_flags:
      return []
    return [python, "eval.py", f"--workdir={os.path.join(workdir, self.name)}",
            *self.eval_flags]


def _short(key: str) -> str:
  return {"learning_rate": "lr"}.get(key, key.rsplit(".", 1)[-1])


SWEEPS_FILE = "sweeps.py"  # a config's sweeps: this file in the config's directory


def load_sweep(config_file: str, name: str, workdir: str | None = None) -> list[Point]:
  """The points of sweep `name` of `config_file`.

  A config's sweeps are data in its own `<name>_sweeps.py` next to it
  (configs/gpt2_sweeps.py), else in `sweeps.py` there (configs/sweeps.py), which
  names the config file it is for (`CONFIG`, a file name in the same directory)
  and defines `SWEEPS` (the sweeps' names) and `get_sweep(name)`. A staged
  sweep's `get_sweep(name, workdir=...)` may add points from the results so far
  (the seeds at each scaling's best learning rate,
  `attnscale.experiments.lr_search`); `workdir` is passed when its signature
  takes it.

  Raises:
    ValueError: the config has no sweeps, or no sweep of that name (the
      message lists the known ones).
  """
  if not os.path.isfile(config_file):
    raise ValueError(f"--config {config_file} is not a config file")
  module = _sweeps_module(config_file)
  known = getattr(module, "SWEEPS", ())
  if name not in known:
    raise ValueError(f"--sweep must be one of {list(known)}, got {name!r}")
  takes_workdir = "workdir" in inspect.signature(module.get_sweep).parameters
  specs = module.get_sweep(name, workdir=workdir) if takes_workdir else module.get_sweep(name)
  points = [Point(p["arg"], tuple(sorted(p.get("overrides", {}).items())),
                  tuple(p.get("eval", ())))
            for p in specs]
  names = [p.name for p in points]
  if len(set(names)) != len(names):
    raise ValueError(f"sweep {name!r} has two points with the same directory name")
  return points


def default_pack(config_file: str, name: str) -> int:
  """The pack size sweep `name` runs with by default: its sweeps module's
  `default_pack(name)`, or 1 (unpacked) if it defines none."""
  module = _sweeps_module(config_file)
  return module.default_pack(name) if hasattr(module, "default_pack") else 1


def _sweeps_module(config_file: str):
  """The sweeps module of `config_file`: its own <name>_sweeps.py beside it
  (configs/gpt2_sweeps.py), else SWEEPS_FILE in its directory; either names it."""
  directory, config_name = os.path.split(os.path.abspath(config_file))
  path = os.path.join(directory, config_name.removesuffix(".py") + "_" + SWEEPS_FILE)
  if not os.path.isfile(path):
    path = os.path.join(directory, SWEEPS_FILE)
  module = None
  if os.path.isfile(path) and path != os.path.abspath(config_file):
    spec = importlib.util.spec_from_file_location("_sweeps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  if module is None or getattr(module, "CONFIG", None) != config_name:
    raise ValueError(f"--config {config_file} defines no sweeps (no {SWEEPS_FILE} next to "
                     f"it with CONFIG = {config_name!r})")
  return module


def checkpoint_steps(run_dir: str) -> list[int]:
  """The steps of the checkpoints on disk in `run_dir`, ascending ([] if none)."""
  path = os.path.join(run_dir, "checkpoints")
  return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def status(run_dir: str, read_checkpoint: bool = True) -> str:
  """'done' (a checkpoint at num_train_steps), 'partial' (started) or 'new'.

  A final checkpoint that cannot be read (a truncated file) is 'partial': it is
  read in full (`read_checkpoint`; False looks at the step numbers alone), so a
  sweep reruns the point, whose train.py sets the damaged checkpoint aside and
  redoes the steps from the newest one that reads. An archived run (`archive`:
  its records without weights, ARCHIVED naming its last step) is 'done'.
  """
  config_path = os.path.join(run_dir, "config.json")
  if not os.path.exists(config_path):
    return "new"
  with open(config_path) as f:
    num_steps = json.load(f)["num_train_steps"]
  steps = checkpoint_steps(run_dir)
  if not steps and os.path.exists(os.path.join(run_dir, ARCHIVED)):
    with open(os.path.join(run_dir, ARCHIVED)) as f:
      return "done" if json.load(f).get("step") == num_steps else "partial"
  if not steps or steps[-1] < num_steps:
    return "partial"
  return "done" if not read_checkpoint or _reads(run_dir, steps[-1]) else "partial"


# A finished run's records, without its weights: what `archive` copies.
ARCHIVED = "archived.json"
RECORDS = ("config.json", "metrics.jsonl", "provenance.json", "eval.json")


def archive(workdir: str, dest: str) -> list[str]:
  """Copies the records (RECORDS) of every finished run in `workdir` to
  `dest/<run>/`, with ARCHIVED ({"step": its last step}); returns the runs copied.

  What a sweep's results need, small enough to commit (tens of kB a run, no
  checkpoints): `collect` and the studies read an archived run as any other, and
  a sweep counts it done (`status`), so copying `dest` back into a fresh
  workdir (`cp -r DEST/. WORKDIR/`) resumes a staged sweep on another machine
  without rerunning what finished. eval.py needs the weights: evaluate first.
  """
  copied = []
  for name in sorted(os.listdir(workdir)):
    run_dir = os.path.join(workdir, name)
    if not os.path.isdir(run_dir) or status(run_dir, read_checkpoint=False) != "done":
      continue
    os.makedirs(os.path.join(dest, name), exist_ok=True)
    for record in RECORDS:
      if os.path.exists(os.path.join(run_dir, record)):
        shutil.copyfile(os.path.join(run_dir, record), os.path.join(dest, name, record))
    with open(os.path.join(run_dir, "config.json")) as f:
      step = json.load(f)["num_train_steps"]
    with open(os.path.join(dest, name, ARCHIVED), "w") as f:
      json.dump({"step": step}, f)
    copied.append(name)
  return copied


def evaluate_finished(workdir: str) -> list[str]:
  """Runs eval.py's evaluation (`eval_lib.evaluate_run`: the whole validation split,
  written to eval.json) on every finished run in `workdir` that has its weights
  and no eval.json from its last step; returns the runs evaluated.

  `archive` keeps no weights, so a run archived before it was evaluated can never
  be evaluated again: a study that later finds it at a best rate has one seed
  fewer (docs/experiments/bert.md). `sweep.py --evaluate` calls this before each
  archive.
  """
  from attnscale.evaluation import eval_lib  # JAX: only when evaluating

  done = []
  for name in sorted(os.listdir(workdir)):
    run_dir = os.path.join(workdir, name)
    checkpoints = os.path.join(run_dir, "checkpoints")
    if (not os.path.isdir(run_dir) or status(run_dir, read_checkpoint=False) != "done"
        or evaluated(run_dir) or not os.path.isdir(checkpoints)
        or not any(step.isdigit() for step in os.listdir(checkpoints))):
      continue
    eval_lib.evaluate_run(run_dir)
    done.append(name)
  return done


def _reads(run_dir: str, step: int) -> bool:
  """Whether checkpoint `step` of `run_dir` reads in full, onto one device here."""
  import jax  # here: reading the results needs no JAX

  from attnscale.evaluation import eval_lib
  from attnscale.runtime import checkpoints as ckpt
  from attnscale.runtime import train_state as ts

  config = eval_lib.load_config(run_dir)
  shapes = ts.state_shapes(config)
  shardings = ts.state_shardings(shapes, ts.make_mesh(None, jax.devices()[:1]))
  checkpoints = ckpt.Checkpoints(run_dir, config.keep_checkpoints)
  try:
    checkpoints.restore(shapes, shardings, step)
    return True
  except ckpt.DamagedCheckpointError:
    return False
  finally:
    checkpoints.close()


def run_sweep(config_file: str, points: Sequence[Point], workdir: str, *,
              log=print, jobs: int = 1, pack: int = 1) -> list[tuple[Point, int]]:
  """Runs every point that is not done; returns the failures.

  A point that fails (non-zero exit: a NaN at a too-high learning rate, say) is
  reported and the sweep goes on; its directory keeps what it had. A point with
  `eval_flags` runs eval.py after training, unless its eval.json is already
  from the last step.

  `pack` > 1 trains up to that many points in one vmapped program: the points
  that differ only in seed, learning rates, weight decay or clipping thresholds
  (attnscale/runtime/packing.py), each still in its own run directory as train.py
  would write it (attnscale/runtime/packed.py). A pack's point that did not finish
  (a non-finite loss stops it alone) is a failure with the pack's exit code.

  Ctrl-C: each running point (or pack) gets it once, saves and exits (`_call`);
  then KeyboardInterrupt. `jobs` > 1 runs that many points (or packs) at once,
  each pinned to its own share of this process's CPUs (Linux). Small CPU models
  use a few cores poorly: two runs pinned to one core each finish in about 0.55x
  the time of the two one after another on 2 cores (graphcore_cpu: ~52 s a point
  against ~95 s). Different
  thread counts reorder float sums, so a point is reproducible to seed noise, not
  bit for bit, across `jobs` settings (nor across `pack` settings: packing.py).
  """
  if not isinstance(jobs, int) or jobs < 1:
    raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
  config_file, workdir = os.path.abspath(config_file), os.path.abspath(workdir)
  _STOPPING.clear()  # a Ctrl-C of an earlier sweep in this process is over
  units = pack_units(config_file, points, workdir, pack)

  def run_unit(unit: list[int], cpus) -> list[tuple[Point, int]]:
    members = [points[i] for i in unit]
    states = [status(os.path.join(workdir, p.name)) for p in members]
    tag = (f"[{unit[0] + 1}/{len(points)}] {members[0].name}" if len(unit) == 1 else
           f"[{','.join(str(i + 1) for i in unit)}/{len(points)}] a pack of {len(unit)}")
    if all(s == "done" for s in states):
      log(f"{tag}: done, skipped")
      returncode = 0
    else:
      verb = "resuming" if "partial" in states else "starting"
      log(f"{tag}: {verb}" + ("" if len(unit) == 1 else
                              ": " + ", ".join(p.name for p in members)))
      start = time.perf_counter()
      command = (members[0].command(config_file, workdir) if len(unit) == 1 else
                 packing.command([p.run_spec(config_file, workdir) for p in members],
                                 sys.executable))
      returncode = _call(command, cpus)
      log(f"{tag}: exit {returncode} after {time.perf_counter() - start:.0f}s")
    failures = []
    for point in members:
      run_dir = os.path.join(workdir, point.name)
      if status(run_dir) != "done":
        failures.append((point, returncode or 1))
      elif point.eval_flags and not evaluated(run_dir):
        start = time.perf_counter()
        code = _call(point.eval_command(workdir), cpus)
        log(f"[{points.index(point) + 1}/{len(points)}] {point.name}: eval exit {code} after "
            f"{time.perf_counter() - start:.0f}s")
        if code:
          failures.append((point, code))
    return failures

  if jobs == 1:
    return [f for unit in units for f in run_unit(unit, None)]
  # A unit takes a free CPU share and gives it back when it is done.
  free = queue.Queue()
  for cpus in _cpu_shares(jobs):
    free.put(cpus)

  def job(unit: list[int]):
    cpus = free.get()
    try:
      return run_unit(unit, cpus)
    finally:
      free.put(cpus)

  with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    futures = [pool.submit(job, unit) for unit in units]
    try:
      results = [f.result() for f in futures]
    except KeyboardInterrupt:  # only this thread sees it: stop the workers' children
      for f in futures:
        f.cancel()
      _interrupt()
      raise
  return [f for r in results for f in r]


def pack_units(config_file: str, points: Sequence[Point], workdir: str,
               pack: int) -> list[list[int]]:
  """The indices of `points` in the order and groups `run_sweep` trains them: the
  points not done, in packs of at most `pack` that share a program
  (`packing.groups`); each done point alone (skipped, or only evaluated)."""
  if not isinstance(pack, int) or pack < 1:
    raise ValueError(f"pack must be a positive integer, got {pack!r}")
  todo = [i for i, p in enumerate(points) if status(os.path.join(workdir, p.name)) != "done"]
  if pack == 1 or len(todo) < 2:
    return [[i] for i in range(len(points))]
  configs = [packing.load_config(f"{config_file}:{points[i].arg}", dict(points[i].overrides))
             for i in todo]
  packs = [[todo[j] for j in group] for group in packing.groups(configs, pack)]
  done = [[i] for i in range(len(points)) if i not in set(todo)]
  return sorted(done + packs, key=lambda unit: unit[0])


# The children `_call` is waiting for, which a Ctrl-C must reach (`_interrupt`).
_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by a Ctrl-C: start no new child


def _call(command: list[str], cpus) -> int:
  """Runs `command` (train.py, eval.py: ROOT's) and returns its exit code; pinned
  to `cpus` if given.

  Pinned from here right after the start (not with preexec_fn, which is unsafe
  in a threaded parent): the child has not imported JAX yet, so every thread it
  makes inherits the affinity.

  Ctrl-C: the child runs in a process group of its own, so a terminal's Ctrl-C
  reaches this process alone, which passes one SIGINT on and waits for the child
  to save and exit (train.py: a checkpoint, exit 130), then raises
  KeyboardInterrupt. A second Ctrl-C while it saves is passed on too (train.py
  exits at once), then SIGKILL after 10 s (`_interrupt`). (In this process's
  group, the terminal's own SIGINT and a forwarded one would be two Ctrl-Cs to
  train.py, which exits without saving on the second.)
  """
  with _RUNNING_LOCK:
    if _STOPPING.is_set():  # a Ctrl-C came while this point waited for a CPU share
      return 130
    # The scripts from ROOT, in this process's folder: a point's config.imports
    # by module name resolve from where the sweep was started, as train.py's would.
    command = [os.path.join(ROOT, c) if i == 1 and c in ("train.py", "eval.py") else c
               for i, c in enumerate(command)]
    proc = subprocess.Popen(command, process_group=0)
    _RUNNING.add(proc)
  with proc:
    try:
      if cpus:
        try:
          os.sched_setaffinity(proc.pid, cpus)
        except ProcessLookupError:  # already gone: its exit code says why
          pass
      return proc.wait()
    except KeyboardInterrupt:
      _interrupt()
      raise
    except BaseException:  # no orphan
      proc.kill()
      raise
    finally:
      with _RUNNING_LOCK:
        _RUNNING.discard(proc)


def _interrupt() -> None:
  """Ctrl-C in this process: one SIGINT to every running child, then waits for them
  to save and exit. A second Ctrl-C passes a second SIGINT on (train.py then
  exits at once, releasing its lock) and kills what is left after 10 s."""
  with _RUNNING_LOCK:
    _STOPPING.set()
    children = list(_RUNNING)

  def signal_all():
    for proc in children:
      if proc.poll() is None:
        proc.send_signal(signal.SIGINT)

  signal_all()
  try:
    for proc in children:
      proc.wait()
  except KeyboardInterrupt:
    signal_all()
    deadline = time.monotonic() + 10
    for proc in children:
      try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        proc.kill()
    raise


def _cpu_shares(jobs: int) -> list:
  """This process's CPUs dealt into `jobs` disjoint sets (None each where the
  platform cannot pin, or there are fewer CPUs than jobs)."""
  if jobs == 1 or not hasattr(os, "sched_getaffinity"):
    return [None] * jobs
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) < jobs:
    return [None] * jobs
  return [set(cpus[j::jobs]) for j in range(jobs)]


def evaluated(run_dir: str) -> bool:
  """eval.json exists and is from the run's last step."""
  path = os.path.join(run_dir, "eval.json")
  if not os.path.exists(path):
    return False
  with open(path) as f, open(os.path.join(run_dir, "config.json")) as g:
    return json.load(f).get("step") == json.load(g)["num_train_steps"]


# ---------------------------------------------------------------------------
# Collecting results.

def read_run(run_dir: str) -> dict | None:
  """One row of the results table from a run directory (None if never started).

  final_train_loss is the last logged `train/loss_last20` (Graphcore's metric:
  the mean training loss over the last 20 steps); wall_s sums every process's
  `elapsed_s` (a resumed run adds its segments). A run that stopped on a NaN
  (loss or gradient norm) has status 'diverged' and final_train_loss NaN.
  max_logit is the largest attention logit of the last log row that has one
  (max over layers of `train/attn/max_logit/layer_<i>`; NaN without attention
  metrics); commit is the code the run came from (`provenance.commit_of`:
  "unknown" without a provenance.json), host the machine it trained on
  (`provenance.host_of`: the CPU's model and vector width, or the chip).
  """
  from attnscale.runtime import provenance  # here: this function's only use
  config_path = os.path.join(run_dir, "config.json")
  if not os.path.exists(config_path):
    return None
  with open(config_path) as f:
    config = configlib.migrate(json.load(f))
  records = []
  metrics_path = os.path.join(run_dir, "metrics.jsonl")
  if os.path.exists(metrics_path):
    with open(metrics_path) as f:
      records = [json.loads(line) for line in f if line.strip()]
  train = [r for r in records if "train/loss" in r]
  val = [r["val/loss"] for r in records if "val/loss" in r]
  wall, previous = 0.0, 0.0
  for r in train:
    elapsed = r.get("train/elapsed_s", 0.0)
    if elapsed < previous:  # a new process (resume) started a new segment
      wall += previous
    previous = elapsed
  state = status(run_dir, read_checkpoint=False)  # the metrics are what a row reads
  last_step = train[-1]["step"] if train else 0
  logits = [[v for k, v in r.items() if k.startswith("train/attn/max_logit/layer_")]
            for r in train]
  logits = [per_layer for per_layer in logits if per_layer]
  if state != "done" and not all(math.isfinite(r["train/loss"])
                                  and math.isfinite(r.get("train/grad_norm", 0.0)) for r in train):
    state = "diverged"
  model = config["model"]
  return {
      "scaling": configlib.run_label(ml_collections.ConfigDict(config)),
      "variant": model.get("variant", "standard"),
      "learning_rate": config["learning_rate"],
      "seed": config["seed"],
      "steps": last_step,
      "final_train_loss": train[-1].get("train/loss_last20", math.nan) if state == "done"
                          else math.nan,
      "best_val_loss": min(val) if val else math.nan,
      "wall_s": wall + previous,
      "status": state,
      "run": os.path.basename(os.path.normpath(run_dir)),
      "curve": [(r["step"], r["train/loss"]) for r in train],
      "max_logit": float(max(logits[-1])) if logits else math.nan,
      "commit": provenance.commit_of(run_dir),
      "host": provenance.host_of(run_dir),
  }


def collect(workdir: str, points: Sequence[Point] | None = None) -> list[dict]:
  """Rows for `points` (default: every run directory in `workdir`), sorted by
  scaling, learning rate and seed. A point not started yet has status 'new'."""
  if points is None:
    names = sorted(d for d in os.listdir(workdir) if os.path.isdir(os.path.join(workdir, d)))
  else:
    names = [p.name for p in points]
  labels = {p.name: dict(kv.partition("=")[::2] for kv in p.arg.split(",") if kv)
            | {_short(k): v for k, v in p.overrides} for p in points or ()}
  rows = []
  for name in names:
    row = read_run(os.path.join(workdir, name))
    if row is None:  # not started: what the point's argument says
      label = labels.get(name, {})
      row = {**{c: math.nan for c in COLUMNS}, "scaling": label.get("scaling", "?"),
             "learning_rate": label.get("lr", math.nan), "status": "new", "run": name,
             "curve": []}
    rows.append(row)
  return sorted(rows, key=lambda r: (str(r["scaling"]), _num(r["learning_rate"]),
                                     _num(r["seed"])))


def _num(x) -> float:
  return x if isinstance(x, (int, float)) else math.inf


def shell_commands(config_file: str, points: Sequence[Point], workdir: str,
                   pack: int = 1) -> list[str]:
  """One shell line per point (or pack of points, `pack_units`), for a cluster's job
  array or GNU parallel; each pack's line ends with its points' eval.py commands."""
  lines = []
  for unit in pack_units(config_file, points, workdir, pack):
    members = [points[i] for i in unit]
    train = (members[0].command(config_file, workdir, python="python") if len(unit) == 1 else
             packing.command([p.run_spec(config_file, workdir) for p in members], "python"))
    evals = [p.eval_command(workdir, python="python") for p in members]
    lines.append(" && ".join(shlex.join(c) for c in [train, *evals] if c))
  return lines
