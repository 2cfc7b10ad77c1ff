"""The probes study (docs/experiments/probes.md): the sink question on `trigger`.

    python -m attnscale.studies probes --out docs/results/probes \
        --workdirs docs/results/probes/runs.parquet

On Ran-Milo 2026's trigger-conditional task (arXiv 2603.11487; `tasks/trigger.py`) a
row without the trigger token must output zero. A softmax head cannot put zero
weight on every key, so it parks its weight on a key whose value it has learned to
make harmless, the first one: a sink on the no-trigger rows that the trigger rows
do not need. The paper proves softmax must do this and that un-normalised ReLU
attention need not. So the task is the control the sink claims lack: softmax's sink
forms here, and each arm either removes it at no cost in accuracy, or does not.

The runs are the `probes_trigger` sweep's (configs/probes_sweeps.py SINK_LABELS, its
labels and their order): each label at its best rate by the study protocol (the
lowest seed-mean training loss among the rates with the most seeds), then eval.py's
eval.json at the training length, whose diagnostics split the validation rows into
those with and without a trigger (`evaluation/diagnostics.py`).

Measures, of each run's eval.json:
  accuracy_trigger, accuracy_no_trigger  exact-match accuracy on the target positions
                  of rows with and without a trigger, in points
  sink            the sink head's share of its weight on the first key on the
                  no-trigger rows: the largest over layers and heads of
                  `heads.sink_rate_no_trigger` (the mean weight on key 0 over the
                  queries that see more than one key) over `heads.row_mass_no_trigger`
                  (the rows' mean total weight: 1 under softmax; ReLU/L and softpick
                  rows need not sum to 1)
  sink_trigger    that same head's share on the first key on the trigger rows
  top_key         the largest head's heaviest-key share on the no-trigger rows
                  (`top_key_weight_no_trigger`): a sink on another key than the first
  value_ratio     the sink head's value norm at the first position over the mean
                  value norm (`first_value_ratio`): a sink's value is small
  act_ratio       the residual stream's largest activation over its median, largest
                  layer (massive activations, Sun et al. 2024)
  uniform         what `sink` is under uniform attention (the no-trigger rows' mean)

A sink forms where the seeds' 95% interval of `sink` lies above 0.3 (the threshold of
Gu et al. 2025's sink heads, arXiv 2410.10781), is absent where it lies below, and
is unclear otherwise. Comparisons with softmax are paired by seed at each label's
best rate (`stats.compare`), with the tie-robust and Holm readings of
docs/guides/sweeps.md ("Verdicts that hold").
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import numpy as np

from attnscale.experiments import reporting, results_store, stats, sweep_results
from attnscale.experiments import sweeps as sweep_files
from attnscale.studies import registry
from attnscale.studies.normalisers_runs import (
  best_runs,
  by_seed,
  mean_finite,
  read_rows,
  readings,
  ties_cell,
  value,
  versus,
)

REFERENCE = "softmax"
SINK_THRESHOLD = 0.3  # Gu et al. 2025's sink head: mean weight on the first key above it


def labels() -> tuple[str, ...]:
  """The sink question's labels, in the sweep's order (configs/probes_sweeps.py)."""
  return tuple(sweep_files.declared("probes.py", "SINK_LABELS"))


# ---------------------------------------------------------------------------
# What is measured on a run: a function of its eval.json.

Measure = Callable[[dict], float]


def _heads(e: dict, key: str) -> np.ndarray:
  """[layer, head] of a per-head diagnostic."""
  return np.asarray([layer["heads"][key] for layer in e["attention"]], np.float64)


def _share(e: dict, key: str, rows: str) -> np.ndarray:
  """[layer, head] of a weight as a share of its row's mass (`key`_`rows` over
  row_mass_`rows`): softmax's rows sum to 1; an un-normalised row (ReLU/L, softpick)
  does not, and a sink is a share of what the row attends, not an absolute weight.
  A row of no mass (a head that outputs zero) has no share: NaN."""
  mass = _heads(e, f"row_mass_{rows}")
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(mass > 0, _heads(e, f"{key}_{rows}") / mass, np.nan)


def _sink_head(e: dict) -> tuple[int, int]:
  shares = _share(e, "sink_rate", "no_trigger")
  if np.isnan(shares).all():
    raise ValueError("no head attends on the no-trigger rows")
  return np.unravel_index(int(np.nanargmax(shares)), shares.shape)


def _at_sink_head(values: Callable[[dict], np.ndarray]) -> Measure:
  return lambda e: float(values(e)[_sink_head(e)])


MEASURES: dict[str, Measure] = {
    "val_loss": lambda e: float(e["val_loss"]),
    "accuracy_trigger": lambda e: 100 * float(e["accuracy_trigger"]),
    "accuracy_no_trigger": lambda e: 100 * float(e["accuracy_no_trigger"]),
    "sink": _at_sink_head(lambda e: _share(e, "sink_rate", "no_trigger")),
    "sink_trigger": _at_sink_head(lambda e: _share(e, "sink_rate", "trigger")),
    "top_key": lambda e: float(np.nanmax(_share(e, "top_key_weight", "no_trigger"))),
    "value_ratio": _at_sink_head(lambda e: _heads(e, "first_value_ratio")),
    "act_ratio": lambda e: float(max(layer["act_ratio"] for layer in e["attention"])),
    "uniform": lambda e: float(np.mean([layer["uniform_sink_rate_no_trigger"]
                                        for layer in e["attention"]])),
}
HIGHER_IS_BETTER = {"accuracy_trigger": True, "accuracy_no_trigger": True}


def sink_verdict(values: Sequence[float]) -> str:
  """"forms", "absent" or "unclear" from the seeds' `sink` (module docstring)."""
  i = stats.mean_interval(values)
  if i.n < stats.MIN_SEEDS:
    return f"pending ({i.n} seeds)"
  if i.lo > SINK_THRESHOLD:
    return "forms"
  if i.hi < SINK_THRESHOLD:
    return "absent"
  return "unclear"


# ---------------------------------------------------------------------------
# The tables.

def summary_rows(rows: Sequence[dict]) -> list[dict]:
  """One row per label: its best rate and tie set, accuracy, loss and sink measures
  (seed mean [95% t]), the sink verdict, and the comparisons with softmax on the
  validation loss, the trigger rows' accuracy and the sink (each with its tie-robust
  and Holm readings: `normalisers_runs.readings`)."""
  best = best_runs(rows)
  present = {r["label"] for r in rows}
  order = [k for k in labels() if k in present] + sorted(present - set(labels()))
  ref = best.get(REFERENCE, (math.nan, []))[1]
  out = []
  for label in order:
    lr, runs = best.get(label, (math.nan, []))
    row = {"label": label, "best_lr": lr, "ties": ties_cell(rows, label, lr),
           "seeds": len(runs)}
    for name in ("accuracy_trigger", "accuracy_no_trigger"):
      row[name] = stats.format_interval(by_seed(runs, MEASURES[name]).values(), ".1f")
    row["val_loss"] = stats.format_interval(by_seed(runs, MEASURES["val_loss"]).values(), ".4f")
    sink = list(by_seed(runs, MEASURES["sink"]).values())
    row["sink"] = stats.format_interval(sink)
    row["sink_forms"] = sink_verdict(sink)
    for name in ("sink_trigger", "top_key", "value_ratio", "act_ratio", "uniform"):
      row[name] = mean_finite(by_seed(runs, MEASURES[name]).values())
    out.append(row)
  for name in ("val_loss", "accuracy_trigger", "sink"):
    higher = HIGHER_IS_BETTER.get(name, False)
    for row in out:
      runs = best.get(row["label"], (math.nan, []))[1]
      row[f"{name}_vs_softmax"] = versus(row["label"], ref, runs, MEASURES[name], higher)
    readings(rows, out, name, MEASURES[name], higher)
  return out


# The published expectations, read before anything else: (label, what the source
# expects, the sink verdict that reproduces it).
EXPECTATIONS = (
    ("softmax", "softmax forms a sink on the no-trigger rows (arXiv 2603.11487)", "forms"),
    ("relu", "ReLU attention (ReLU/L) forms none (arXiv 2603.11487)", "absent"),
)


def expectation_rows(table: Sequence[dict]) -> list[dict]:
  """The sanity rows: each published expectation, what was measured, and whether it
  reproduces ("pending" until the label has its seeds)."""
  by_label = {r["label"]: r for r in table}
  out = []
  for label, expected, verdict in EXPECTATIONS:
    row = by_label.get(label, {})
    measured = row.get("sink_forms", "pending (0 seeds)")
    out.append({"expectation": expected, "label": label, "sink": row.get("sink", ""),
                "measured": measured,
                "reproduces": ("pending" if measured.startswith("pending")
                               else "yes" if measured == verdict else "no")})
  return out


# ---------------------------------------------------------------------------
# The figure.

def plot(rows: Sequence[dict], table: Sequence[dict]):
  """Per label, each seed at the best rate: the sink head's first-key weight on the
  no-trigger rows (filled) and on the trigger rows (hollow), and the trigger rows'
  accuracy."""
  best = best_runs(rows)
  names = [r["label"] for r in table]
  fig = reporting.new_figure(11, 4.2)
  sink_ax, acc_ax = fig.subplots(1, 2)
  for x, label in enumerate(names):
    runs = best.get(label, (math.nan, []))[1]
    style = reporting.style(x)
    for key, ax, filled in (("sink", sink_ax, True), ("sink_trigger", sink_ax, False),
                            ("accuracy_trigger", acc_ax, True)):
      values = list(by_seed(runs, MEASURES[key]).values())
      if not values:
        continue
      offsets = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
      ax.scatter([x + o for o in offsets], values, color=style["color"],
                 facecolors=style["color"] if filled else "none", s=24, zorder=3)
      if values:
        ax.hlines(np.mean(values), x - 0.3, x + 0.3, color=style["color"],
                  linestyles="-" if filled else ":")
  sink_ax.axhline(SINK_THRESHOLD, color="grey", linestyle="--", linewidth=1)
  for ax in (sink_ax, acc_ax):
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right")
  reporting.label_axes(sink_ax, xlabel="", ylabel="share of the weight on the first key",
                       title="sink head: no-trigger rows (filled), trigger rows (hollow)")
  reporting.label_axes(acc_ax, xlabel="", ylabel="accuracy (points)",
                       title="exact match on the trigger rows")
  return fig


# ---------------------------------------------------------------------------
# The command.

def run_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies probes --out DIR --workdirs STORE_OR_SWEEP_DIR`."""
  if len(args.workdirs) != 1:
    raise SystemExit("probes: give --workdirs STORE_OR_DIR, the probes_trigger sweep's "
                     "store (docs/results/probes/runs.parquet) or workdir")
  path = args.workdirs[0]
  if results_store.is_store(path) and os.path.exists(results_store.split(path)[0]):
    path = results_store.workdir(path)
  if not os.path.isdir(path):
    raise SystemExit(f"probes: --workdirs must be a store or sweep folder; got {path!r}")
  rows = [r for r in read_rows(path) if r["label"] in labels()]
  if not rows:
    raise SystemExit(f"probes: no finished trigger runs in {results_store.shown(path)}")
  code = registry.code_note(rows, args, "probes")
  best = best_runs(rows)
  short = [f"{k} ({len(runs)})" for k, (_, runs) in best.items() if len(runs) < stats.MIN_SEEDS]
  short += [f"{k} (0)" for k in labels() if k not in best]
  notes = [f"{len(rows)} finished runs of probes_trigger ({results_store.shown(path)}), "
           f"{sum(r['eval'] is not None for r in rows)} evaluated: configs/probes.py "
           "preset=trigger_cpu; each label at its best rate (lowest seed-mean training "
           "loss among the rates with the most seeds); ties: the rates whose paired "
           "training loss covers the best's (stats.tie_set).",
           "accuracy_*: exact match on the target positions of the rows with and without "
           "a trigger, points, mean [95% t] over seeds; sink: the sink head's share of its "
           "weight on the first key on the no-trigger rows (weight over row mass), mean "
           "[95% t]; sink_forms: forms where the "
           f"interval lies above {SINK_THRESHOLD}, absent where below, else unclear; "
           "sink_trigger, value_ratio: the same head on the trigger rows, and its value "
           "norm at the first position over the mean; top_key: the largest heaviest-key "
           "share on the no-trigger rows; act_ratio: largest activation over the median, "
           "largest layer; uniform: the first key's weight under uniform attention (seed "
           "means; attnscale/studies/probes.py).",
           "*_vs_softmax: the label minus softmax, paired by seed at the best rates, 95% t "
           "(accuracy: higher is better); *_robust: the verdict over every pairing of the "
           "two labels' tie sets; *_holm: Holm-adjusted p over the labels, with the "
           "verdict where it survives."]
  if short:
    notes.append(f"Fewer than {stats.MIN_SEEDS} seeds at the best rate (the sweep is "
                 "still running): " + ", ".join(short) + ".")
  notes.append(code)
  table = summary_rows(rows)
  formats = {"best_lr": reporting.power_of_two}
  paths = reporting.write_tables(table, args.out, "probes_trigger", formats=formats,
                                 floats=".3f", title="Probes: the sink question on trigger",
                                 notes=notes)
  paths += reporting.write_tables(
      expectation_rows(table), args.out, "probes_expectations",
      title="Probes: the published expectations, first",
      notes=["sink, measured: as in probes_trigger.md; reproduces: yes where the measured "
             "verdict is the one the source expects.", code])
  paths.append(reporting.save_figure(plot(rows, table), args.out, "probes_trigger"))
  runs_csv = os.path.join(args.out, "runs.csv")
  results = ("accuracy_trigger", "accuracy_no_trigger", "sink")
  sweep_results.write_runs_csv([{**r, **{k: value(r, MEASURES[k]) for k in results}}
                                for r in rows], runs_csv, hyperparameters=(), results=results)
  paths.append(runs_csv)
  return paths, notes


STUDY = registry.Study(run_cli, in_all=False, needs_workdirs=True)
