r"""Runs a learning-rate x scaling sweep and writes its results table and figures.

  python sweep.py --config=configs/shakespeare_char.py --sweep=graphcore_cpu --workdir=runs/sweep
  python sweep.py --config=configs/shakespeare_char.py --sweep=graphcore --workdir=runs/gc \
      --print_commands          # one train.py line per point, for a cluster
  python sweep.py --config=configs/shakespeare_char.py --sweep=graphcore --workdir=runs/gc \
      --collect_only            # tables and figures from whatever has finished
  python sweep.py ... --jobs=2  # two points at once, each on half the CPUs
  python sweep.py ... --pack=8  # up to 8 points (seeds, rates) in one vmapped program
  python sweep.py ... --print_best_runs   # seed 0 at each scaling's best rate

The sweeps are data in configs/sweeps.py (a config's sweeps: sweeps.py next to
it, naming it). Each point is an ordinary train.py run in WORKDIR/<point>;
finished points are skipped and interrupted ones resume. Points that differ only
in seed, learning rate and the like train packed, K in one vmapped program
(--pack, default the sweep's), each still in its own run directory. Results:
WORKDIR/results.{csv,md}, WORKDIR/loss_vs_lr.png, WORKDIR/loss_curves.png.

A point's config.imports (the config's, or a point's override) reach its train.py
and eval.py through its config; this script imports them first, so a module that
cannot be imported fails the sweep in one line before any point runs.

A bad flag (a missing config file or sweep, a --workdir that is a file) exits
with one `error: ...` line naming it (attnscale/runtime/cli.py).
"""

import importlib.util
import os
import sys

from absl import app, flags

from attnscale.runtime import cli

_CONFIG = flags.DEFINE_string("config", None, "A config file with sweeps (sweeps.py next to it "
                              "names it: configs/sweeps.py).")
_SWEEP = flags.DEFINE_string("sweep", None, "The sweep's name (SWEEPS in the config's sweeps.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's directory: one sub-directory a point.")
_PRINT = flags.DEFINE_bool("print_commands", False, "Print each point's train.py command and exit.")
_JOBS = flags.DEFINE_integer("jobs", 1, "Points to run at once, each pinned to its share of the "
                             "CPUs (small CPU models: 2 on 2 cores is about 1.6x faster).")
_PACK = flags.DEFINE_integer(
    "pack", None, "Points to train at once in one vmapped program (those that differ only "
    "in seed, learning rate, weight decay or clipping: docs/guides/sweeps.md, \"Packing\"); "
    "default: the sweep's (configs/sweeps.py default_pack); 1 = one train.py a point.")
_BEST = flags.DEFINE_bool("print_best_runs", False, "Print the run directory of seed 0 at each "
                          "scaling's best learning rate (for the trained study) and exit.")
_COLLECT = flags.DEFINE_bool("collect_only", False, "Only write the results of finished points.")
_ARCHIVE = flags.DEFINE_string(
    "archive_to", None, "Also copy each finished point's records (config, metrics, provenance, "
    "eval.json; no weights) to this directory, for committing: copied back into a fresh "
    "--workdir, they count as done (attnscale/experiments/sweeps.py archive).")
flags.mark_flags_as_required(["config", "sweep", "workdir"])


def main(argv):
  del argv
  cli.check_workdir(_WORKDIR.value)
  if _JOBS.value < 1:
    cli.fail(f"--jobs must be a positive integer, got {_JOBS.value}")
  if _PACK.value is not None and _PACK.value < 1:
    cli.fail(f"--pack must be a positive integer, got {_PACK.value}")
  from attnscale.experiments import sweep_results, sweeps
  try:
    points = sweeps.load_sweep(_CONFIG.value, _SWEEP.value, _WORKDIR.value)
    pack = _PACK.value or sweeps.default_pack(_CONFIG.value, _SWEEP.value)
  except ValueError as e:
    cli.fail(str(e))
  if _BEST.value:
    rows = sweeps.collect(_WORKDIR.value, points)
    print(" ".join(os.path.join(_WORKDIR.value, run) for run in sweep_results.best_runs(rows)))
    return
  if _PRINT.value:
    print("\n".join(sweeps.shell_commands(_CONFIG.value, points, _WORKDIR.value, pack)))
    return
  failures = []
  if not _COLLECT.value:
    try:
      _import_modules(_CONFIG.value, points)
    except ValueError as e:
      cli.fail(str(e))
    try:
      failures = sweeps.run_sweep(_CONFIG.value, points, _WORKDIR.value, jobs=_JOBS.value,
                                  pack=pack)
      # A staged sweep adds points from its results (seeds at the best learning
      # rates): run until a reload adds nothing.
      while True:
        more = sweeps.load_sweep(_CONFIG.value, _SWEEP.value, _WORKDIR.value)
        if {p.name for p in more} <= {p.name for p in points}:
          break
        points = more
        failures += sweeps.run_sweep(_CONFIG.value, points, _WORKDIR.value, jobs=_JOBS.value,
                                   pack=pack)
    except KeyboardInterrupt:  # the running points have saved (sweeps._call)
      print("Ctrl-C: the sweep stopped after its running points saved; rerunning the same "
            "command resumes it", file=sys.stderr)
      sys.exit(130)
  rows = sweeps.collect(_WORKDIR.value, points)
  paths = sweep_results.write_results(rows, _WORKDIR.value, title=f"{_SWEEP.value} sweep")
  print(sweep_results.markdown_table(rows))
  print("wrote " + ", ".join(paths.values()))
  if _ARCHIVE.value:
    copied = sweeps.archive(_WORKDIR.value, _ARCHIVE.value)
    print(f"archived {len(copied)} finished points to {_ARCHIVE.value}")
  for point, code in failures:
    print(f"failed (exit {code}): {point.name}", file=sys.stderr)


def _import_modules(config_file: str, points) -> None:
  """Imports every point's config.imports (`configlib.import_modules`)."""
  from attnscale.runtime import configlib
  spec = importlib.util.spec_from_file_location("_sweep_config", config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for point in points:
    config = module.get_config(point.arg)
    config.imports = dict(point.overrides).get("imports", config.get("imports", ()))
    configlib.import_modules(config)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
