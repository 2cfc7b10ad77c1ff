r"""attnscale-sweep: runs a learning-rate x scaling sweep and writes its results table and figures.

  attnscale-sweep --config=shakespeare_char.py --sweep=graphcore_cpu --workdir=runs/sweep
  attnscale-sweep --config=shakespeare_char.py --sweep=graphcore --workdir=runs/gc --print_commands

The same command as `python sweep.py ...` at the repository root (sweep.py's
docstring says more: packing, jobs, collecting). --config is a path from the
current folder or a name in the project's configs/; its sweeps are in its
<config>_sweeps.py beside it (`attnscale.experiments.sweeps.load_sweep`).
"""

import functools
import importlib.util
import os
import re
import sys
import types

from absl import app, flags

from attnscale.runtime import cli


def define_flags() -> types.SimpleNamespace:
  """Defines the command's flags (absl's global FLAGS); returns their holders."""
  holders = types.SimpleNamespace(
      config=flags.DEFINE_string(
          "config", None, "A config file with sweeps (its <config>_sweeps.py beside it: "
          "configs/shakespeare_char_sweeps.py): a path, or a name in the project's configs/."),
      sweep=flags.DEFINE_string("sweep", None,
                                "The sweep's name (SWEEPS in the config's _sweeps.py)."),
      workdir=flags.DEFINE_string("workdir", None,
                                  "The sweep's directory: one sub-directory a point."),
      print_commands=flags.DEFINE_bool("print_commands", False,
                                       "Print each point's train.py command and exit."),
      jobs=flags.DEFINE_integer(
          "jobs", 1, "Points to run at once, each pinned to its share of the CPUs (small "
          "CPU models: 2 on 2 cores is about 1.6x faster)."),
      pack=flags.DEFINE_integer(
          "pack", None, "Points to train at once in one vmapped program (those that differ "
          "only in seed, learning rate, weight decay or clipping: docs/guides/sweeps.md, "
          "\"Packing\"); default: the sweep's (PACK_BY_PRESET in its _sweeps.py); 1 = one "
          "train.py a point."),
      print_best_runs=flags.DEFINE_bool(
          "print_best_runs", False, "Print the run directory of seed 0 at each scaling's "
          "best learning rate (for the trained study) and exit."),
      retrain_best_to=flags.DEFINE_string(
          "retrain_best_to", None, "Train seed 0 at each scaling's best learning rate again "
          "into this directory (then evaluate it: eval.json) and exit: the trained study's "
          "input where --workdir holds records without weights (a committed store, "
          "docs/results/<study>/runs.parquet). Same config and seed; a different pack reorders "
          "float sums, so it prints each run's recorded and retrained loss side by side."),
      only=flags.DEFINE_string(
          "only", None, "Run only the points whose name matches this regular expression "
          "(re.search; e.g. 'width256' to give a lent GPU the costly points); the rest are "
          "left for another run of the same sweep, and the results table lists them all."),
      collect_only=flags.DEFINE_bool("collect_only", False,
                                     "Only write the results of finished points."),
      results_to=flags.DEFINE_string(
          "results_to", None, "Write the results (results.md/csv, runs.csv, figures) here "
          "instead of into --workdir: with --collect_only on a committed store "
          "(--workdir=docs/results/<study>/runs.parquet), a study page's tables again."),
      archive_to=flags.DEFINE_string(
          "archive_to", None, "Also add each finished point's records (config, metrics, "
          "provenance, eval.json; no weights) to this results store, for committing "
          "(docs/results/<study>/runs.parquet, or runs.parquet/FOLDER for one of several "
          "folders; written whole to a temporary file and renamed: "
          "attnscale/experiments/results_store.py), or copy them into this directory; "
          "unpacked into a fresh --workdir, they count as done (run_records.archive); as "
          "each point finishes, after each stage of a staged sweep and at the end."),
      evaluate=flags.DEFINE_bool(
          "evaluate", False, "Evaluate each finished point on the whole validation split "
          "(eval.py; eval.json) after each stage, before --archive_to copies it: an archived "
          "run has no weights left to evaluate."))
  flags.mark_flags_as_required(["config", "sweep", "workdir"])
  return holders


def main(holders: types.SimpleNamespace, argv: list[str]) -> None:
  """Runs (or prints, or collects) the sweep; writes its results."""
  del argv
  h = holders
  config, sweep, workdir = h.config.value, h.sweep.value, h.workdir.value
  from attnscale.experiments import results_store
  if results_store.is_store(workdir):  # a committed store: read it unpacked
    if not (h.collect_only.value or h.print_best_runs.value or h.retrain_best_to.value):
      cli.fail(f"--workdir={workdir} is a results store, which a sweep reads but does not "
               "train in: unpack it into a run folder to resume from it (python -m "
               f"attnscale.experiments.results_store unpack {workdir} runs/NAME)")
    try:
      workdir = results_store.workdir(workdir)
    except (ValueError, FileNotFoundError) as e:
      cli.fail(f"--workdir: {e}")
  else:
    cli.check_workdir(workdir)
  if h.jobs.value < 1:
    cli.fail(f"--jobs must be a positive integer, got {h.jobs.value}")
  if h.pack.value is not None and h.pack.value < 1:
    cli.fail(f"--pack must be a positive integer, got {h.pack.value}")
  from attnscale.experiments import sweep_results, sweeps
  try:
    only = re.compile(h.only.value or "")
  except re.error as e:
    cli.fail(f"--only must be a regular expression, got {h.only.value!r}: {e}")
  try:
    points = sweeps.load_sweep(config, sweep, workdir)
    pack = h.pack.value or sweeps.default_pack(config, sweep)
  except ValueError as e:
    cli.fail(str(e))
  if h.print_best_runs.value:
    rows = sweeps.collect(workdir, points)
    print(" ".join(os.path.join(results_store.shown(workdir), run)
                   for run in sweep_results.best_runs(rows)))
    return
  if h.retrain_best_to.value:
    retrain_best(h, config, points, workdir, pack)
    return
  if h.print_commands.value:
    print("\n".join(sweeps.shell_commands(
        config, [p for p in points if only.search(p.name)], workdir, pack)))
    return
  failures = []
  if not h.collect_only.value:
    try:
      import_modules(config, points)
    except ValueError as e:
      cli.fail(str(e))
    # Each point is archived as soon as it finishes: a machine taken away mid-stage
    # (a kill, not a Ctrl-C) loses nothing that finished. --evaluate's eval.json
    # joins the archive when its stage ends (keep_records).
    archive_one = None if not h.archive_to.value else (
        lambda point: results_store.archive(workdir, h.archive_to.value, [point.name]))
    run = lambda pts: sweeps.run_sweep(
        config, [p for p in pts if only.search(p.name)], workdir, jobs=h.jobs.value,
        pack=pack, on_done=archive_one)
    try:
      failures = run(points)
      # A staged sweep adds points from its results (seeds at the best learning
      # rates): run until a reload adds nothing. Each stage's records are kept
      # (evaluated, archived) before the next starts: a session may end mid-sweep.
      while True:
        more = sweeps.load_sweep(config, sweep, workdir)
        if {p.name for p in more} <= {p.name for p in points}:
          break
        keep_records(h, workdir)  # the last stage's: below, with the results
        points = more
        failures += run(points)
    except KeyboardInterrupt:  # the running points have saved (sweeps._call)
      # What finished in the stage it cut short, kept too (a lent machine goes away with
      # its workdir); not evaluated (minutes): a later --evaluate run on the same workdir,
      # which still holds the weights, evaluates and archives them again.
      keep_records(h, workdir, evaluate=False)
      print("Ctrl-C: the sweep stopped after its running points saved; rerunning the same "
            "command resumes it", file=sys.stderr)
      sys.exit(130)
  rows = sweeps.collect(workdir, points)
  paths = sweep_results.write_results(rows, h.results_to.value or workdir,
                                      title=f"{sweep} sweep")
  print(sweep_results.markdown_table(rows))
  print("wrote " + ", ".join(paths.values()))
  keep_records(h, workdir)
  for point, code in failures:
    print(f"failed (exit {code}): {point.name}", file=sys.stderr)


def retrain_best(h: types.SimpleNamespace, config: str, points, workdir: str,
                 pack: int) -> None:
  """--retrain_best_to: seed 0 at each best rate (`sweep_results.best_runs`, chosen on
  --workdir's records) trained and evaluated again in its own directory; resumes."""
  from attnscale.experiments import run_records, sweep_results, sweeps
  dest = h.retrain_best_to.value
  cli.check_workdir(dest)
  rows = {r["run"]: r for r in sweeps.collect(workdir, points)}
  names = sweep_results.best_runs(list(rows.values()))
  if not names:
    cli.fail(f"--retrain_best_to: no finished seed-0 run at a best rate in {workdir}")
  best = [p for p in points if p.name in names]
  try:
    import_modules(config, best)
  except ValueError as e:
    cli.fail(str(e))
  failures = sweeps.run_sweep(config, best, dest, jobs=h.jobs.value, pack=pack)
  run_records.evaluate_finished(dest)
  again = {r["run"]: r for r in sweeps.collect(dest, best)}
  print("| run | recorded final loss | retrained | difference |\n|---|---:|---:|---:|")
  for name in names:
    was, now = rows[name]["final_train_loss"], again[name]["final_train_loss"]
    print(f"| {name} | {was:.4f} | {now:.4f} | {now - was:+.4f} |")
  print("trained study: python -m attnscale.studies trained --out OUT --workdirs "
        + " ".join(os.path.join(dest, name) for name in names))
  for point, code in failures:
    print(f"failed (exit {code}): {point.name}", file=sys.stderr)


def keep_records(h: types.SimpleNamespace, workdir: str, *, evaluate: bool = True) -> None:
  """--evaluate (unless `evaluate` is False), then --archive_to, over the finished
  points so far."""
  from attnscale.experiments import results_store, run_records
  if evaluate and h.evaluate.value:
    evaluated = run_records.evaluate_finished(workdir)
    print(f"evaluated {len(evaluated)} finished points (eval.json)")
  if h.archive_to.value:
    copied = results_store.archive(workdir, h.archive_to.value)
    print(f"archived {len(copied)} finished points to {h.archive_to.value}")


def import_modules(config_file: str, points) -> None:
  """Imports every point's config.imports (`config_imports.import_modules`), so a
  module that cannot be imported fails the sweep before any point runs."""
  from attnscale.config import imports as config_imports
  spec = importlib.util.spec_from_file_location("_sweep_config", config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for point in points:
    config = module.get_config(point.arg)
    config.imports = dict(point.overrides).get("imports", config.get("imports", ()))
    config_imports.import_modules(config)


def run() -> None:
  """The command line (attnscale-sweep, sweep.py)."""
  holders = define_flags()
  cli.set_help(__doc__, __name__)
  app.run(functools.partial(main, holders),
          flags_parser=functools.partial(cli.parse_flags, config_file_flag="config"))
