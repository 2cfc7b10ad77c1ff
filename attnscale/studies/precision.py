"""Low precision: which scalings train in fp16 and simulated fp8 without loss scaling, and why.

The runs are ordinary train.py runs that differ in `model.dtype` (float32,
bfloat16, float16, fp8; attnscale/numerics/precision.py) and the scaling; the sweep
that makes them is data (configs/shakespeare_char.py, "precision"). This
module reads them and explains them:

  scale_report(config, model=None)  one step's scales (`attnscale.numerics.scale_tracking`)
                                    on the run's first training batch: at init, or
                                    of a given (trained) model.
  run_report(workdir)               the same for a run's latest checkpoint.
  tracked(workdir)                  its summary (flushed fractions, `scale_summary` at
                                    init and trained), kept in WORKDIR/scales.json and
                                    archived with the run's records.
  precision_table(workdirs)         one row per run: final loss, its difference to
                                    the float32 run of the same scaling, divergence,
                                    and the fraction of gradient / forward elements
                                    its own format flushed at the end of training.
  plot_scales(reports)              unit-scaling's scale analysis: one row per tensor,
                                    log2 std (marker) up to log2 absmax (line), forward
                                    and backward, against fp16's, e4m3's and e5m2's
                                    normal and subnormal ranges; one panel per report.
  plot_precision(rows)              final loss per scaling and dtype.

`python -m attnscale.studies precision --out DIR --workdirs runs/precision/*`
writes precision.csv/.md (one row per run), precision_summary.csv/.md (over
seeds: `summary_table`), precision.png (losses), one
precision_scales_<scaling>.png per scaling (float32, seed 0, at init and trained) and
precision_scales.csv/.md (`scale_summary` of each: medians, underflow fractions),
and precision_page.md: the tables of docs/experiments/precision.md as it shows
them (`page_tables`).
Every table also comes from archived runs (`--workdirs docs/results/precision/runs.parquet`:
records and scales.json, no weights); the per-tensor figures need the weights.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from attnscale.experiments import reporting, results_store, stats, sweep_results, verdicts
from attnscale.numerics import precision, scale_tracking
from attnscale.studies import registry

PLOT_FORMATS = ("float16", "e4m3", "e5m2")
DTYPE_ORDER = ("float32", "bfloat16", "float16", "fp8", "fp8/per_tensor")
_FORMAT_COLORS = {"float16": "tab:green", "e4m3": "tab:purple", "e5m2": "tab:red",
                  "bfloat16": "tab:gray"}


# ---------------------------------------------------------------------------
# Computing.


def scale_report(config, model=None, *, batch_step: int = 0) -> scale_tracking.ScaleReport:
  """Tracks one training step of `config`'s task (its batch `batch_step`).

  Args:
    config: a train.py config (ConfigDict).
    model: the model to track; None = a fresh one initialised from config.seed
      (what train.py starts from).
    batch_step: which training batch (`task.train_batch`).
  """
  # Imported here: the synthetic studies need neither the data sets nor orbax.
  import jax

  from attnscale import tasks
  from attnscale.runtime import train_state as ts
  task = tasks.get_task(config)
  model = ts.init_model(config) if model is None else model
  batch = jax.tree.map(jax.numpy.asarray, task.train_batch(batch_step))
  return scale_tracking.track(model, lambda m: task.loss(m, batch)[0])


def run_report(workdir: str) -> tuple[scale_tracking.ScaleReport, int]:
  """(`scale_report` of the run's latest checkpoint, its step)."""
  from attnscale.evaluation import eval_lib
  config = eval_lib.load_config(workdir)
  model, step, _ = eval_lib.restore(config, workdir)
  return scale_report(config, model), int(step)


def dtype_label(config) -> str:
  """"float32", "bfloat16", "float16", "fp8" or "fp8/per_tensor"."""
  m = config["model"]
  dtype = m.get("dtype", "float32")
  scaling = m.get("fp8_scaling", "none")
  return f"{dtype}/{scaling}" if dtype == "fp8" and scaling != "none" else dtype


def lost_fractions(report: scale_tracking.ScaleReport) -> dict[str, float]:
  """Size-weighted fractions of activation-gradient and forward-activation
  elements that the run's own format lost (`ScaleReport.lost`: flushed or
  overflowed): "grad_lost" and "fwd_lost" (0 for float32)."""
  out = {}
  for key, direction in (("grad_lost", "backward"), ("fwd_lost", "forward")):
    ts = [t for t in report.tensors if t.role == "activation" and t.direction == direction]
    size = sum(t.size for t in ts)
    lost = sum(sum(frac for _, frac in report.lost(t)) * t.size for t in ts)
    out[key] = lost / size if size else math.nan
  return out


# A run's scale analysis at its last checkpoint, kept in its directory and archived
# with its records (run_records.RECORDS): the study then reruns in seconds, and from
# the committed records, which hold no weights.
SCALES = "scales.json"


def tracked(workdir: str) -> dict | None:
  """The scale analysis of the run's latest checkpoint: {"step", grad_lost, fwd_lost
  (`lost_fractions`), grad_underflow_float16 / _e5m2 (what those formats would flush
  of its float32-computed gradients), "trained" and "init" (`scale_summary` at that
  checkpoint and at initialisation)}.

  Read from WORKDIR/scales.json when it is of the latest checkpoint's step (or when
  no weights are left: an archived run), else computed (`run_report`) and written
  there; None when there is neither.
  """
  import json

  from attnscale.evaluation import eval_lib
  from attnscale.experiments import run_records
  path = os.path.join(workdir, SCALES)
  steps = run_records.checkpoint_steps(workdir)
  if os.path.exists(path):
    with open(path) as f:
      kept = json.load(f)
    if not steps or kept.get("step") == steps[-1]:
      return kept
  if not steps:
    return None
  report, step = run_report(workdir)
  grads = [t for t in report.tensors if t.role == "activation" and t.direction == "backward"]
  size = sum(t.size for t in grads)
  kept = {"step": step, **lost_fractions(report),
          **{f"grad_underflow_{fmt}": sum(t.underflow[fmt] * t.size for t in grads) / size
             for fmt in ("float16", "e5m2")},
          "trained": scale_summary(report),
          "init": scale_summary(scale_report(eval_lib.load_config(workdir)))}
  with open(path + ".tmp", "w") as f:
    json.dump(kept, f, indent=1)
  os.replace(path + ".tmp", path)
  return kept


def precision_table(workdirs: Sequence[str], *, track: bool = True) -> list[dict]:
  """One row per run (train.py run directories of the precision sweep).

  Columns: scaling, dtype, status ("done", "diverged", ...), steps,
  final_train_loss (the mean of the last 20 steps), best_val_loss,
  delta_vs_float32 (final_train_loss minus the float32 run's of the same
  scaling and seed), and with `track` the latest checkpoint's grad_lost / fwd_lost
  (`lost_fractions`) and, from the same step's float32-computed tensors, the
  fraction of gradient elements that fp16 and e5m2 would flush
  (grad_underflow_float16 / grad_underflow_e5m2; for float16 runs these count
  what is left after fp16 flushed).
  """
  import json

  from attnscale.experiments import run_records
  rows = []
  for workdir in workdirs:
    run = run_records.read_run(workdir)
    if run is None:
      continue
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
    row = {k: run[k] for k in ("scaling", "learning_rate", "seed", "status", "steps",
                               "final_train_loss", "best_val_loss", "max_logit", "commit",
                               "host", "run")} | {"dtype": dtype_label(config)}
    # A diverged run is tracked at its last good checkpoint, if it saved one.
    kept = tracked(workdir) if track else None
    if kept is not None:
      row.update({k: kept[k] for k in ("grad_lost", "fwd_lost", "grad_underflow_float16",
                                       "grad_underflow_e5m2")} | {"scales": kept})
    rows.append(row)
  base = {(r["scaling"], r["seed"]): r["final_train_loss"] for r in rows
          if r["dtype"] == "float32"}
  for r in rows:
    r["delta_vs_float32"] = r["final_train_loss"] - base.get((r["scaling"], r["seed"]), math.nan)
  order = {d: i for i, d in enumerate(DTYPE_ORDER)}
  return sorted(rows, key=lambda r: (str(r["scaling"]), order.get(r["dtype"], 99), r["seed"]))


def summary_table(rows: Sequence[dict]) -> list[dict]:
  """Per scaling and dtype: the final loss over seeds (mean, and the half range
  max - min over 2 when there are two or more), its difference to float32's mean,
  that difference paired by seed with its 95% t-interval (`vs_float32`,
  `stats.compare`), the runs that diverged, and the mean grad_lost / fwd_lost."""
  def by_seed(runs, dtype):
    return {r["seed"]: r["final_train_loss"] for r in runs if r["dtype"] == dtype}

  out = []
  for scaling in sorted({str(r["scaling"]) for r in rows}):
    mine = [r for r in rows if str(r["scaling"]) == scaling]
    base = [r["final_train_loss"] for r in mine
            if r["dtype"] == "float32" and math.isfinite(r["final_train_loss"])]
    for dtype in [d for d in DTYPE_ORDER if any(r["dtype"] == d for r in mine)]:
      runs = [r for r in mine if r["dtype"] == dtype]
      losses = [r["final_train_loss"] for r in runs if math.isfinite(r["final_train_loss"])]
      mean = float(np.mean(losses)) if losses else math.nan
      lost = lambda k, runs=runs: float(np.nanmean([r.get(k, math.nan) for r in runs])) if any(
          math.isfinite(r.get(k, math.nan)) for r in runs) else math.nan
      out.append({"scaling": scaling, "dtype": dtype, "seeds": len(runs),
                  "diverged": len(runs) - len(losses), "final_train_loss": mean,
                  "half_range": (max(losses) - min(losses)) / 2 if len(losses) > 1 else math.nan,
                  "delta_vs_float32": mean - float(np.mean(base)) if base else math.nan,
                  "vs_float32": "" if dtype == "float32" else stats.compare(
                      by_seed(mine, "float32"), by_seed(runs, dtype)).format(),
                  "grad_lost": lost("grad_lost"), "fwd_lost": lost("fwd_lost")})
  # Holm over every format-against-float32 comparison of the study (docs/guides/sweeps.md,
  # verdicts that hold), beside each per-comparison verdict.
  family = verdicts.family({
      (r["scaling"], r["dtype"]): stats.compare(
          by_seed([x for x in rows if str(x["scaling"]) == r["scaling"]], "float32"),
          by_seed([x for x in rows if str(x["scaling"]) == r["scaling"]], r["dtype"]))
      for r in out if r["dtype"] != "float32"})
  for r in out:
    r["holm"] = family.get((r["scaling"], r["dtype"]), "")
    mine = [x for x in rows if str(x["scaling"]) == r["scaling"]]
    r["robust"] = "" if r["dtype"] == "float32" else _robust(
        [x for x in mine if x["dtype"] == "float32"], [x for x in mine if x["dtype"] == r["dtype"]])
  return out


def _robust(base: Sequence[dict], runs: Sequence[dict]) -> str:
  """A format against float32 at every pairing of their tie sets on the final
  training loss (`verdicts.robust`); "untested: one rate each (...)" where both ran
  a single rate (the sweep runs each scaling at one rate: `verdicts.one_rate`)."""
  measure = lambda r: r["final_train_loss"]
  # A row without its rate (a hand-made one) counts as one rate, unnamed.
  rated = lambda rs: [{"learning_rate": math.nan, **r} for r in rs]
  a, b = verdicts.by_rate(rated(base), measure), verdicts.by_rate(rated(runs), measure)
  if not a or not b:
    return "-"
  untested = verdicts.one_rate(a, b)
  if untested:
    return untested
  ties = [stats.tie_set({lr: v for lr, v in m.items() if v}) for m in (a, b)]
  return verdicts.robust(a, b, *ties) or "-"


def page_tables(summary: Sequence[dict], scales: Sequence[dict]) -> str:
  """The three tables of docs/experiments/precision.md, from `summary_table` and the
  float32 runs' `scale_summary` rows (seed 0's), as markdown: final loss per scaling
  (rows in float32's order) and format, mean ± half range over seeds, with the
  fraction of gradients e5m2 flushed in fp8; each format minus float32 paired by
  seed with its verdict; and the tensor scales at initialisation and trained."""
  by = {(r["scaling"], r["dtype"]): r for r in summary}
  order = sorted({r["scaling"] for r in summary},
                 key=lambda s: by.get((s, "float32"), {}).get("final_train_loss", math.inf))

  def loss(r):
    if r is None:
      return "-"
    n, bad = r["seeds"], r["diverged"]
    if bad == n:
      return f"diverged ({n} of {n})"
    text = f"{r['final_train_loss']:.3f}"
    text += f" ± {r['half_range']:.3f}" if math.isfinite(r["half_range"]) else ""
    return text + (f" ({bad} of {n} diverged)" if bad else "") + (f" (n={n})" if n != 3 else "")

  def versus(r):
    if r is None:
      return "-"
    if r["diverged"] == r["seeds"]:
      return f"diverged ({r['seeds']} of {r['seeds']})"
    return r["vs_float32"].replace(f" paired n={r['seeds']}", "").replace("within noise", "noise")

  def pct(x):
    return "-" if not math.isfinite(x) else (
        f"{x:.0%}" if x >= 0.1 else f"{x:.1%}" if x >= 0.001 else f"{x:.3%}")

  lines = ["| scaling | " + " | ".join(DTYPE_ORDER) + " | e5m2 grads flushed in fp8 |",
           "|---|" + "---:|" * (len(DTYPE_ORDER) + 1)]
  for s in order:
    fp8 = by.get((s, "fp8"))
    lines.append(f"| {s} | " + " | ".join(loss(by.get((s, d))) for d in DTYPE_ORDER)
                 + f" | {pct(fp8['grad_lost']) if fp8 else '-'} |")
  lines += ["", "| scaling | " + " | ".join(f"{d} minus float32" for d in DTYPE_ORDER[1:]) + " |",
            "|---|" + "---|" * (len(DTYPE_ORDER) - 1)]
  lines += [f"| {s} | " + " | ".join(versus(by.get((s, d))) for d in DTYPE_ORDER[1:]) + " |"
            for s in order]
  lines += ["", "| scaling | when | median log2 std, forward / gradients | smallest gradient "
            "log2 std | e4m3 forward underflow | e5m2 gradient underflow | fp16 gradient "
            "underflow | log2 std of dq |", "|---|---|---:|---:|---:|---:|---:|---:|"]
  for s in order:
    for r in (r for r in scales if r["scaling"] == s and r["seed"] == 0):
      when = "init" if r["when"] == "at init" else "trained"
      lines.append(
          f"| {s} | {when} | {r['fwd_median_log2_std']:.1f} / {r['grad_median_log2_std']:.1f} "
          f"| {r['min_grad_log2_std']:.1f} | {pct(r['fwd_underflow_e4m3'])} "
          f"| {pct(r['grad_underflow_e5m2'])} | {pct(r['grad_underflow_float16'])} "
          f"| {r['dq_log2_std']:.1f} |")
  return "\n".join(lines) + "\n"


def scale_summary(report: scale_tracking.ScaleReport) -> dict[str, float]:
  """One line of a report, as docs/science.md's table at initialisation.

  fwd/grad_median_log2_std: the size-weighted median of log2 std over activations
  / activation gradients; min_grad_log2_std: the smallest gradient's;
  fwd_underflow_e4m3, grad_underflow_e5m2, grad_underflow_float16: size-weighted
  fractions those formats would flush; dq_log2_std: log2 of the RMS over layers
  of the std of the gradient arriving at q.
  """
  def median(ts):
    ts = sorted(ts, key=lambda t: t.std)
    half, seen = sum(t.size for t in ts) / 2, 0
    for t in ts:
      seen += t.size
      if seen >= half:
        return _log2(t.std)
    return math.nan

  def weighted(ts, field, fmt):
    return sum(getattr(t, field)[fmt] * t.size for t in ts) / max(sum(t.size for t in ts), 1)

  acts = [t for t in report.tensors if t.role == "activation"]
  fwd = [t for t in acts if t.direction == "forward"]
  grad = [t for t in acts if t.direction == "backward"]
  dq = [t.std for t in grad if t.name.endswith("attn.q")]
  return {"fwd_median_log2_std": median(fwd), "grad_median_log2_std": median(grad),
          "min_grad_log2_std": min((_log2(t.std) for t in grad), default=math.nan),
          "fwd_underflow_e4m3": weighted(fwd, "underflow", "e4m3"),
          "grad_underflow_e5m2": weighted(grad, "underflow", "e5m2"),
          "grad_underflow_float16": weighted(grad, "underflow", "float16"),
          "dq_log2_std": _log2(math.sqrt(sum(x * x for x in dq) / len(dq))) if dq else math.nan}


def _log2(x: float) -> float:
  return math.log2(x) if x > 0 else -math.inf


# ---------------------------------------------------------------------------
# Figures.


def plot_scales(reports: Mapping[str, scale_tracking.ScaleReport], *,
                formats: Sequence[str] = PLOT_FORMATS, title: str = ""):
  """Scale analysis: one row per tensor, log2 std against the formats' ranges.

  Each panel is one report (e.g. "at init", "step 1000" of one model: panels
  share rows by tensor name). A row is a tensor (activations in order of use,
  then weights); a filled circle is its forward std, a triangle its
  gradient's, hollow markers are weights; the thin line runs on to its absmax
  (where overflow starts); an x at the left edge marks a tensor that is all
  zero (a gradient its format flushed entirely). Vertical lines per format: dotted at the smallest
  subnormal (half of it and below flushes to zero), dashed at the smallest
  normal (below: fewer significant bits), solid at the largest value.
  """
  names = []
  for report in reports.values():
    for t in report.tensors:
      if t.name not in names:
        names.append(t.name)
  row = {name: i for i, name in enumerate(names)}
  # All-zero tensors (a gradient the format flushed entirely) sit at the left edge.
  finite = [math.log2(t.std) for r in reports.values() for t in r.tensors if t.std > 0]
  zero_x = math.floor(min(finite, default=0.0)) - 1
  height = 1.5 + 0.16 * len(names)
  fig = reporting.new_figure(5.0 * len(reports) + 2.5, height)
  axes = fig.subplots(1, len(reports), sharey=True, squeeze=False)[0]
  for ax, (panel, report) in zip(axes, reports.items()):
    for name in formats:
      fmt = precision.FORMATS[name]
      color = _FORMAT_COLORS.get(name, "tab:gray")
      for value, ls, what in ((fmt.min_subnormal, ":", "min subnormal"),
                              (fmt.min_normal, "--", "min normal"), (fmt.max, "-", "max")):
        x = math.log2(value)
        ax.axvline(x, color=color, ls=ls, lw=0.9, label=f"{name} {what}")
    for direction, marker, color in (("forward", "o", "tab:blue"),
                                     ("backward", "v", "tab:orange")):
      for role, face in (("activation", color), ("weight", "none")):
        sel = [t for t in report.tensors if t.direction == direction and t.role == role]
        if not sel:
          continue
        y = np.array([row[t.name] for t in sel], float)
        y += 0.15 if direction == "backward" else -0.15
        std = np.array([math.log2(t.std) if t.std > 0 else np.nan for t in sel])
        amax = np.array([math.log2(t.absmax) if t.absmax > 0 else np.nan for t in sel])
        ax.hlines(y, std, amax, color=color, lw=0.6, alpha=0.6)
        ax.scatter(std, y, marker=marker, s=18, edgecolors=color, facecolors=face,
                   label=f"{direction} {role}" + (" (std)" if role == "activation" else ""))
        zero = np.isnan(std)
        if zero.any():
          ax.scatter(np.full(zero.sum(), zero_x), y[zero], marker="x", s=18, color=color,
                     label=f"{direction} {role}: all zero")
    ax.set_title(f"{panel} (model.dtype={report.dtype}, loss {report.loss:.3f})", fontsize=9)
    ax.set_xlabel("log2 std (marker) .. log2 absmax (line)")
    ax.grid(True, axis="x", alpha=0.3)
  axes[0].set_yticks(range(len(names)))
  axes[0].set_yticklabels(names, fontsize=6)
  axes[0].set_ylim(len(names) - 0.5, -0.5)
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="outside lower center", ncol=5, fontsize=7)
  if title:
    fig.suptitle(title)
  return fig


def plot_precision(rows: Sequence[dict], *, title: str = ""):
  """Final training loss per scaling (x) and dtype (bars: mean over seeds, dots:
  each seed); a run that diverged is marked x at the top."""
  scalings = sorted({str(r["scaling"]) for r in rows})
  dtypes = [d for d in DTYPE_ORDER if any(r["dtype"] == d for r in rows)]
  fig = reporting.new_figure(max(6.0, 1.4 * len(scalings) + 2), 4.2)
  ax = fig.subplots()
  width = 0.8 / max(len(dtypes), 1)
  finite = [r["final_train_loss"] for r in rows if math.isfinite(r["final_train_loss"])]
  top = max(finite) if finite else 1.0
  for j, dtype in enumerate(dtypes):
    xs, ys, bad = [], [], []
    for i, scaling in enumerate(scalings):
      found = [r for r in rows if r["scaling"] == scaling and r["dtype"] == dtype]
      if not found:
        continue
      x = i + (j - (len(dtypes) - 1) / 2) * width
      losses = [r["final_train_loss"] for r in found if math.isfinite(r["final_train_loss"])]
      if losses:  # the bar: the mean over seeds; a dot per seed
        xs.append(x)
        ys.append(float(np.mean(losses)))
        ax.scatter([x] * len(losses), losses, color="black", s=6, zorder=3)
      if len(losses) < len(found):
        bad.append(x)
    ax.bar(xs, ys, width=width, label=dtype, color=reporting.style(j)["color"])
    ax.scatter(bad, [top] * len(bad), marker="x", color=reporting.style(j)["color"], s=40)
  ax.set_xticks(range(len(scalings)))
  ax.set_xticklabels(scalings, rotation=20, fontsize=8)
  if finite:
    ax.set_ylim(0.9 * min(finite), 1.05 * top)
  reporting.label_axes(ax, xlabel="scaling", ylabel="final training loss (last 20 steps)",
                       title=title or "Final loss by format (bars: mean over seeds, dots: seeds; x: diverged)")
  return fig


# ---------------------------------------------------------------------------
# Command line (`python -m attnscale.studies precision`).


def run_cli(args) -> tuple[list[str], list[str]]:
  """Writes the table, the loss figure and the scale figures; returns (paths, notes)."""
  if not args.workdirs:
    raise SystemExit("precision: give the sweep's run directories with --workdirs")

  from attnscale.evaluation import eval_lib
  from attnscale.experiments import run_records
  args.workdirs = results_store.run_dirs(args.workdirs)  # a store: each of its runs
  rows = precision_table(args.workdirs)
  failed = [r for r in rows if r["status"] == "diverged"]
  notes = [f"{len(rows)} runs; diverged: "
           + (", ".join(f"{r['scaling']} {r['dtype']}" for r in failed) or "none") + ".",
           "delta_vs_float32: final_train_loss minus the float32 run's (same scaling, seed). "
           "grad_lost / fwd_lost: fraction of gradient / forward activation elements the "
           "run's own format flushed or overflowed at the last checkpoint; "
           "grad_underflow_<fmt>: what that format would flush of its float32-computed "
           "gradients.",
           registry.code_note(rows, args, "precision")]
  columns = ["scaling", "dtype", "status", "steps", "final_train_loss", "delta_vs_float32",
             "best_val_loss", "grad_lost", "fwd_lost", "grad_underflow_float16",
             "grad_underflow_e5m2", "commit", "run"]
  table = [{c: r.get(c, math.nan) for c in columns} for r in rows]
  paths = reporting.write_tables(table, args.out, "precision",
                                 title="Training in low precision without loss scaling",
                                 notes=notes)
  summary = summary_table(rows)
  paths += reporting.write_tables(
      summary, args.out, "precision_summary",
      title="Low precision without loss scaling: per scaling and format, over seeds",
      notes=["final_train_loss: mean over the seeds that did not diverge; half_range: "
             "(max - min)/2 over them; delta_vs_float32: against float32's mean; "
             "vs_float32: the same paired by seed, 95% t-interval (stats.compare); "
             "grad_lost / fwd_lost: means over the runs (see precision.md); holm: "
             "vs_float32's Holm-adjusted p over every format and scaling, with the verdict "
             "where it survives; robust: vs_float32 at every pairing of the two formats' "
             "tied rates, 'untested: one rate each' where the sweep ran one rate (the "
             "scaling's best in the practice sweep), so nothing shows whether the verdict "
             "holds at a rate tied with it (docs/guides/sweeps.md, verdicts that hold)."])
  runs_csv = os.path.join(args.out, "runs.csv")  # a row a run, with provenance
  sweep_results.write_runs_csv(rows, runs_csv, hyperparameters=("dtype",), results=(
      "delta_vs_float32", "grad_lost", "fwd_lost", "grad_underflow_float16",
      "grad_underflow_e5m2"))
  paths.append(runs_csv)
  paths.append(reporting.save_figure(plot_precision(rows), args.out, "precision"))
  # Each float32 run's scales at init and trained (`scale_summary`, kept by `tracked`);
  # seed 0's per-tensor figure where its weights are here.
  summaries, no_figure = [], []
  for r in rows:
    if r["dtype"] != "float32" or "scales" not in r:
      continue
    summaries += [{"scaling": r["scaling"], "seed": r["seed"], "when": when}
                  | r["scales"][key] for when, key in (("at init", "init"),
                                                       (f"step {r['scales']['step']}", "trained"))]
    if r["seed"] != 0:
      continue
    workdir = next(w for w in args.workdirs
                   if os.path.basename(os.path.normpath(w)) == r["run"])
    if not run_records.checkpoint_steps(workdir):
      no_figure.append(str(r["scaling"]))
      continue
    trained, step = run_report(workdir)
    fig = plot_scales({"at init": scale_report(eval_lib.load_config(workdir)),
                       f"step {step}": trained}, title=f"Tensor scales: {r['scaling']}")
    name = "precision_scales_" + str(r["scaling"]).replace("/", "_").replace("+", "_")
    paths.append(reporting.save_figure(fig, args.out, name))
  if no_figure:
    notes.append("no weights (archived runs), so no precision_scales_<scaling>.png for: "
                 + ", ".join(no_figure))
  if summaries:
    paths += reporting.write_tables(
        summaries, args.out, "precision_scales",
        title="float32 runs' tensor scales, at initialisation and trained (first batch)",
        notes=["Size-weighted median log2 std of the activations (fwd) and their gradients "
               "(grad); the smallest gradient's log2 std; fractions e4m3 / e5m2 / fp16 would "
               "flush; log2 RMS std of the gradient at q (`scale_summary`)."])
  page = os.path.join(args.out, "precision_page.md")  # the page's tables, as it shows them
  with open(page, "w") as f:
    f.write(page_tables(summary, summaries))
  paths.append(page)
  return paths, notes


# Reads one precision sweep's runs and every checkpoint: only when asked for.
STUDY = registry.Study(run_cli, in_all=False, needs_workdirs=True)
