"""The normalisers sweeps' runs (docs/experiments/normalisers.md): each run's label
from its config.json, the finished runs of a store or folder as rows with their
eval.json, each label's best rate, and the measures the tables and figures read off an
eval.json (attnscale/studies/normalisers.py, normalisers_figures.py).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from attnscale.config import labels
from attnscale.experiments import run_records, stats, sweep_results, sweeps, verdicts
from attnscale.studies import sensitivity as sensitivity_study

REFERENCE = "softmax"


def _table_order(declared: Mapping[str, tuple[str, dict]]) -> tuple[str, ...]:
  """The softmax family (the labels that keep softmax), then each other normaliser
  beside its twins (the same normaliser under another scaling), in the sweep's order."""
  normaliser = {k: o.get("model.normalizer", "softmax") for k, (_, o) in declared.items()}
  family = [k for k in declared if normaliser[k] == "softmax"]
  others = dict.fromkeys(n for n in normaliser.values() if n != "softmax")
  return tuple(family) + tuple(k for n in others for k in declared if normaliser[k] == n)


# The labels are the sweeps' (each run's config.label, which the sweep writes and the
# committed stores hold): the char LM's from configs/shakespeare_char_sweeps.py
# NORMALISERS, the BERT's from configs/bert_small_sweeps.py BERT_NORMALISERS.
_NORMALISERS = sweeps.declared("shakespeare_char.py", "NORMALISERS")
LABELS = _table_order(_NORMALISERS)
SOFTMAX_FAMILY = tuple(k for k in LABELS
                       if _NORMALISERS[k][1].get("model.normalizer", "softmax") == "softmax")
# The BERT's labels: the claims that need no causal order, (a) and (b); stick-breaking,
# FoX and selective attention are causal.
BERT_LABELS = tuple(sweeps.declared("bert_small.py", "BERT_NORMALISERS"))


def order(labels) -> list[str]:
  """The labels in the tables' order: the sweep's (`LABELS`), then any other, sorted."""
  present = set(labels)
  return [k for k in LABELS if k in present] + sorted(present - set(LABELS))


# ---------------------------------------------------------------------------
# Reading the runs.

def read_rows(workdir: str) -> list[dict]:
  """The sweep's finished (or diverged) runs (`sensitivity.read_rows`), each with its
  label, width (what `transfer_sensitivity` groups by: one here), training length and
  its eval.json (None until eval.py has evaluated its last step), in table order."""
  rows = sensitivity_study.read_rows(workdir, lambda config: {
      "label": labels.of(config), "width": config["model"]["width"],
      "train_len": config["seq_len"]})
  for row in rows:
    run = os.path.join(workdir, row["run"])
    row["eval"] = None
    if run_records.evaluated(run):
      with open(os.path.join(run, "eval.json")) as f:
        row["eval"] = json.load(f)
  rank = {k: i for i, k in enumerate(order(r["label"] for r in rows))}
  return sorted(rows, key=lambda r: (rank[r["label"]], r["learning_rate"], r["seed"]))


def has_accuracy(rows: Sequence[dict]) -> bool:
  """Whether any run's eval.json has a masked-token accuracy (the BERT's)."""
  return any(r["eval"] and "accuracy" in r["eval"] for r in rows)


def has_layer_key(rows: Sequence[dict], key: str) -> bool:
  """Whether any run's eval.json has `key` per layer (a `LATER_MEASURES` key only
  where the run was evaluated since `layer_stats` recorded it)."""
  return any(r["eval"] and key in (r["eval"].get("attention") or [{}])[0] for r in rows)


def later_measures(rows: Sequence[dict]) -> tuple[str, ...]:
  """The `LATER_MEASURES` some run's eval.json has."""
  return tuple(k for k in LATER_MEASURES if has_layer_key(rows, k))


def lengths_of(rows: Sequence[dict]) -> list[int]:
  """The evaluated lengths of any run, ascending."""
  return sorted({int(L) for r in rows if r["eval"] for L in r["eval"].get("lengths", {})})


def best_runs(rows: Sequence[dict]) -> dict[str, tuple[float, list[dict]]]:
  """{label: (best rate, its finished runs)}: the lowest seed mean of the final
  training loss among the label's rates with the most finished seeds
  (`sweep_results.best_per_scaling`, the staged search's own choice). A label whose
  every run diverged has none."""
  best = sweep_results.best_per_scaling([dict(r, scaling=r["label"]) for r in rows])
  return {label: (b["learning_rate"],
                  [r for r in rows if r["label"] == label and r["status"] == "done"
                   and r["learning_rate"] == b["learning_rate"]])
          for label, b in best.items()}


# ---------------------------------------------------------------------------
# What is measured on a run: a function of its eval.json.

Measure = Callable[[dict], float]
# Measures eval.json has only since layer_stats recorded them: a table or claim leaves
# one out where no run has it (the char LM's sweep was evaluated before top_key_weight).
LATER_MEASURES = ("top_key_weight",)


def _layers(key: str, reduce) -> Measure:
  return lambda e: float(reduce([layer[key] for layer in e["attention"]]))


def at_length(L: int) -> Measure:
  return lambda e: float(e["lengths"][str(L)]["val_loss"])


def measures(lengths: Sequence[int], accuracy: bool = False,
             later: Sequence[str] = ()) -> dict[str, tuple[str, Measure]]:
  """name -> (what it is, its function of eval.json): the validation loss, the
  attention diagnostics (mean or largest over layers), the loss at the longest
  evaluated length and its growth from the shortest; with `accuracy` (the masked
  LM's eval.json), the masked-token accuracy in points; each of `later` (the
  `LATER_MEASURES` the runs have: top_key_weight, the heaviest key's weight), its
  largest layer."""
  out = {"val_loss": ("val_loss", lambda e: float(e["val_loss"])),
         "sink_rate": ("sink_rate (mean over layers)", _layers("sink_rate", np.mean)),
         "sink_rate_max": ("sink_rate (largest layer)", _layers("sink_rate", max)),
         "act_ratio": ("act_ratio (largest layer)", _layers("act_ratio", max)),
         "kurtosis": ("kurtosis (largest layer)", _layers("kurtosis", max)),
         "max_logit": ("max_logit (largest layer)", _layers("max_logit", max))}
  for key in later:
    out[key] = (f"{key} (largest layer)", _layers(key, max))
  if accuracy:
    out["accuracy"] = ("masked-token accuracy (points)", lambda e: 100 * float(e["accuracy"]))
  if lengths:
    first, last = lengths[0], lengths[-1]
    out["loss_longest"] = (f"loss@{last}", at_length(last))
    out["growth"] = (f"loss@{last} - loss@{first}",
                     lambda e: at_length(last)(e) - at_length(first)(e))
  return out


def measures_of(rows: Sequence[dict]) -> dict[str, tuple[str, Measure]]:
  """`measures` for these runs: their lengths, and accuracy and the later measures
  where some run's eval.json has them."""
  return measures(lengths_of(rows), accuracy=has_accuracy(rows), later=later_measures(rows))


def value(run: dict, measure: Measure) -> float:
  """`measure` of the run's eval.json; NaN where it has none or lacks the field."""
  if not run["eval"]:
    return math.nan
  try:
    return measure(run["eval"])
  except (KeyError, TypeError, ValueError):
    return math.nan


def by_seed(runs: Sequence[dict], measure: Measure) -> dict[int, float]:
  """{seed: measure} over the runs where it is finite."""
  values = {r["seed"]: value(r, measure) for r in runs}
  return {s: v for s, v in values.items() if math.isfinite(v)}


def mean_finite(values) -> float:
  """The mean of the finite values; NaN where there are none."""
  values = [v for v in values if math.isfinite(v)]
  return float(np.mean(values)) if values else math.nan


def ordered_best(rows: Sequence[dict]) -> list[tuple[str, tuple[float, list[dict]]]]:
  """`best_runs` in the tables' order."""
  best = best_runs(rows)
  return [(label, best[label]) for label in order(best)]


# ---------------------------------------------------------------------------
# Each label against softmax.

def runs_of(rows: Sequence[dict], label: str) -> list[dict]:
  return [r for r in rows if r["label"] == label and r["status"] == "done"]


def ties_cell(rows: Sequence[dict], label: str, lr: float) -> str:
  """The label's tie set on the measure its best rate is chosen by (training loss)."""
  runs = runs_of(rows, label)
  if not runs or not math.isfinite(lr):
    return ""
  return verdicts.ties_cell(verdicts.by_rate(runs, lambda r: r["final_train_loss"]), lr)


def readings(rows: Sequence[dict], table: list[dict], name: str, measure: Measure,
             higher: bool = False) -> None:
  """Adds `<name>_robust` (the verdict over every pairing of softmax's and the
  label's tie sets) and `<name>_holm` (Holm-adjusted p over the labels and the
  verdict it allows) to each row of `table`, after `<name>`'s comparison. `higher`:
  a higher value is better (accuracy)."""
  best = best_runs(rows)
  ref_lr, ref_runs = best.get(REFERENCE, (math.nan, []))
  ties = {label: stats.tie_set(verdicts.by_rate(runs_of(rows, label),
                                                lambda r: r["final_train_loss"]), lr)
          for label, (lr, runs) in best.items() if runs}
  ref_by_rate = verdicts.by_rate(runs_of(rows, REFERENCE), lambda r: value(r, measure))
  comparisons = {}
  for row in table:
    label = row["label"]
    runs = best.get(label, (math.nan, []))[1]
    if label == REFERENCE or not runs or not ref_runs:
      row[f"{name}_robust"] = row[f"{name}_holm"] = "reference" if label == REFERENCE else ""
      continue
    comparisons[label] = stats.compare(by_seed(ref_runs, measure), by_seed(runs, measure))
    row[f"{name}_robust"] = verdicts.robust(
        ref_by_rate, verdicts.by_rate(runs_of(rows, label), lambda r: value(r, measure)),
        ties[REFERENCE], ties[label], higher_is_better=higher)
  for label, cell in verdicts.family(comparisons, higher_is_better=higher).items():
    next(r for r in table if r["label"] == label)[f"{name}_holm"] = cell


def versus(label: str, ref: Sequence[dict], runs: Sequence[dict], measure: Measure,
            higher: bool = False) -> str:
  """The label minus softmax on `measure`, formatted (`stats.compare`); "reference"
  for softmax itself, "" where the label has no run at a best rate. `higher`: a
  higher value is better (accuracy), so compare's "worse" reads "better"."""
  if label == REFERENCE:
    return "reference"
  if not runs:
    return ""
  return stats.compare(by_seed(ref, measure), by_seed(runs, measure)).format(
      higher_is_better=higher)
