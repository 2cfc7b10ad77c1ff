"""Learning-rate x scaling sweeps: points as data, ordinary train.py runs, one table.

A sweep is a list of points, each a config argument plus field overrides,
defined as data in `<config>_sweeps.py` beside its config
(configs/shakespeare_char_sweeps.py for configs/shakespeare_char.py; the shapes
are attnscale/experiments/sweep_builders.py; see `load_sweep`):

    {"arg": "preset=graphcore,scaling=fully_scaled,seed=0",
     "overrides": {"learning_rate": 2**-9}}

Each point is one `train.py` command in its own sub-directory of the sweep's
workdir, so a point can run anywhere (a cluster array job, a second machine)
and `train.py` resumes it where it stopped. `run_sweep` runs the points (one
after another, or `jobs` at a time), skipping finished ones; `collect` reads
every point's `config.json` and `metrics.jsonl` into rows, which
`attnscale/experiments/sweep_results.py` turns into tables and figures (`write_results`).
What one run directory says (done or not, its row, its archived records) is
`attnscale/experiments/run_records.py`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import inspect
import math
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from attnscale.experiments import run_records, sweep_results
from attnscale.runtime import packing

# Where train.py is: the repository root, above attnscale/experiments/.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of a sweep: `train.py --config=FILE:arg --config.K=V ...`."""

  arg: str
  overrides: tuple[tuple[str, object], ...] = ()
  # eval.py flags to run after training (e.g. ("--lengths=64,128",)); () = no eval.
  eval_flags: tuple[str, ...] = ()
  # The sweep's label for the run (config.label): what its study groups it by. Not
  # part of `name`, so declaring it leaves every run directory where it was.
  label: str = ""

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
    return cmd + [f"--config.{key}={value}" for key, value in self._overrides()]

  def _overrides(self) -> tuple[tuple[str, object], ...]:
    return self.overrides + ((("label", self.label),) if self.label else ())


  def run_spec(self, config_file: str, workdir: str) -> dict:
    """This point as one run of a pack (`attnscale.runtime.packing.command`)."""
    return {"config": f"{config_file}:{self.arg}", "overrides": dict(self._overrides()),
            "workdir": os.path.join(workdir, self.name)}

  def eval_command(self, workdir: str, python: str = sys.executable) -> list[str]:
    """The eval.py command line run after training ([] when the point has none)."""
    if not self.eval_flags:
      return []
    return [python, "eval.py", f"--workdir={os.path.join(workdir, self.name)}",
            *self.eval_flags]


def _short(key: str) -> str:
  return {"learning_rate": "lr"}.get(key, key.rsplit(".", 1)[-1])


SWEEPS_SUFFIX = "_sweeps.py"  # a config X.py's sweeps: X_sweeps.py beside it


def load_sweep(config_file: str, name: str, workdir: str | None = None) -> list[Point]:
  """The points of sweep `name` of `config_file`.

  A config's sweeps are data in its own `<config>_sweeps.py` beside it
  (configs/shakespeare_char_sweeps.py), which names the config it is for (`CONFIG`,
  a file name in the same directory) and maps each sweep's name to a
  `sweep_builders.Sweep` in `SWEEPS` (a staged sweep adds points from the results
  so far in `workdir`: the seeds at each label's best learning rate,
  `attnscale.experiments.lr_search`). A file that builds its points itself
  defines `get_sweep(name)` (or `get_sweep(name, workdir=...)`) instead, SWEEPS
  then naming the sweeps.

  Raises:
    ValueError: the config has no sweeps, or no sweep of that name (the
      message lists the known ones).
  """
  module = sweeps_module(config_file)
  known = getattr(module, "SWEEPS", ())
  if name not in known:
    raise ValueError(f"--sweep must be one of {list(known)}, got {name!r}")
  if hasattr(module, "get_sweep"):
    takes_workdir = "workdir" in inspect.signature(module.get_sweep).parameters
    specs = module.get_sweep(name, workdir=workdir) if takes_workdir else module.get_sweep(name)
  else:
    specs = known[name].points(workdir)
  points = [Point(p["arg"], tuple(sorted(p.get("overrides", {}).items())),
                  tuple(p.get("eval", ())), p.get("label", ""))
            for p in specs]
  names = [p.name for p in points]
  if len(set(names)) != len(names):
    raise ValueError(f"sweep {name!r} has two points with the same directory name")
  return points


def sweep_names(config_file: str) -> list[str]:
  """The names of `config_file`'s sweeps (its sweeps module's `SWEEPS`), in order."""
  return list(sweeps_module(config_file).SWEEPS)


def default_pack(config_file: str, name: str) -> int:
  """The pack size sweep `name` runs with by default: its sweeps module's
  `default_pack(name)` if it defines one, else `PACK_BY_PRESET[preset]` of the
  sweep's preset, else 1 (unpacked)."""
  module = sweeps_module(config_file)
  if hasattr(module, "default_pack"):
    return module.default_pack(name)
  known = getattr(module, "SWEEPS", ())
  preset = getattr(known.get(name), "preset", None) if isinstance(known, dict) else None
  return getattr(module, "PACK_BY_PRESET", {}).get(preset, 1)


# The project's configs/ (beside the package in a clone), where the studies find
# the sweeps whose labels they read.
PROJECT_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs")


def declared(config_name: str, name: str):
  """`name` (a label declaration: NORMALISERS, SINK_LABELS, ...) of the sweeps file of
  the project's config `config_name` (configs/<config_name>)."""
  return getattr(sweeps_module(os.path.join(PROJECT_CONFIGS, config_name)), name)


def sweeps_module(config_file: str):
  """The sweeps module of `config_file`: its own <config>_sweeps.py beside it."""
  directory, config_name = os.path.split(os.path.abspath(config_file))
  if config_name == "sweeps.py" and not os.path.isfile(config_file):
    raise ValueError(f"--config {config_file}: configs/sweeps.py is now "
                     "configs/shakespeare_char_sweeps.py; pass the task's config, "
                     "--config=configs/shakespeare_char.py")
  if not os.path.isfile(config_file):
    raise ValueError(f"--config {config_file} is not a config file")
  own = config_name.removesuffix(".py") + SWEEPS_SUFFIX
  path = os.path.join(directory, own)
  module = None
  if os.path.isfile(path):
    spec = importlib.util.spec_from_file_location("_sweeps", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  if module is None and os.path.isfile(os.path.join(directory, "sweeps.py")):
    raise ValueError(f"--config {config_file}: a sweeps.py beside it is no longer read; "
                     f"its sweeps go in {own} (CONFIG = {config_name!r})")
  if module is None or getattr(module, "CONFIG", None) != config_name:
    raise ValueError(f"--config {config_file} defines no sweeps (no {own} beside it "
                     f"with CONFIG = {config_name!r})")
  return module


def run_sweep(config_file: str, points: Sequence[Point], workdir: str, *,
              log=print, jobs: int = 1, pack: int = 1,
              on_done: Callable[[Point], None] | None = None) -> list[tuple[Point, int]]:
  """Runs every point that is not finished (done or diverged); returns the failures.

  `on_done(point)` is called as soon as a point (or a pack) this call ran has
  finished (and, with `eval_flags`, been evaluated) or diverged: sweep.py archives it there, so
  a machine that is taken away (a lent GPU's time limit kills what a Ctrl-C cannot
  stop quickly: a pack still compiling) loses no finished point.

  A point that diverges (a NaN at a too-high learning rate, say) is a result, not
  a failure: logged, handed to `on_done`, and never rerun (`status`). A point that
  fails otherwise (a non-zero exit, a kill) is reported and the sweep goes on; its
  directory keeps what it had, and the next call resumes it. A point with
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
  bit for bit, across `jobs` settings (nor across `pack` settings: packing.py). With
  `pack` > 1 every point trains in a program of `pack` slots, a short last pack
  padded, so a point's numbers do not depend on which points it shared a pack with.
  """
  if not isinstance(jobs, int) or jobs < 1:
    raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
  config_file, workdir = os.path.abspath(config_file), os.path.abspath(workdir)
  env = children_env(jobs)
  _STOPPING.clear()  # a Ctrl-C of an earlier sweep in this process is over
  units = pack_units(config_file, points, workdir, pack)

  def run_unit(unit: list[int], cpus) -> list[tuple[Point, int]]:
    members = [points[i] for i in unit]
    states = [run_records.status(os.path.join(workdir, p.name)) for p in members]
    tag = (f"[{unit[0] + 1}/{len(points)}] {members[0].name}" if len(unit) == 1 else
           f"[{','.join(str(i + 1) for i in unit)}/{len(points)}] a pack of {len(unit)}")
    if all(s in run_records.FINISHED for s in states):
      log(f"{tag}: {'done' if set(states) == {'done'} else 'finished (diverged)'}, skipped")
      returncode = 0
    else:
      verb = "resuming" if "partial" in states else "starting"
      log(f"{tag}: {verb}" + ("" if len(unit) == 1 else
                              ": " + ", ".join(p.name for p in members)))
      start = time.perf_counter()
      # Packed sweeps train every point at their pack size (a short pack padded).
      command = (members[0].command(config_file, workdir) if pack == 1 else
                 packing.command([p.run_spec(config_file, workdir) for p in members],
                                 sys.executable, pack_size=pack))
      returncode = _call(command, cpus, env)
      log(f"{tag}: exit {returncode} after {time.perf_counter() - start:.0f}s")
    failures = []
    for point in members:
      run_dir = os.path.join(workdir, point.name)
      state = run_records.status(run_dir)
      if state == "diverged":  # an outcome, not a failure (run_records.status)
        if states[members.index(point)] != "diverged":
          log(f"[{points.index(point) + 1}/{len(points)}] {point.name}: diverged (a result: "
              "kept, archived and not rerun; delete its directory to retry it)")
          if on_done is not None:
            on_done(point)
        continue
      if state != "done":
        failures.append((point, returncode or 1))
        continue
      if point.eval_flags and not run_records.evaluated(run_dir):
        start = time.perf_counter()
        code = _call(point.eval_command(workdir), cpus, env)
        log(f"[{points.index(point) + 1}/{len(points)}] {point.name}: eval exit {code} after "
            f"{time.perf_counter() - start:.0f}s")
        if code:
          failures.append((point, code))
          continue
      if on_done is not None and not all(s in run_records.FINISHED for s in states):
        on_done(point)
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
  todo = [i for i, p in enumerate(points)
          if run_records.status(os.path.join(workdir, p.name)) not in run_records.FINISHED]
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


def children_env(jobs: int, environ=None) -> dict[str, str] | None:
  """The environment of a sweep's children: None (this process's) for one at a time;
  for several, XLA_PYTHON_CLIENT_PREALLOCATE=false unless the user set it, because
  on a GPU each JAX process otherwise takes 75% of its memory at start and the
  second one fails. Nothing changes on a CPU."""
  environ = dict(os.environ if environ is None else environ)
  if jobs == 1 or "XLA_PYTHON_CLIENT_PREALLOCATE" in environ:
    return None
  return environ | {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def _call(command: list[str], cpus, env: dict[str, str] | None = None) -> int:
  """Runs `command` (train.py, eval.py: ROOT's) and returns its exit code; pinned
  to `cpus` if given, in `env` (None: this process's environment).

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
    proc = subprocess.Popen(command, process_group=0, env=env)
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


# ---------------------------------------------------------------------------
# Collecting results.

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
    row = run_records.read_run(os.path.join(workdir, name))
    if row is None:  # not started: what the point's argument says
      label = labels.get(name, {})
      row = {**{c: math.nan for c in sweep_results.COLUMNS}, "scaling": label.get("scaling", "?"),
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
    train = (members[0].command(config_file, workdir, python="python") if pack == 1 else
             packing.command([p.run_spec(config_file, workdir) for p in members], "python",
                             pack_size=pack))
    evals = [p.eval_command(workdir, python="python") for p in members]
    lines.append(" && ".join(shlex.join(c) for c in [train, *evals] if c))
  return lines


# Names that live in run_records (a run directory's status, records and row) and
# sweep_results (the tables and figures): asked for here, a one-line error naming where.
_MOVED = dict.fromkeys(("ARCHIVED", "FINISHED", "RECORDS", "archive", "checkpoint_steps",
                        "evaluate_finished", "evaluated", "read_run", "status"), "run_records")
_MOVED |= dict.fromkeys(("COLUMNS", "TEXT_COLUMNS", "best_per_scaling", "best_runs",
                         "best_table", "markdown_table", "plot_best", "plot_loss_curves",
                         "plot_loss_vs_lr", "standard_error", "within_noise", "write_results"),
                        "sweep_results")


def __getattr__(name):
  if name in _MOVED:
    raise AttributeError(f"attnscale.experiments.sweeps.{name} is "
                         f"attnscale.experiments.{_MOVED[name]}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
