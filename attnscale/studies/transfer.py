"""The transfer study (docs/experiments/transfer.md): which parameterisation, optimizer and attention
keep the best learning rate in place as the model widens, and the loss insensitive
to it?

    python -m attnscale.studies transfer --out DIR --workdirs runs/transfer

Reads the `transfer` sweep (configs/shakespeare_char_sweeps.py: {sp + Adam, muP + Adam, sp + Muon} x
attention {standard, qk_rmsnorm, cosine}, u-muP, sp + Muon + QK-clip, and two
controls, sp + Adam with 1/d attention and the unit-scaled model at one Adam rate, at
widths 32 ... 256, and 512 for six labels where the `transfer_512` sweep has run; each label and width its own staged search under the study protocol, 3
seeds at every near-best rate, and every width at the smallest width's best rate,
seed 0) and writes:

  transfer_summary.md/csv  one line per label: the bests, what is unfinished, the
                           slope, and at the largest width the transfer loss, the
                           loss against the reference and S's slope (transfer_summary.py)
  transfer.md/csv          per label and width: the best rate on the seed means (grid
                           and interpolated, with its bootstrap interval), the
                           near-best band, the seeds and loss [95% t] there, the
                           largest attention logit there, and the transfer loss
  transfer_slopes.md/csv   per label: slope of log2(best rate) on log2(width) with its
                           bootstrap interval; does it cover 0 (transfers) or -1?
  transfer_sensitivity.md/csv
                           per label and width: Wortsman et al.'s sensitivity S
  transfer_sensitivity_slopes.md/csv
                           per label: slope of S on log2(width), 95% t-interval
  transfer_sensitivity_versus.md/csv
                           per label and width: S minus the reference label's
                           (--reference), paired by seed
  transfer_versus.md/csv   per label and width: the loss at its best minus the
                           reference's at its own, paired by seed
  transfer_logits.md/csv   per label, width and rate (seed 0): the largest attention
                           logit at the last logged step and anywhere in the run
  transfer_lr.png, transfer_best.png, transfer_sensitivity.png, transfer_logits.png
  runs.csv                 every run: label, width, rate, seed, losses, logits, commit

Every statistic is attnscale/experiments/stats.py's. Per label and width, with the
losses {log2 rate: {seed: final loss}} (a rate where any seed diverged counts as
diverged, as in the search):

* best: the lowest seed mean (`stats.parabola_vertex` on the means: grid best and the
  vertex of the parabola through it and its neighbours); band:
  `stats.near_best_band` (the rates not measurably worse than the best); loss at the
  best: `stats.mean_interval` over its seeds. Every rate counts, the transfer run too.
* transfer loss: the loss at the smallest width's best rate minus this width's own
  best; `stats.compare` (paired by seed) where both rates have >= 2 shared seeds (the
  smallest width's best inside this width's band), else seed 0 alone, no interval
  (`transfer_basis` says which).
* slope: `stats.best_rate_slope`, log2(best) = slope log2(width) + c, with a bootstrap
  interval over seeds (read it as roughly 90% with 3 seeds: its docstring).

Learning-rate sensitivity (Wortsman et al. 2023's S, per label and width over a
window around that width's own best, and its slope on log2 width):
attnscale/studies/transfer_sensitivity.py. The sweep's labels and runs as rows:
attnscale/studies/transfer_runs.py.

The largest logit: `train/attn/max_logit/layer_<i>` in metrics.jsonl (the largest
scaled logit of the layer on that step's batch), maximised over layers.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence

import numpy as np

from attnscale.experiments import reporting, results_store, stats, sweep_results, verdicts
from attnscale.studies import registry, transfer_runs, transfer_sensitivity, transfer_summary
from attnscale.studies.transfer_runs import (
  TOL,
  best_rate,
  cell_rates,
  labels_of,
  losses,
  read_workdirs,
  widths_of,
)


def __getattr__(name: str):
  """The runs' labels and rows live in transfer_runs.py, S across width in
  transfer_sensitivity.py: a name of theirs asked for here is a one-line error
  naming its module."""
  for module in (transfer_runs, transfer_sensitivity):
    if hasattr(module, name):
      raise AttributeError(f"attnscale.studies.transfer.{name} is {module.__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def slopes(rows: Sequence[dict], seed: int = 0, axis: str = "width"
           ) -> dict[str, stats.Slope | None]:
  """Per label, `stats.best_rate_slope` over its sizes on `axis` (None: < 2 with a best)."""
  out = {}
  for label in labels_of(rows):
    sweep = [(r[axis], math.log2(r["learning_rate"]), r["seed"], r["final_train_loss"])
             for r in rows if r["label"] == label]
    try:
      out[label] = stats.best_rate_slope(sweep, seed=seed)
    except ValueError:
      out[label] = None
  return out


def _transfer(at_best: Mapping, at_ref: Mapping | None) -> tuple[float, float, float, str]:
  """(loss at the reference rate minus the best's, lo, hi, basis)."""
  if at_ref is None:
    return math.nan, math.nan, math.nan, "not run"
  if not all(map(math.isfinite, at_ref.values())):
    return math.nan, math.nan, math.nan, "diverged"
  c = stats.compare(at_best, at_ref)
  if c.method != "none":
    return c.effect, c.lo, c.hi, f"{c.method} n={c.n}"
  if 0 in at_best and 0 in at_ref:
    return at_ref[0] - at_best[0], math.nan, math.nan, "seed 0"
  return math.nan, math.nan, math.nan, "no shared seed 0"


def table_rows(rows: Sequence[dict], fits: Mapping[str, stats.Slope | None],
               axis: str = "width") -> list[dict]:
  """One row per label and size on `axis` (transfer.md; the module docstring)."""
  out = []
  for label in labels_of(rows):
    widths = widths_of(rows, label, axis)
    ref, _ = best_rate(losses(rows, label, widths[0], axis))
    fit = fits.get(label)
    for w in widths:
      by_rate = losses(rows, label, w, axis)
      grid, interp = best_rate(by_rate)
      row = {"label": label, axis: w, "rates": len(by_rate),
             "best_lr": 2.0**grid if math.isfinite(grid) else math.nan, "best_log2_lr": grid,
             "interp_log2_lr": interp,
             "interp_lo": fit.best_lo.get(w, math.nan) if fit else math.nan,
             "interp_hi": fit.best_hi.get(w, math.nan) if fit else math.nan,
             "band": "", "band_short": 0, "seeds": 0, "loss": math.nan, "loss_lo": math.nan,
             "loss_hi": math.nan, "max_logit": math.nan,
             "transfer_lr": 2.0**ref if math.isfinite(ref) else math.nan,
             "transfer_loss": math.nan, "transfer_lo": math.nan, "transfer_hi": math.nan,
             "transfer_basis": "no best"}
      if math.isfinite(grid):
        band = stats.near_best_band(by_rate)
        at_best = by_rate[grid]
        loss = stats.mean_interval(at_best.values())
        logits = [r["max_logit"] for r in rows if r["label"] == label and r[axis] == w
                  and math.log2(r["learning_rate"]) == grid]
        row.update(band=cell_rates(band.rates), band_short=len(band.short),
                   seeds=len(at_best), loss=loss.mean, loss_lo=loss.lo, loss_hi=loss.hi,
                   max_logit=float(np.mean(logits)))
        if w == widths[0]:
          row.update(transfer_loss=0.0, transfer_basis="the reference")
        elif grid == ref:
          row.update(transfer_loss=0.0, transfer_basis="same rate")
        elif math.isfinite(ref):
          t = _transfer(at_best, by_rate.get(ref))
          row.update(transfer_loss=t[0], transfer_lo=t[1], transfer_hi=t[2], transfer_basis=t[3])
      out.append(row)
  return out


def versus_rows(rows: Sequence[dict], reference: str, axis: str = "width") -> list[dict]:
  """Each label against `reference` at every size both have: the loss at each one's
  own best rate (on the seed means), b minus a with `stats.compare`'s interval
  (paired on the shared seeds; the sweep's labels share seeds 0, 1, 2)."""
  out = []
  for label in labels_of(rows):
    if label == reference:
      continue
    for w in widths_of(rows, label, axis):
      if w not in widths_of(rows, reference, axis):
        continue
      ref_rates, by_rate = losses(rows, reference, w, axis), losses(rows, label, w, axis)
      (ref_best, _), (best, _) = best_rate(ref_rates), best_rate(by_rate)
      if not (math.isfinite(ref_best) and math.isfinite(best)):
        continue
      c = stats.compare(ref_rates[ref_best], by_rate[best])
      # Tie-robust: the verdict at every pairing of the two labels' tied rates.
      ties = (stats.tie_set(ref_rates, ref_best), stats.tie_set(by_rate, best))
      out.append({"label": label, axis: w, "reference": reference,
                  "best_lr": 2.0**best, "reference_lr": 2.0**ref_best, "effect": c.effect,
                  "lo": c.lo, "hi": c.hi, "n": c.n, "method": c.method,
                  "verdict": c.verdict,
                  "robust": verdicts.robust(ref_rates, by_rate, *ties) or "-", "_c": c})
  # Holm over each size's family, every label against the reference there
  # (docs/guides/sweeps.md, verdicts that hold).
  for w in sorted({r[axis] for r in out}):
    family = verdicts.family({r["label"]: r["_c"] for r in out if r[axis] == w})
    for r in out:
      if r[axis] == w:
        r["holm"] = family.get(r["label"], "")
  for r in out:
    del r["_c"]
  return out


def _covers(lo: float, hi: float, value: float) -> bool:
  return lo - TOL <= value <= hi + TOL


def slope_rows(table: Sequence[dict], fits: Mapping[str, stats.Slope | None],
               axis: str = "width") -> list[dict]:
  """Per label: the best rate's slope on log2(size), its interval, what it covers."""
  out = []
  for label, fit in fits.items():
    gaps = [r["transfer_loss"] for r in table if r["label"] == label
            and math.isfinite(r["transfer_loss"])]
    row = {"label": label, f"{axis}s": sum(r["label"] == label and math.isfinite(
        r["interp_log2_lr"]) for r in table), "slope": math.nan, "lo": math.nan,
           "hi": math.nan, "resamples_used": 0, "covers_0": "-", "covers_minus_1": "-",
           "reading": f"fewer than 2 {axis}s with a best",
           "worst_transfer_loss": max(gaps) if gaps else math.nan}
    if fit is not None:
      zero, one = _covers(fit.lo, fit.hi, 0.0), _covers(fit.lo, fit.hi, -1.0)
      row.update(slope=fit.slope, lo=fit.lo, hi=fit.hi, resamples_used=fit.used,
                 covers_0="yes" if zero else "no", covers_minus_1="yes" if one else "no",
                 reading={(True, False): "transfers", (False, True): f"falls as 1/{axis}",
                          (True, True): "either: interval too wide",
                          (False, False): f"moves, not as 1/{axis}"}[zero, one])
    out.append(row)
  return out


def logit_rows(rows: Sequence[dict]) -> list[dict]:
  """Per label, width and rate, seed 0: status, loss, the last and the peak logit."""
  return [{"label": r["label"], "width": r["width"], "learning_rate": r["learning_rate"],
           "status": r["status"], "final_train_loss": r["final_train_loss"],
           "max_logit_last": r["logits"][-1][1] if r["logits"] else math.nan,
           "max_logit_peak": r["max_logit_peak"]} for r in rows if r["seed"] == 0]


def _panels(labels: Sequence[str], height: float = 3.6):
  cols = min(4, len(labels))
  n_rows = -(-len(labels) // cols)
  fig = reporting.new_figure(4.2 * cols, height * n_rows)
  axes = np.atleast_1d(fig.subplots(n_rows, cols, squeeze=False)).ravel()
  for ax in axes[len(labels):]:
    ax.set_axis_off()
  return fig, axes


def plot_lr(rows: Sequence[dict], axis: str = "width"):
  """Loss against rate, a panel per label, a line per size: the mean of the seeds that
  finished, min-max bars; a rate where every seed diverged: an x on the top edge."""
  labels = labels_of(rows)
  fig, axes = _panels(labels)
  for ax, label in zip(axes, labels):
    for i, w in enumerate(widths_of(rows, label, axis)):
      by_rate = losses(rows, label, w, axis)
      xs = [x for x in sorted(by_rate) if any(map(math.isfinite, by_rate[x].values()))]
      finite = [[v for v in by_rate[x].values() if math.isfinite(v)] for x in xs]
      mean = np.array([np.mean(v) for v in finite])
      err = [mean - [min(v) for v in finite], [max(v) for v in finite] - mean]
      ax.errorbar([2.0**x for x in xs], mean, yerr=err, capsize=2, label=f"{axis} {w}",
                  **reporting.style(i))
      diverged = [2.0**x for x in sorted(by_rate) if x not in xs]
      marks = ax.plot(diverged, [1.0] * len(diverged), "x", color=reporting.style(i)["color"],
                      transform=ax.get_xaxis_transform(), clip_on=False)
      for mark in marks:  # on the top edge, outside the layout (else it collapses the panels)
        mark.set_in_layout(False)
    ax.set_xscale("log", base=2)
    reporting.label_axes(ax, xlabel="learning rate", ylabel="final training loss", title=label)
    ax.legend(fontsize=7)
  # Said once for the figure: in every panel title it overran the longer labels.
  fig.suptitle("Final training loss against learning rate: seed mean, min-max bars; "
               "x on the top edge: every seed diverged")
  return fig


def plot_best(table: Sequence[dict], fits: Mapping[str, stats.Slope | None],
              axis: str = "width"):
  """Best rate against size per label: bootstrap bars, the fit, the slope interval."""
  labels = list(fits)
  fig, axes = _panels(labels)
  for ax, label in zip(axes, labels):
    pts = [r for r in table if r["label"] == label and math.isfinite(r["interp_log2_lr"])]
    if pts:
      w = np.array([r[axis] for r in pts], float)
      y = np.array([r["interp_log2_lr"] for r in pts])
      lo = np.array([r["interp_lo"] for r in pts])
      hi = np.array([r["interp_hi"] for r in pts])
      err = np.nan_to_num([2.0**y - 2.0**lo, 2.0**hi - 2.0**y])
      ax.errorbar(w, 2.0**y, yerr=np.abs(err), fmt="o", capsize=3, color="k",
                  label="interpolated best, bootstrap 95%")
    fit = fits[label]
    if fit is not None:
      x = np.log2([r[axis] for r in pts])
      centre = (x.mean(), fit.slope * x.mean() + fit.intercept)
      for slope, style, name in ((fit.slope, "-", f"slope {fit.slope:+.2f}"),
                                 (fit.lo, "--", f"[{fit.lo:+.2f}, {fit.hi:+.2f}]"),
                                 (fit.hi, "--", None)):
        ax.plot(2.0**x, 2.0**(centre[1] + slope * (x - centre[0])), style, color="tab:blue",
                lw=1, label=name)
    if pts:  # a log axis with nothing on it cannot be drawn
      ax.set_xscale("log", base=2)
      ax.set_yscale("log", base=2)
    reporting.label_axes(ax, xlabel=axis, ylabel="best learning rate", title=label)
    ax.legend(fontsize=7)
  return fig


def plot_logits(rows: Sequence[dict]):
  """The largest logit (last logged step, seed 0) against rate, a panel per label."""
  labels = labels_of(rows)
  fig, axes = _panels(labels)
  table = logit_rows(rows)
  for ax, label in zip(axes, labels):
    for i, w in enumerate(widths_of(rows, label)):
      pts = [r for r in table if r["label"] == label and r["width"] == w]
      ax.plot([r["learning_rate"] for r in pts], [r["max_logit_last"] for r in pts],
              label=f"width {w}", **reporting.style(i))
    ax.set_xscale("log", base=2)
    if any(r["max_logit_last"] > 0 for r in table if r["label"] == label):  # NaN: False
      ax.set_yscale("log")
    reporting.label_axes(ax, xlabel="learning rate", ylabel="largest attention logit",
                         title=f"{label} (seed 0, last logged step)")
    ax.legend(fontsize=7)
  return fig


def table_notes(rows: Sequence[dict], workdir: str, code: str, axis: str = "width",
                logits: bool = True) -> list[str]:
  """What the columns of `table_rows`' table mean, as notes under it (the transfer,
  width and depth studies print the same)."""
  return [f"{len(rows)} finished runs ({workdir}); {code}; every run: runs.csv. Final "
          "training loss: the mean of the last 20 steps; rates 2^-e, log2 columns log2(rate).",
          "best: the lowest seed mean (a rate where any seed diverged counts as diverged); "
          "interp: the parabola vertex through it and its neighbours, interp_lo/hi its "
          "bootstrap 95% over seeds; band: the rates not measurably worse "
          "(stats.near_best_band), band_short: band rates with < 3 seeds (search unfinished).",
          "loss [loss_lo, loss_hi]: mean and 95% t-interval over the seeds at the best"
          + ("; max_logit: the largest attention logit of the last logged step (max over "
             "layers), mean over those seeds." if logits else "."),
          f"transfer_loss: the loss at the smallest {axis}'s best rate (transfer_lr) minus "
          f"this {axis}'s own best; paired by seed with a 95% t-interval where both have "
          ">= 2 seeds, else seed 0 alone (transfer_basis)."]


def slope_note(axis: str = "width") -> str:
  """What `slope_rows`' columns mean."""
  return (f"slope: least squares of the interpolated log2 best rate on log2 {axis} "
          "(stats.best_rate_slope); lo/hi: its bootstrap 95% interval over seeds (about "
          f"90% with 3 seeds); covers_0: the rate transfers; covers_minus_1: it falls as "
          f"1/{axis}; worst_transfer_loss: the most the smallest {axis}'s best rate costs.")


def run_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies transfer --out DIR --workdirs SWEEP_DIR [MORE ...]`."""
  for workdir in args.workdirs:
    if not os.path.isdir(workdir):
      raise SystemExit(f"transfer: --workdirs {workdir} is not a directory")
  if not args.workdirs:
    raise SystemExit("transfer: give --workdirs SWEEP_DIR (the transfer sweep's workdir)")
  labels = getattr(args, "labels", None)
  try:
    rows = read_workdirs(args.workdirs, labels)
  except re.error as e:
    raise SystemExit(f"transfer: --labels {labels!r} is not a regular expression: {e}") from None
  workdir = " + ".join(map(results_store.shown, args.workdirs))
  if not rows:
    raise SystemExit(f"transfer: no finished runs in --workdirs {workdir}"
                     + (f" with a label matching --labels {labels!r}" if labels else ""))
  code = registry.code_note(rows, args, "transfer")
  fits = slopes(rows, seed=getattr(args, "seed", 0))
  table = table_rows(rows, fits)
  notes = table_notes(rows, workdir, code)
  formats = {"best_lr": reporting.power_of_two, "transfer_lr": reporting.power_of_two,
             "learning_rate": reporting.power_of_two}
  paths = reporting.write_tables(table, args.out, "transfer", notes=notes, floats=".3f",
                                 formats=formats, title="Transfer across width: best rates")
  slope_table = slope_rows(table, fits)
  paths += reporting.write_tables(
      slope_table, args.out, "transfer_slopes", floats=".2f",
      title="Best learning rate against width: slopes",
      notes=[slope_note(), code])
  reference = getattr(args, "reference", None) or ("sp_adam_standard" if any(
      r["label"] == "sp_adam_standard" for r in rows) else labels_of(rows)[0])
  if reference not in labels_of(rows):
    raise SystemExit(f"transfer: --reference {reference} is not a label of these runs "
                     f"({', '.join(labels_of(rows))})")
  sensitivity = transfer_sensitivity.tables(rows, reference)
  paths += transfer_sensitivity.write_tables(sensitivity, args.out, code, reference)
  versus = versus_rows(rows, reference)
  paths += reporting.write_tables(
      versus, args.out, "transfer_versus", floats=".3f",
      formats=formats | {"reference_lr": reporting.power_of_two},
      title=f"Each label against {reference}: loss at each one's best rate",
      notes=[f"effect: the label's loss at its best rate minus {reference}'s at its own, "
             "at the same width; [lo, hi]: 95% t, paired by seed on the shared seeds "
             "(attnscale.experiments.stats.compare), Welch's where fewer than 2 are "
             "shared; verdict: worse / better where the interval excludes 0; robust: the "
             "verdict at every pairing of the two labels' tied rates (stats.tie_set, "
             "robust_compare); holm: the "
             "Holm-adjusted p over the labels at that width, with the verdict where it "
             "survives (docs/guides/sweeps.md, verdicts that hold).", code])
  paths += reporting.write_tables(
      logit_rows(rows), args.out, "transfer_logits", floats=".3f", formats=formats,
      title="Largest attention logit against rate and width (seed 0)",
      notes=["max_logit_last: at the last logged step; max_logit_peak: the largest logged "
             "anywhere in the run (finite values: a diverged run stops at its NaN).", code])
  paths += transfer_summary.write_summary(
      rows, table, slope_table, versus, sensitivity["transfer_sensitivity_slopes"], args.out,
      code, reference)
  for name, fig in (("transfer_lr", plot_lr(rows)), ("transfer_best", plot_best(table, fits)),
                    ("transfer_logits", plot_logits(rows))):
    paths.append(reporting.save_figure(fig, args.out, name))
  path = os.path.join(args.out, "runs.csv")
  sweep_results.write_runs_csv(rows, path, hyperparameters=("width",),
                               results=("max_logit_peak",))
  return paths + [path], notes


def add_arguments(p) -> None:
  g = p.add_argument_group("transfer")
  g.add_argument("--labels", default=None,
                 help="a regular expression: only the labels it matches (re.search)")
  g.add_argument("--reference", default=None,
                 help="transfer_versus.md's and transfer_sensitivity_versus.md's reference "
                      "label (default: sp_adam_standard "
                      "where it ran, else the first label)")


# Reads the transfer sweep's layout: only when asked for.
STUDY = registry.Study(run_cli, in_all=False, needs_workdirs=True, arguments=add_arguments)
