"""The width study: does the best learning rate transfer across width? And its
depth variant: across depth?

    python -m attnscale.studies width --out DIR --workdirs runs/width
    python -m attnscale.studies depth --out DIR --workdirs runs/depth

Reads the `width` sweep (configs/shakespeare_char_sweeps.py: each label's staged learning-rate
search at every width, seed 1 at each best, and every width at the smallest
width's best rate) and writes:

  width.md/csv          per label and width: the best rate on the seed means (grid and
                        interpolated, with its bootstrap interval), the near-best band,
                        the seeds and loss [95% t] there, and the loss at the smallest
                        width's best rate ("transfer", paired by seed where it can be)
  width_slopes.md/csv   per label: the slope of log2(best rate) against log2(width)
                        with its bootstrap interval over seeds (0 = the rate
                        transfers; -1 = it falls as 1/width)
  width_lr.png          loss against learning rate, one panel per label, one line
                        per width (the muP paper's figure), seed mean and range
  width_best.png        best rate against width with its bootstrap bars and the fit
  width_transfer.png    the loss each width reaches at the smallest width's best
                        rate, minus its own best

The depth study reads the `depth` sweep (the same search over num_layers at width
64, with and without the depth rule) and writes the same files named depth*, with
"depth" (num_layers) for "width".

Every statistic is the transfer study's (attnscale/studies/transfer.py, from
attnscale/experiments/stats.py), with the size axis as a parameter: the study
protocol's best on the seed means and near-best band, and the bootstrap slope.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from attnscale.experiments import reporting, results_store, sweep_results, sweeps
from attnscale.studies import registry, transfer

# The study's axis -> the model field it reads from each run's config.json.
AXES = {"width": "width", "depth": "num_layers"}


def width_label(config: dict) -> str:
  """The study's label of a run: the one its sweep declared (config.label), else its
  parameterisation and attention setup ("sp/standard", "mup", "unit_scaled")."""
  from attnscale.config import labels
  if config.get("label"):
    return config["label"]
  label = labels.run_label(config)
  model = config["model"]
  if model.get("parameterization", "sp") == "mup":  # run_label ends "+mup"
    return "mup" if label == "standard+mup" else label
  return label if model.get("variant", "standard") != "standard" else f"sp/{label}"


def read_rows(workdir: str, axis: str = "width") -> list[dict]:
  """The sweep's finished rows, each with its "label" and its size on `axis`
  ("width" or "depth": AXES)."""
  rows = []
  for row in sweeps.collect(workdir):
    if row["status"] not in ("done", "diverged"):
      continue
    with open(os.path.join(workdir, row["run"], "config.json")) as f:
      config = json.load(f)
    rows.append({**row, "label": width_label(config), axis: config["model"][AXES[axis]]})
  return rows


def table_rows(rows: Sequence[dict], axis: str = "width") -> list[dict]:
  """One row per label and size on `axis`, with the transfer study's statistics
  (`transfer.table_rows`: best on the seed means, near-best band, loss interval,
  transfer loss)."""
  return transfer.table_rows(rows, slopes(rows, axis), axis)


def slopes(rows: Sequence[dict], axis: str = "width") -> dict:
  """Per label, `stats.best_rate_slope` over its sizes (`transfer.slopes`)."""
  return transfer.slopes(rows, axis=axis)


def plot_transfer(table: Sequence[dict], axis: str = "width"):
  fig = reporting.new_figure(8, 5)
  ax = fig.subplots()
  for i, label in enumerate(sorted({r["label"] for r in table})):
    pts = [r for r in table if r["label"] == label]
    loss = np.array([r["transfer_loss"] for r in pts], float)
    # The paired 95% t-interval where both rates have seeds (else seed 0 alone: no bar).
    lo = np.array([r["transfer_lo"] for r in pts], float)
    hi = np.array([r["transfer_hi"] for r in pts], float)
    err = np.nan_to_num([loss - lo, hi - loss])
    ax.errorbar([r[axis] for r in pts], loss, yerr=err, capsize=2, label=label,
                **reporting.style(i))
  ax.set_xscale("log", base=2)
  ax.axhline(0, color="k", lw=0.8)
  reporting.label_axes(ax, xlabel=axis, ylabel=f"loss at the smallest {axis}'s best rate "
                       "minus own best", title="Tune small, train big: what it costs "
                       "(bars: paired 95% t where seeded)")
  ax.legend(fontsize=8)
  return fig


def run_cli(args, axis: str = "width") -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies width|depth --out DIR --workdirs SWEEP_DIR`."""
  if len(args.workdirs) != 1:
    raise SystemExit(f"{axis}: give --workdirs SWEEP_DIR (the {axis} sweep's workdir)")
  rows = read_rows(args.workdirs[0], axis)
  if not rows:
    raise SystemExit(f"{axis}: no finished runs in {results_store.shown(args.workdirs[0])}")
  fits = slopes(rows, axis)
  table = transfer.table_rows(rows, fits, axis)
  code = registry.code_note(rows, args, axis)
  notes = transfer.table_notes(rows, results_store.shown(args.workdirs[0]), code, axis,
                               logits=False)
  formats = {"best_lr": reporting.power_of_two, "transfer_lr": reporting.power_of_two}
  paths = reporting.write_tables(table, args.out, axis, title=f"{axis.capitalize()} study",
                                 notes=notes, floats=".3f", formats=formats)
  paths += reporting.write_tables(
      transfer.slope_rows(table, fits, axis), args.out, f"{axis}_slopes", floats=".2f",
      title=f"Best learning rate against {axis}: slopes",
      notes=[transfer.slope_note(axis), code])
  paths.append(reporting.save_figure(transfer.plot_lr(rows, axis), args.out, f"{axis}_lr"))
  paths.append(reporting.save_figure(transfer.plot_best(table, fits, axis), args.out,
                                     f"{axis}_best"))
  paths.append(reporting.save_figure(plot_transfer(table, axis), args.out, f"{axis}_transfer"))
  path = os.path.join(args.out, "runs.csv")
  sweep_results.write_runs_csv(rows, path, hyperparameters=(axis,))
  return paths + [path], notes


def run_depth_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies depth --out DIR --workdirs SWEEP_DIR`."""
  return run_cli(args, axis="depth")


# Read the width and depth sweeps' layouts: only when asked for.
WIDTH = registry.Study(run_cli, in_all=False, needs_workdirs=True)
DEPTH = registry.Study(run_depth_cli, in_all=False, needs_workdirs=True)
