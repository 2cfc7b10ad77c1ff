"""The width study: does the best learning rate transfer across width? And its
depth variant: across depth?

    python -m attnscale.studies width --out DIR --workdirs runs/width
    python -m attnscale.studies depth --out DIR --workdirs runs/depth

Reads the `width` sweep (configs/sweeps.py: each label's staged learning-rate
search at every width, seed 1 at each best, and every width at the smallest
width's best rate) and writes:

  width.md/csv          per label and width: the best rate on the grid and
                        interpolated, the band of near-best rates, the loss there
                        (mean and half-range over seeds), and the loss at the
                        smallest width's best rate ("transfer")
  width_slopes.md/csv   per label: the fitted slope of log2(best rate) against
                        log2(width) (0 = the rate transfers; -1 = it falls as 1/width)
  width_lr.png          loss against learning rate, one panel per label, one line
                        per width (the muP paper's figure)
  width_best.png        best rate against width with its band and fitted line
  width_transfer.png    the loss each width reaches at the smallest width's best
                        rate, minus its own best

The depth study reads the `depth` sweep (the same search over num_layers at width
64, with and without the depth rule) and writes the same files named depth*, with
"depth" (num_layers) for "width".

The interpolated best is the vertex of the parabola through the grid best and its
two neighbours in (log2 rate, loss), kept within one grid step; the band is the
range of rates whose (linearly interpolated) seed-0 loss is within `BAND` nats of
the best. Both use seed 0, the seed every rate has.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import numpy as np

from attnscale.experiments import reporting, stats, sweep_results, sweeps
from attnscale.studies import registry

BAND = 0.02  # nats: rates whose loss is within this of the best are "near-best"
# The study's axis -> the model field it reads from each run's config.json.
AXES = {"width": "width", "depth": "num_layers"}


def width_label(config: dict) -> str:
  """The study's label of a run: its parameterisation and attention setup."""
  import ml_collections

  from attnscale.runtime import configlib
  label = configlib.run_label(ml_collections.ConfigDict(config))
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


def _losses(rows, label, size, seed=0, axis="width") -> dict[float, float]:
  """log2(rate) -> final loss (NaN: diverged) of one label and size, one seed."""
  return {math.log2(r["learning_rate"]): r["final_train_loss"] for r in rows
          if r["label"] == label and r[axis] == size and r["seed"] == seed}


def interpolated_best(losses: dict[float, float]) -> tuple[float, float]:
  """(grid best, interpolated best) in log2(rate); NaN when all diverged
  (`stats.parabola_vertex`, the one implementation)."""
  return stats.parabola_vertex(losses)


def band(losses: dict[float, float], tol: float = BAND) -> tuple[float, float]:
  """The log2 rates where the loss (linear between grid points) is within `tol`
  of the best: (low, high); diverged points count as far above."""
  xs = sorted(losses)
  if not xs:
    return math.nan, math.nan
  ys = [losses[x] if math.isfinite(losses[x]) else math.inf for x in xs]
  best = min(ys)
  if not math.isfinite(best):
    return math.nan, math.nan
  cut = best + tol
  i = ys.index(best)
  j = i
  while j > 0 and ys[j - 1] <= cut:
    j -= 1
  lo = xs[j] if j == 0 or not math.isfinite(ys[j - 1]) else (
      xs[j - 1] + (xs[j] - xs[j - 1]) * (ys[j - 1] - cut) / (ys[j - 1] - ys[j]))
  j = i
  while j < len(xs) - 1 and ys[j + 1] <= cut:
    j += 1
  hi = xs[j] if j == len(xs) - 1 or not math.isfinite(ys[j + 1]) else (
      xs[j] + (xs[j + 1] - xs[j]) * (cut - ys[j]) / (ys[j + 1] - ys[j]))
  return lo, hi


def table_rows(rows: Sequence[dict], axis: str = "width") -> list[dict]:
  """One row per label and size on `axis` (see the module docstring)."""
  out = []
  for label in sorted({r["label"] for r in rows}):
    sizes = sorted({r[axis] for r in rows if r["label"] == label})
    grid0, _ = interpolated_best(_losses(rows, label, sizes[0], axis=axis))
    for w in sizes:
      losses = _losses(rows, label, w, axis=axis)
      grid, interp = interpolated_best(losses)
      lo, hi = band(losses)
      at_best = [r["final_train_loss"] for r in rows if r["label"] == label
                 and r[axis] == w and math.isfinite(grid)
                 and math.log2(r["learning_rate"]) == grid and r["status"] == "done"]
      transfer = losses.get(grid0, math.nan)
      out.append({
          "label": label, axis: w, "rates_tried": len(losses),
          "best_lr": 2.0**grid if math.isfinite(grid) else math.nan,
          "best_log2_lr": grid, "interp_log2_lr": interp, "band_lo": lo, "band_hi": hi,
          "best_loss": float(np.mean(at_best)) if at_best else math.nan,
          "seeds": len(at_best),
          "half_range": (max(at_best) - min(at_best)) / 2 if len(at_best) > 1 else math.nan,
          "loss_at_smallest_best": transfer,
          "transfer_gap": transfer - losses.get(grid, math.nan) if math.isfinite(grid)
                          else math.nan})
  return out


def slope_rows(table: Sequence[dict], axis: str = "width") -> list[dict]:
  """Per label: least-squares slope of the interpolated log2 best rate against
  log2 size, its standard error, and the slopes through the bands' edges."""
  out = []
  for label in sorted({r["label"] for r in table}):
    pts = [r for r in table if r["label"] == label and math.isfinite(r["interp_log2_lr"])]
    if len(pts) < 2:
      continue
    x = np.log2([r[axis] for r in pts])
    y = np.array([r["interp_log2_lr"] for r in pts])
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    se = (math.sqrt(np.sum(resid**2) / (len(x) - 2) / np.sum((x - x.mean())**2))
          if len(x) > 2 else math.nan)
    out.append({"label": label, f"{axis}s": len(pts), "slope": float(slope), "se": se,
                "slope_band_lo": float(np.polyfit(x, [r["band_lo"] for r in pts], 1)[0]),
                "slope_band_hi": float(np.polyfit(x, [r["band_hi"] for r in pts], 1)[0]),
                "worst_transfer_gap": float(np.nanmax([r["transfer_gap"] for r in pts]))})
  return out


def plot_lr(rows: Sequence[dict], axis: str = "width"):
  labels = sorted({r["label"] for r in rows})
  fig = reporting.new_figure(4.2 * len(labels), 4.2)
  axes = np.atleast_1d(fig.subplots(1, len(labels), sharey=True))
  finite = [r["final_train_loss"] for r in rows if math.isfinite(r["final_train_loss"])]
  for ax, label in zip(axes, labels):
    for i, w in enumerate(sorted({r[axis] for r in rows if r["label"] == label})):
      losses = _losses(rows, label, w, axis=axis)
      xs = sorted(losses)
      ax.plot([2.0**x for x in xs], [losses[x] for x in xs], label=f"{axis} {w}",
              **reporting.style(i))
    ax.set_xscale("log", base=2)
    reporting.label_axes(ax, xlabel="learning rate", ylabel="final training loss",
                         title=label)
    ax.legend(fontsize=7)
  if finite:
    axes[0].set_ylim(min(finite) - 0.05, min(max(finite), min(finite) + 1.0))
  return fig


def plot_best(table: Sequence[dict], slopes: Sequence[dict], axis: str = "width"):
  fig = reporting.new_figure(8, 5)
  ax = fig.subplots()
  slope_of = {s["label"]: s["slope"] for s in slopes}
  for i, label in enumerate(sorted({r["label"] for r in table})):
    pts = [r for r in table if r["label"] == label and math.isfinite(r["interp_log2_lr"])]
    w = np.array([r[axis] for r in pts], float) * (1 + 0.03 * (i - 2))  # dodge
    y = np.array([2.0**r["interp_log2_lr"] for r in pts])
    err = [y - 2.0**np.array([r["band_lo"] for r in pts]),
           2.0**np.array([r["band_hi"] for r in pts]) - y]
    ax.errorbar(w, y, yerr=np.abs(err), capsize=3,
                label=f"{label} (slope {slope_of.get(label, math.nan):+.2f})",
                **reporting.style(i))
  ax.set_xscale("log", base=2)
  ax.set_yscale("log", base=2)
  reporting.label_axes(ax, xlabel=axis, ylabel="best learning rate (interpolated)",
                       title=f"Best rate against {axis}; bars: rates within {BAND} nats")
  ax.legend(fontsize=8)
  return fig


def plot_transfer(table: Sequence[dict], axis: str = "width"):
  fig = reporting.new_figure(8, 5)
  ax = fig.subplots()
  for i, label in enumerate(sorted({r["label"] for r in table})):
    pts = [r for r in table if r["label"] == label]
    ax.plot([r[axis] for r in pts], [r["transfer_gap"] for r in pts], label=label,
            **reporting.style(i))
  ax.set_xscale("log", base=2)
  ax.axhline(0, color="k", lw=0.8)
  reporting.label_axes(ax, xlabel=axis, ylabel=f"loss at the smallest {axis}'s best rate "
                       "minus own best", title="Tune small, train big: what it costs")
  ax.legend(fontsize=8)
  return fig


def run_cli(args, axis: str = "width") -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies width|depth --out DIR --workdirs SWEEP_DIR`."""
  if len(args.workdirs) != 1:
    raise SystemExit(f"{axis}: give --workdirs SWEEP_DIR (the {axis} sweep's workdir)")
  rows = read_rows(args.workdirs[0], axis)
  if not rows:
    raise SystemExit(f"{axis}: no finished runs in {args.workdirs[0]}")
  table = table_rows(rows, axis)
  slopes = slope_rows(table, axis)
  notes = [f"{len(rows)} finished runs ({args.workdirs[0]}); final training loss = mean of "
           "the last 20 steps. Rates are 2^-e; log2 columns are log2(rate).",
           "interp_log2_lr: the parabola vertex through the grid best and its neighbours; "
           f"band_lo/hi: rates within {BAND} nats of the best (seed 0); best_loss: mean over "
           "the seeds at the grid best, half_range: (max - min)/2 over them.",
           f"loss_at_smallest_best: seed 0 at the smallest {axis}'s best rate; transfer_gap: "
           f"that minus this {axis}'s own best (seed 0).",
           registry.code_note(rows, args, axis) + "; every run: runs.csv."]
  fmt = {"formats": {"best_lr": reporting.power_of_two, axis: "d", "rates_tried": "d",
                     "seeds": "d"}, "floats": ".3f"}
  paths = reporting.write_tables(table, args.out, axis, title=f"{axis.capitalize()} study",
                                 notes=notes, **fmt)
  paths += reporting.write_tables(
      slopes, args.out, f"{axis}_slopes", floats=".2f",
      title=f"Best learning rate against {axis}: fitted log-log slopes",
      notes=[f"slope: least squares of the interpolated log2 best rate on log2 {axis} "
             f"(0: transfers; -1: falls as 1/{axis}), se its standard error; "
             "slope_band_lo/hi: the same through the bands' edges; worst_transfer_gap: the "
             f"largest loss paid at the smallest {axis}'s best rate (nats)."])
  paths.append(reporting.save_figure(plot_lr(rows, axis), args.out, f"{axis}_lr"))
  paths.append(reporting.save_figure(plot_best(table, slopes, axis), args.out, f"{axis}_best"))
  paths.append(reporting.save_figure(plot_transfer(table, axis), args.out, f"{axis}_transfer"))
  path = os.path.join(args.out, "runs.csv")
  sweep_results.write_runs_csv(rows, path)
  return paths + [path], notes


def run_depth_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies depth --out DIR --workdirs SWEEP_DIR`."""
  return run_cli(args, axis="depth")


# Read the width and depth sweeps' layouts: only when asked for.
WIDTH = registry.Study(run_cli, in_all=False, needs_workdirs=True)
DEPTH = registry.Study(run_depth_cli, in_all=False, needs_workdirs=True)
