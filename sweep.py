r"""Runs a learning-rate x scaling sweep and writes its results table and figures.

  python sweep.py --config=configs/shakespeare_char.py --sweep=graphcore_cpu --workdir=runs/sweep
  python sweep.py --config=configs/shakespeare_char.py --sweep=graphcore --workdir=runs/gc \
      --print_commands          # one train.py line per point, for a cluster
  python sweep.py --config=configs/shakespeare_char.py --sweep=graphcore --workdir=runs/gc \
      --collect_only            # tables and figures from whatever has finished
  python sweep.py ... --archive_to=docs/results/NAME/runs.parquet   # records to commit (no weights)
  python sweep.py ... --jobs=2  # two points at once, each on half the CPUs
  python sweep.py ... --pack=8  # up to 8 points (seeds, rates) in one vmapped program
  python sweep.py ... --print_best_runs   # seed 0 at each scaling's best rate
  python sweep.py ... --workdir=docs/results/NAME/runs.parquet --retrain_best_to=runs/NAME_best
      # those runs trained again (with eval.json) where only their records are kept
  attnscale-sweep --config=shakespeare_char.py ...  # the same, from any folder

The sweeps are data in the config's own <config>_sweeps.py beside it
(configs/shakespeare_char_sweeps.py). Each point is an ordinary train.py run in WORKDIR/<point>;
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

# The flags and main: attnscale/commands/sweep.py (also the attnscale-sweep command).
from attnscale.commands.sweep import run

if __name__ == "__main__":
  run()
