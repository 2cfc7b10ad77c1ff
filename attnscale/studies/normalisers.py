"""normalisers: softmax, its amendments and the normalisers that replace it (issue #61).

    python -m attnscale.studies normalisers \\
        --workdirs docs/results/normalisers/runs.parquet --out docs/results/normalisers \\
        --sink_runs docs/results/normalisers/sink_hunt.parquet \\
        --bert_runs docs/results/normalisers/bert_runs.parquet

Reads the `normalisers` sweep (configs/shakespeare_char_sweeps.py NORMALISERS: 16
labels at preset graphcore_cpu with RoPE: softmax; its amendments sink_learned,
sink_zero, gate_headwise, gate_elementwise, fox, differential, selective; and the
normalisers sigmoid, softpick, relu, stickbreaking, each also with RMS QK-norm,
"*_qk_rmsnorm"). The sweep runs the study protocol (seed 0 searches the rate, seed 0
at every rate within two octaves of each label's best, seeds 1 and 2 at every
near-best rate), and every run is evaluated by eval.py --lengths=64,...,1024
(eval.json: the validation loss at the training length, 64, the per-layer attention
diagnostics, the loss at each length). Any partial store reads: a label is shown at
whatever stage it is, with its seed count, and a claim that needs 3 seeds says
"pending (n seeds)". Writes, into --out:

  normalisers.md/csv         per label: the best rate (lowest seed mean of the final
                             training loss among the rates with the most seeds,
                             `sweep_results.best_per_scaling`: the search's own choice),
                             the seeds there, the training and validation loss [95% t],
                             the validation loss minus softmax's at its own best rate
                             (`stats.compare`: paired by seed), Wortsman et al.'s
                             sensitivity S over the two-octave window
                             (`transfer_sensitivity.sensitivity_rows`: seed 0 unless the
                             other seeds ran the same rates), the sink rate (mean over
                             layers, largest layer), act_ratio and kurtosis (largest
                             layer), the largest max_logit (seed means), and the loss at
                             the longest length with its difference from softmax's
  normalisers_claims.md/csv  each source's claim, measured: the label minus softmax,
                             each at its best rate, paired by seed (95% t), and a verdict
                             read from the interval
  normalisers_layers.md/csv  per label and layer: sink_rate, sink_heads, act_ratio,
                             kurtosis, max_logit, seed means at the best rate
  normalisers_lengths.md/csv per label: the validation loss at each evaluated length
                             and its growth (longest minus shortest), mean [95% t]
                             over the seeds at the best rate
  normalisers.png            final training loss against learning rate, a panel per
                             label (seed dots, seed-mean line, softmax's line in grey)
  normalisers_sinks.png      sink rate and kurtosis per label and layer
  normalisers_lengths.png    validation loss against evaluated length (log2), softmax
                             family and non-softmax normalisers in two panels
  runs.csv                   every run: its row and its validation loss at each length
  normalisers_sink_hunt.md/csv  with --sink_runs STORE_OR_DIR ... (evaluated runs
                             outside the sweep: the sink hunt's,
                             docs/results/normalisers/sink_hunt.parquet): per run and
                             layer, the first key's weight (mean and largest head) beside
                             uniform attention's, the share of sink heads, act_ratio
                             and kurtosis
  normalisers_bert*          with --bert_runs STORE_OR_DIR (the bert_normalisers sweep,
                             configs/bert_small_sweeps.py: the small post-LN BERT,
                             bidirectional, padded keys excluded, with softmax,
                             gate_elementwise, softpick and relu, `BERT_LABELS`): the
                             per-label, claims and per-layer tables and the two
                             figures as above, plus masked-token accuracy (better =
                             higher), and normalisers_bert_runs.csv; no lengths (the
                             BERT has no length evaluation). Only claims (a) and (b)
                             apply: stick-breaking, FoX and selective are causal.

The claims (b - a = the label minus softmax; "lower" is what the source predicts):

  (a) Qiu et al. 2025, "Gated Attention for Large Language Models: Non-linearity,
      Sparsity, and Attention-Sink-Free", arXiv 2505.06708 (gate_headwise,
      gate_elementwise); Zuhri et al. 2025, "Softpick: No Attention Sink, No Massive
      Activations with Rectified Softmax", arXiv 2504.20966 (softpick,
      softpick_qk_rmsnorm): they remove attention sinks and massive activations at no
      loss cost. Measured: validation loss (no worse), sink rate, act_ratio and
      kurtosis (lower), and the heaviest key's weight where eval.json has it (the
      BERT's runs: its sinks may sit on [SEP]).
  (b) Wortsman et al. 2023, "Replacing softmax with ReLU in Vision Transformers",
      arXiv 2309.08586 (relu, relu_qk_rmsnorm): ReLU divided by the sequence length
      matches softmax. Measured: validation loss (no worse).
  (c) Tan et al. 2025, "Scaling Stick-Breaking Attention", arXiv 2410.17980
      (stickbreaking, stickbreaking_qk_rmsnorm); Lin et al. 2025, "Forgetting
      Transformer: Softmax Attention with a Forget Gate", arXiv 2503.02130 (fox): they
      extrapolate in length. Measured: the loss at the longest length and its growth
      from the shortest (lower).
  (d) Ye et al. 2025, "Differential Transformer", arXiv 2410.05258 (differential): a
      lower loss, less attention noise (sinks) and fewer massive activations.
      Measured: validation loss, sink rate and act_ratio (lower).

Verdicts: where the two share 3 seeds, "holds" when the interval lies on the
predicted side of 0, "contradicted" on the other, and within noise "consistent" (a
no-worse claim) or "not shown" (a lower claim); fewer shared seeds: "pending (n
seeds)". The sink rate is the mean weight on the first key; act_ratio the largest
residual activation over the median (massive activations: Sun et al. 2024, arXiv
2402.17762), kurtosis that stream's (attnscale/models/layer_stats.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence

import ml_collections
import numpy as np

from attnscale.experiments import reporting, results_store, run_records, stats, sweep_results
from attnscale.runtime import configlib
from attnscale.studies import registry, transfer_sensitivity
from attnscale.studies import sensitivity as sensitivity_study

REFERENCE = "softmax"
# The sweep's labels (configs/shakespeare_char_sweeps.py NORMALISERS) -> the
# `configlib.run_label` of their runs, in the tables' order: the softmax family, then
# each non-softmax normaliser beside its RMS QK-norm twin.
SOFTMAX_FAMILY = {"softmax": "standard", "sink_learned": "standard+sink_learned",
                  "sink_zero": "standard+sink_zero",
                  "gate_headwise": "standard+gate_headwise",
                  "gate_elementwise": "standard+gate_elementwise", "fox": "standard+fox",
                  "differential": "standard+diff", "selective": "standard+selective"}
NON_SOFTMAX = ("sigmoid", "softpick", "relu", "stickbreaking")
LABELS = SOFTMAX_FAMILY | {
    f"{n}{twin}": f"{scaling}+{n}" for n in NON_SOFTMAX
    for twin, scaling in (("", "standard"), ("_qk_rmsnorm", "qk_rmsnorm"))}
POSITIONS = "rope"
# The BERT's labels (configs/bert_small_sweeps.py BERT_NORMALISERS): the claims that need
# no causal order, (a) and (b); stick-breaking, FoX and selective attention are causal.
BERT_LABELS = ("softmax", "gate_elementwise", "softpick", "relu")
_BY_RUN_LABEL = {v: k for k, v in LABELS.items()}


def normaliser_label(config: Mapping) -> str:
  """The sweep's label of a run from its config.json (`LABELS`); a run the sweep does
  not define (other positions, another option) keeps its run_label, never averaged
  into a sweep label."""
  # The BERT's runs (post-LN) take the char LM's labels: their own store keeps them apart.
  run_label = configlib.run_label(ml_collections.ConfigDict(dict(config)))
  run_label = run_label.replace("+post_ln", "")
  positions = config["model"].get("positions", "learned")
  if positions != POSITIONS:
    return f"{run_label}+positions_{positions}"
  return _BY_RUN_LABEL.get(run_label, run_label)


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
      "label": normaliser_label(config), "width": config["model"]["width"],
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


def has_top_key(rows: Sequence[dict]) -> bool:
  """Whether any run's eval.json has the heaviest key's weight (evaluated since
  `layer_stats` measures it; the char LM's sweep was evaluated before)."""
  return any(r["eval"] and "top_key_weight" in (r["eval"].get("attention") or [{}])[0]
             for r in rows)


def _measures(rows: Sequence[dict]) -> dict[str, tuple[str, Measure]]:
  return measures(lengths_of(rows), accuracy=has_accuracy(rows), top_key=has_top_key(rows))


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


def _layers(key: str, reduce) -> Measure:
  return lambda e: float(reduce([layer[key] for layer in e["attention"]]))


def _at_length(L: int) -> Measure:
  return lambda e: float(e["lengths"][str(L)]["val_loss"])


def measures(lengths: Sequence[int], accuracy: bool = False,
             top_key: bool = False) -> dict[str, tuple[str, Measure]]:
  """name -> (what it is, its function of eval.json): the validation loss, the
  attention diagnostics (mean or largest over layers), the loss at the longest
  evaluated length and its growth from the shortest; with `accuracy` (the masked
  LM's eval.json), the masked-token accuracy in points; with `top_key` (runs
  evaluated since eval.json has it), the heaviest key's weight (largest layer)."""
  out = {"val_loss": ("val_loss", lambda e: float(e["val_loss"])),
         "sink_rate": ("sink_rate (mean over layers)", _layers("sink_rate", np.mean)),
         "sink_rate_max": ("sink_rate (largest layer)", _layers("sink_rate", max)),
         "act_ratio": ("act_ratio (largest layer)", _layers("act_ratio", max)),
         "kurtosis": ("kurtosis (largest layer)", _layers("kurtosis", max)),
         "max_logit": ("max_logit (largest layer)", _layers("max_logit", max))}
  if top_key:
    out["top_key_weight"] = ("top_key_weight (largest layer)", _layers("top_key_weight", max))
  if accuracy:
    out["accuracy"] = ("masked-token accuracy (points)", lambda e: 100 * float(e["accuracy"]))
  if lengths:
    first, last = lengths[0], lengths[-1]
    out["loss_longest"] = (f"loss@{last}", _at_length(last))
    out["growth"] = (f"loss@{last} - loss@{first}",
                     lambda e: _at_length(last)(e) - _at_length(first)(e))
  return out


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


def _train_loss(runs: Sequence[dict]) -> dict[int, float]:
  return {r["seed"]: r["final_train_loss"] for r in runs
          if math.isfinite(r["final_train_loss"])}


def _mean(values) -> float:
  values = [v for v in values if math.isfinite(v)]
  return float(np.mean(values)) if values else math.nan


# ---------------------------------------------------------------------------
# The tables.

def summary_rows(rows: Sequence[dict]) -> list[dict]:
  """One row per label in table order (module docstring, normalisers.md)."""
  best, lengths = best_runs(rows), lengths_of(rows)
  m = _measures(rows)
  sens = {r["label"]: r for r in transfer_sensitivity.sensitivity_rows(rows)}
  ref = best.get(REFERENCE, (math.nan, []))[1]
  longest = f"loss@{lengths[-1]}" if lengths else "loss@longest"
  out = []
  for label in order(r["label"] for r in rows):
    lr, runs = best.get(label, (math.nan, []))
    row = {"label": label, "best_lr": lr, "seeds": len(runs),
           "train_loss": stats.format_interval(_train_loss(runs).values()),
           "val_loss": stats.format_interval(by_seed(runs, m["val_loss"][1]).values())}
    row["val_vs_softmax"] = _versus(label, ref, runs, m["val_loss"][1])
    if "accuracy" in m:  # the masked LM's: higher is better
      accuracy = by_seed(runs, m["accuracy"][1]).values()
      row["accuracy_pct"] = stats.format_interval(accuracy, ".2f")
      row["acc_vs_softmax"] = _versus(label, ref, runs, m["accuracy"][1], higher=True)
    s = sens.get(label, {})
    row |= {"S": s.get("S", math.nan), "S_rates": s.get("rates", 0)}
    for name in ("sink_rate", "sink_rate_max", "top_key_weight", "act_ratio", "kurtosis",
                 "max_logit"):
      if name in m:
        row[name] = _mean(by_seed(runs, m[name][1]).values())
    if lengths:
      row[longest] = _mean(by_seed(runs, m["loss_longest"][1]).values())
      row[f"{longest}_vs_softmax"] = _versus(label, ref, runs, m["loss_longest"][1])
    out.append(row)
  return out


def _versus(label: str, ref: Sequence[dict], runs: Sequence[dict], measure: Measure,
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


@dataclasses.dataclass(frozen=True)
class Claim:
  """A source's claim against softmax: its labels and, per measure (`measures`), what
  the source predicts for the label minus softmax: "lower" or "no worse"."""

  claim: str
  source: str
  says: str
  labels: tuple[str, ...]
  predicts: tuple[tuple[str, str], ...]


_NO_SINKS = (("val_loss", "no worse"), ("sink_rate", "lower"), ("top_key_weight", "lower"),
             ("act_ratio", "lower"), ("kurtosis", "lower"))
_EXTRAPOLATES = (("loss_longest", "lower"), ("growth", "lower"))
CLAIMS = (
    Claim("(a)", "Qiu et al. 2025, arXiv 2505.06708",
          "an output gate removes attention sinks and massive activations at no loss cost",
          ("gate_headwise", "gate_elementwise"), _NO_SINKS),
    Claim("(a)", "Zuhri et al. 2025, arXiv 2504.20966",
          "softpick removes attention sinks and massive activations at no loss cost",
          ("softpick", "softpick_qk_rmsnorm"), _NO_SINKS),
    Claim("(b)", "Wortsman et al. 2023, arXiv 2309.08586",
          "ReLU divided by the sequence length matches softmax",
          ("relu", "relu_qk_rmsnorm"), (("val_loss", "no worse"),)),
    Claim("(c)", "Tan et al. 2025, arXiv 2410.17980",
          "stick-breaking attention extrapolates in length",
          ("stickbreaking", "stickbreaking_qk_rmsnorm"), _EXTRAPOLATES),
    Claim("(c)", "Lin et al. 2025, arXiv 2503.02130",
          "the forget gate (FoX) extrapolates in length", ("fox",), _EXTRAPOLATES),
    Claim("(d)", "Ye et al. 2025, arXiv 2410.05258",
          "differential attention lowers the loss, attention noise (sinks) and massive "
          "activations", ("differential",),
          (("val_loss", "lower"), ("sink_rate", "lower"), ("act_ratio", "lower"))),
)


def verdict(c: stats.Comparison, predicts: str, shared: int) -> str:
  """The claim read from the interval of b - a (module docstring); "pending (n
  seeds)" with fewer than `stats.MIN_SEEDS` shared seeds."""
  if shared < stats.MIN_SEEDS:
    return f"pending ({shared} seed{'s' * (shared != 1)})"
  if c.verdict == "better":
    return "holds (lower)"
  if c.verdict == "worse":
    return "contradicted (higher)"
  return "consistent (within noise)" if predicts == "no worse" else "not shown (within noise)"


def claim_rows(rows: Sequence[dict], claims: Sequence[Claim] = CLAIMS) -> list[dict]:
  """Each claim's label and measure: the label minus softmax, each at its best rate,
  paired by seed (`stats.compare`), and the verdict. Every claimed label has its rows,
  one not in the store yet too ("pending (0 seeds)")."""
  best = best_runs(rows)
  m = _measures(rows)
  ref = best.get(REFERENCE, (math.nan, []))[1]
  out = []
  for c in claims:
    for label in c.labels:
      runs = best.get(label, (math.nan, []))[1]
      for name, predicts in c.predicts:
        if name == "top_key_weight" and name not in m:
          continue  # runs evaluated before eval.json had it
        what, f = m.get(name, (name, None))
        a, b = (by_seed(ref, f), by_seed(runs, f)) if f else ({}, {})
        shared = len(set(a) & set(b))
        comparison = stats.compare(a, b)
        out.append({"claim": c.claim, "source": c.source.split(",")[0], "label": label,
                    "measure": what, "predicts": predicts,
                    "difference": comparison.format(verdict=False) if b else "",
                    "seeds": shared, "verdict": verdict(comparison, predicts, shared)})
  return out


LAYER_KEYS = ("sink_rate", "top_key_weight", "sink_heads", "act_ratio", "kurtosis",
              "max_logit")


def layer_rows(rows: Sequence[dict]) -> list[dict]:
  """Per label and layer: LAYER_KEYS, seed means over the evaluated runs at the best
  rate."""
  keys = [k for k in LAYER_KEYS if k != "top_key_weight" or has_top_key(rows)]
  out = []
  for label, (lr, runs) in _ordered_best(rows):
    evaluated = [r for r in runs if r["eval"] and r["eval"].get("attention")]
    if not evaluated:
      continue
    for i in range(min(len(r["eval"]["attention"]) for r in evaluated)):
      out.append({"label": label, "best_lr": lr, "seeds": len(evaluated), "layer": i,
                  **{k: _mean(float(r["eval"]["attention"][i].get(k, math.nan))
                              for r in evaluated) for k in keys}})
  return out


def length_rows(rows: Sequence[dict]) -> list[dict]:
  """Per label: the validation loss at each evaluated length and its growth, mean
  [95% t] over the seeds at the best rate."""
  lengths = lengths_of(rows)
  if not lengths:
    return []
  growth = measures(lengths)["growth"][1]
  out = []
  for label, (lr, runs) in _ordered_best(rows):
    row = {"label": label, "best_lr": lr, "seeds": len(by_seed(runs, _at_length(lengths[-1])))}
    row |= {f"L={L}": stats.format_interval(by_seed(runs, _at_length(L)).values())
            for L in lengths}
    row[f"L={lengths[-1]} - L={lengths[0]}"] = stats.format_interval(
        by_seed(runs, growth).values(), "+.3f")
    out.append(row)
  return out


def _ordered_best(rows: Sequence[dict]) -> list[tuple[str, tuple[float, list[dict]]]]:
  best = best_runs(rows)
  return [(label, best[label]) for label in order(best)]


# ---------------------------------------------------------------------------
# The figures.

def _family(label: str) -> int:
  """0 for the softmax family, 1 for the non-softmax normalisers (and any other)."""
  return 0 if label in SOFTMAX_FAMILY else 1


def plot_rates(rows: Sequence[dict]):
  """Final training loss against learning rate, a panel per label (4 a row, each
  normaliser beside its QK-norm twin): seed dots, the seed-mean line, the best rate
  ringed, diverged seeds as x on the top edge, softmax's seed means in grey."""
  labels = order(r["label"] for r in rows)
  best = best_runs(rows)
  finite = [r["final_train_loss"] for r in rows if math.isfinite(r["final_train_loss"])]
  low = min(finite) if finite else 0.0
  top = low + 0.8  # the near-best region: diverged and far rates sit on the edge
  cols = 4
  fig = reporting.new_figure(3.2 * cols, 2.6 * math.ceil(len(labels) / cols))
  axes = fig.subplots(math.ceil(len(labels) / cols), cols, squeeze=False, sharex=True,
                      sharey=True)
  reference = _seed_means(rows, REFERENCE)
  for ax, label in zip(axes.flat, labels):
    if label != REFERENCE and reference:
      ax.plot(*zip(*reference), color="0.6", ls="--", lw=1, label=REFERENCE)
    style = reporting.style(_family(label))
    means = _seed_means(rows, label)
    if means:
      ax.plot(*zip(*means), color=style["color"], lw=1.5)
    runs = [r for r in rows if r["label"] == label]
    done = [r for r in runs if math.isfinite(r["final_train_loss"])]
    ax.plot([r["learning_rate"] for r in done],
            [min(r["final_train_loss"], top) for r in done], ".", color=style["color"],
            alpha=0.6, ms=6)
    diverged = [r["learning_rate"] for r in runs if not math.isfinite(r["final_train_loss"])]
    ax.plot(diverged, [top] * len(diverged), "x", color="tab:red", ms=6)
    if label in best:
      lr, at = best[label]
      ax.plot([lr], [_mean(r["final_train_loss"] for r in at)], "o", mfc="none",
              color="k", ms=10)
    seeds = len(best.get(label, (0, []))[1])
    ax.set_title(f"{label} ({seeds} seed{'s' * (seeds != 1)} at best)", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_ylim(low - 0.05, top + 0.05)
    ax.grid(True, alpha=0.3)
  for ax in axes.flat[len(labels):]:
    ax.set_visible(False)
  for ax in axes[-1]:
    ax.set_xlabel("learning rate")
  for ax in axes[:, 0]:
    ax.set_ylabel("final training loss")
  if reference and len(labels) > 1:  # softmax's panel is the first: its line, the second's
    axes.flat[1].legend(fontsize=7, loc="upper left")
  fig.suptitle("Loss against learning rate: dots seeds, line seed mean, ring the best "
               "rate, x diverged (drawn at the top)")
  return fig


def _seed_means(rows: Sequence[dict], label: str) -> list[tuple[float, float]]:
  """(rate, seed mean) of the rates where every seed of `label` finished."""
  by_rate: dict[float, list[float]] = {}
  for r in rows:
    if r["label"] == label:
      by_rate.setdefault(r["learning_rate"], []).append(r["final_train_loss"])
  return [(lr, float(np.mean(v))) for lr, v in sorted(by_rate.items())
          if all(map(math.isfinite, v))]


def plot_sinks(layers: Sequence[dict]):
  """Sink rate and kurtosis per label (rows) and layer (columns), seed means at the
  best rate, each cell written in; kurtosis on a log colour scale (massive activations
  put it in the hundreds, a Gaussian stream has 3)."""
  from matplotlib.colors import LogNorm, Normalize

  labels = list(dict.fromkeys(r["label"] for r in layers))
  depth = max((r["layer"] for r in layers), default=-1) + 1
  fig = reporting.new_figure(12, 1.0 + 0.38 * max(len(labels), 1))
  for ax, key, fmt in zip(fig.subplots(1, 2), ("sink_rate", "kurtosis"), (".2f", ".1f")):
    grid_LY = np.full((max(len(labels), 1), max(depth, 1)), np.nan)
    for r in layers:
      grid_LY[labels.index(r["label"]), r["layer"]] = r[key]
    finite = grid_LY[np.isfinite(grid_LY)]
    norm = (LogNorm(finite.min(), max(finite.max(), finite.min() * 1.01))
            if key == "kurtosis" and finite.size and finite.min() > 0 else
            Normalize(0.0, max(finite.max(), 1e-6) if finite.size else 1.0))
    image = ax.imshow(grid_LY, aspect="auto", cmap="viridis", norm=norm)
    for (i, j), v in np.ndenumerate(grid_LY):
      if math.isfinite(v):  # dark text on the bright end of viridis
        ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=7,
                color="k" if norm(v) > 0.6 else "w")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xticks(range(depth))
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax.set_xlabel("layer")
    ax.set_title(f"{key} (seed mean at the best rate)")
  return fig


def plot_lengths(rows: Sequence[dict]):
  """Validation loss against evaluated length, the softmax family and the non-softmax
  normalisers in two panels: seed mean at the best rate, band the seeds' range; the
  QK-norm twins dashed; the training length dotted."""
  lengths = lengths_of(rows)
  fig = reporting.new_figure(13, 4.8)
  axes = fig.subplots(1, 2, sharey=True)
  colours: list[dict[str, int]] = [{}, {}]  # per panel: a twin takes its normaliser's
  for label, (_, runs) in _ordered_best(rows):
    loss_RL = np.array([[value(r, _at_length(L)) for L in lengths] for r in runs])
    loss_RL = loss_RL[np.all(np.isfinite(loss_RL), axis=1)] if loss_RL.size else loss_RL
    if not lengths or not len(loss_RL):
      continue
    family, base = _family(label), label.removesuffix("_qk_rmsnorm")
    ax = axes[family]
    style = reporting.style(colours[family].setdefault(base, len(colours[family])))
    ax.plot(lengths, loss_RL.mean(0), label=f"{label} ({len(loss_RL)})",
            ls="--" if label.endswith("_qk_rmsnorm") else "-", **style)
    ax.fill_between(lengths, loss_RL.min(0), loss_RL.max(0), color=style["color"], alpha=0.12)
  train = {r["train_len"] for r in rows}
  for ax, title in zip(axes, ("softmax and its amendments", "non-softmax normalisers "
                              "(dashed: + RMS QK-norm)")):
    ax.set_xscale("log", base=2)
    for L in train:
      ax.axvline(L, color="k", lw=0.8, ls=":")
    reporting.label_axes(ax, xlabel="evaluation length", ylabel="validation loss (nats)",
                         title=title + "; (n): seeds")
  return fig


# ---------------------------------------------------------------------------
# The command line.

def _notes(rows: Sequence[dict], workdir: str, code: str) -> list[str]:
  best = best_runs(rows)
  missing = [k for k in LABELS if k not in {r["label"] for r in rows}]
  short = [f"{k} ({len(best[k][1])})" for k in order(best)
           if len(best[k][1]) < stats.MIN_SEEDS]
  notes = [f"{len(rows)} finished runs of the normalisers sweep ({workdir}); "
           f"{sum(r['eval'] is not None for r in rows)} evaluated (eval.json)."]
  if missing:
    notes.append("Not in the store yet: " + ", ".join(missing) + ".")
  if short:
    notes.append(f"Fewer than {stats.MIN_SEEDS} seeds at the best rate (still running): "
                 + ", ".join(short) + ".")
  return notes + [code]


# ---------------------------------------------------------------------------
# Where sinks form: any evaluated runs (the sink hunt's), per layer.


def uniform_first_key(T: int, causal: bool = True) -> float:
  """The first key's weight under uniform attention, as `layer_stats` averages it:
  over the queries that see more than one key, mean_{i=1}^{T-1} 1/(i+1) causally
  (query i sees i + 1 keys), 1/T bidirectionally. A sink sits far above it."""
  return float(np.mean(1.0 / np.arange(2, T + 1))) if causal else 1.0 / T


def sink_hunt_rows(paths: Sequence[str]) -> list[dict]:
  """Per evaluated run of `paths` (stores or folders of runs) and layer: the run's
  task, size, steps and validation loss, and eval.json's first-key weight (mean and
  largest head), Gu et al.'s share of sink heads (mean weight > 0.3), the uniform
  weight for comparison, act_ratio and kurtosis."""
  rows = []
  for workdir in results_store.workdirs(paths):
    for name in sorted(os.listdir(workdir)):
      run = os.path.join(workdir, name)
      if not run_records.evaluated(run):
        continue
      with open(os.path.join(run, "config.json")) as f:
        config = json.load(f)
      with open(os.path.join(run, "eval.json")) as f:
        result = json.load(f)
      model = config["model"]
      T = int(config.get("seq_len", model["block_size"]))
      causal = bool(model.get("causal", True))
      size = f"{model['num_layers']}x{model['width']}, T={T}, {config['num_train_steps']} steps"
      for i, layer in enumerate(result["attention"]):
        rows.append({"run": name, "size": size, "val_loss": float(result["val_loss"]),
                     "layer": i, "sink_rate": layer["sink_rate"],
                     "sink_rate_max_head": max(layer["heads"]["sink_rate"]),
                     "uniform": uniform_first_key(T, causal),
                     "sink_heads": layer["sink_heads"], "act_ratio": layer["act_ratio"],
                     "kurtosis": layer["kurtosis"]})
  return rows


def _read(path: str, flag: str) -> tuple[list[dict], str]:
  """The runs of one store or sweep folder, and how the tables name it."""
  if results_store.is_store(path) and os.path.exists(results_store.split(path)[0]):
    path = results_store.workdir(path)  # unpacked, as --workdirs is
  if not os.path.isdir(path):
    raise SystemExit(f"normalisers: {flag} must be a store or sweep folder "
                     f"(docs/results/normalisers/runs.parquet); got {path!r}")
  rows = read_rows(path)
  if not rows:
    raise SystemExit(f"normalisers: no finished runs in {flag} {results_store.shown(path)}")
  return rows, results_store.shown(path)


def write_label_tables(rows: Sequence[dict], out: str, name: str, *, what: str,
                       notes: Sequence[str], code: str, claims: Sequence[Claim]) -> list[str]:
  """<name>.md/csv (per label), <name>_claims, <name>_layers and the two figures
  (<name>.png, <name>_sinks.png): the char LM's and the BERT's alike. `what`: the
  model and its evaluation, for the notes."""
  lengths = lengths_of(rows)
  longest = f", loss@{lengths[-1]}_vs_softmax" if lengths else ""
  accuracy = (" accuracy_pct: masked-token accuracy in points, mean [95% t]; "
              "acc_vs_softmax: its difference, better = higher." if has_accuracy(rows) else "")
  top_key = ("top_key_weight: the heaviest key's mean weight in each row, wherever it "
             "sits (a [CLS], [SEP] or delimiter sink too), largest layer; "
             if has_top_key(rows) else "")
  top_key_layer = ("top_key_weight (the heaviest key's, wherever it sits), "
                   if has_top_key(rows) else "")
  rate = {"best_lr": reporting.power_of_two}
  paths = reporting.write_tables(
      summary_rows(rows), out, name, floats=".3f", formats=rate,
      title=f"Normalisers{what}: each label at its best rate",
      notes=[*notes,
             "best_lr: the lowest seed mean of the final training loss (the mean of the last "
             "20 steps) among the rates with the most seeds (the search's choice); seeds: "
             "there. train_loss, val_loss (eval.py, the whole validation split at the "
             "training length): mean [95% t] over those seeds." + accuracy,
             f"val_vs_softmax{longest}: the label minus softmax, each at its best rate, 95% "
             "t, paired by seed on the shared seeds (Welch's where fewer than 2 are shared; "
             "attnscale.experiments.stats.compare): worse / better where the interval "
             "excludes 0.",
             "S: Wortsman et al.'s learning-rate sensitivity (arXiv 2309.14322) over the "
             f"rates within {transfer_sensitivity.WINDOW} octaves of the best, seed 0 "
             "(attnscale/studies/transfer_sensitivity.py); S_rates: those rates (5 once the "
             "window is complete).",
             "sink_rate: the weight on the first key, mean over layers (sink_rate_max: the "
             f"largest layer); {top_key}act_ratio: the largest residual activation over the "
             "median, "
             "kurtosis: that stream's, max_logit: the largest logit, each the largest "
             f"layer; seed means (per layer: {name}_layers)."])
  paths += reporting.write_tables(
      claim_rows(rows, claims), out, f"{name}_claims", floats=".3f",
      title=f"Normalisers{what}: the sources' claims against softmax",
      notes=[*(f"{c.claim} {c.source}: {c.says} ({', '.join(c.labels)})." for c in claims),
             "difference: the label minus softmax on the measure, each at its best rate, "
             "95% t, paired by seed (attnscale.experiments.stats.compare); seeds: those "
             "both have. val_loss: eval.py's, the whole validation split at the training "
             f"length; loss@L: in windows of L; sink_rate, act_ratio, kurtosis: as in "
             f"{name}.md, per seed. predicts: the source's sign. verdict: holds (the "
             "interval on the predicted side of 0), contradicted (the other side), "
             "consistent (a no-worse claim within noise), not shown (a lower claim within "
             f"noise); pending (n seeds) with fewer than {stats.MIN_SEEDS} shared seeds.",
             code])
  layers = layer_rows(rows)
  paths += reporting.write_tables(
      layers, out, f"{name}_layers", floats=".3f", formats=rate,
      title=f"Normalisers{what}: attention diagnostics per layer",
      notes=["eval.py's diagnostics on the first validation batch (eval.json 'attention'): "
             f"sink_rate (weight on the first key), {top_key_layer}sink_heads (the share of heads "
             "whose mean weight on the first key exceeds 0.3, Gu et al. 2025), act_ratio "
             "and kurtosis of "
             "the residual stream the layer's block writes, max_logit; seed means at the "
             "best rate (seeds: the evaluated ones).", code])
  for fig_name, fig in ((name, plot_rates(rows)), (f"{name}_sinks", plot_sinks(layers))):
    paths.append(reporting.save_figure(fig, out, fig_name))
  return paths


def _runs_csv(rows: Sequence[dict], path: str) -> str:
  """Every run: its row, its validation loss at each length and (the BERT's) accuracy."""
  lengths = lengths_of(rows)
  results = [f"val_loss_L{L}" for L in lengths] + ["accuracy"] * has_accuracy(rows)
  sweep_results.write_runs_csv(
      [{**r, **{f"val_loss_L{L}": value(r, _at_length(L)) for L in lengths},
        "accuracy": value(r, lambda e: float(e["accuracy"]))} for r in rows],
      path, hyperparameters=(), results=results)
  return path


def run_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies normalisers --out DIR --workdirs STORE_OR_SWEEP_DIR`."""
  if len(args.workdirs) != 1:
    raise SystemExit("normalisers: give --workdirs STORE_OR_DIR, the normalisers sweep's "
                     "store (docs/results/normalisers/runs.parquet) or workdir")
  rows, shown = _read(args.workdirs[0], "--workdirs")
  code = registry.code_note(rows, args, "normalisers")
  notes = _notes(rows, shown, code)
  lengths = lengths_of(rows)
  paths = write_label_tables(
      rows, args.out, "normalisers", what="", notes=notes, code=code, claims=CLAIMS)
  paths += reporting.write_tables(
      length_rows(rows), args.out, "normalisers_lengths",
      formats={"best_lr": reporting.power_of_two},
      title="Normalisers: validation loss against evaluated length",
      notes=["eval.py --lengths: the loss over the whole validation split in windows of "
             "each length (trained at 64); mean [95% t] over the seeds at the best rate; "
             "last column: the longest minus the shortest.", code])
  if lengths:
    paths.append(reporting.save_figure(plot_lengths(rows), args.out, "normalisers_lengths"))
  if args.sink_runs:
    paths += reporting.write_tables(
        sink_hunt_rows(args.sink_runs), args.out, "normalisers_sink_hunt", floats=".3f",
        title="Where do sinks form? Evaluated runs outside the sweep, per layer",
        notes=[f"--sink_runs {' '.join(results_store.shown(p) for p in args.sink_runs)}; "
               "eval.py's diagnostics (eval.json 'attention'): sink_rate, the weight on the "
               "first key over the queries that see more than one key, mean over heads "
               "(sink_rate_max_head: the largest head); uniform: that weight under uniform "
               "attention; sink_heads: the share of heads above 0.3 (Gu et al. 2025, arXiv "
               "2410.10781); act_ratio, kurtosis: the residual stream the block writes."])
  if args.bert_runs:
    paths += bert_tables(args.bert_runs, args.out, args)
  paths.append(_runs_csv(rows, os.path.join(args.out, "runs.csv")))
  return paths, notes


def bert_tables(path: str, out: str, args) -> list[str]:
  """--bert_runs: the small BERT's runs (bert_normalisers): normalisers_bert*.md/csv,
  its figures and normalisers_bert_runs.csv."""
  rows, shown = _read(path, "--bert_runs")
  code = registry.code_note(rows, args, "normalisers")
  claims = [dataclasses.replace(c, labels=tuple(k for k in c.labels if k in BERT_LABELS))
            for c in CLAIMS if set(c.labels) & set(BERT_LABELS)]
  best = best_runs(rows)
  short = [f"{k} ({len(best.get(k, (0, []))[1])})" for k in BERT_LABELS
           if len(best.get(k, (0, []))[1]) < stats.MIN_SEEDS]
  notes = [f"{len(rows)} finished runs of the bert_normalisers sweep ({shown}), "
           f"{sum(r['eval'] is not None for r in rows)} evaluated: the small BERT "
           "(configs/bert_small.py preset=cpu: post-LN, RoPE, bidirectional, padded keys "
           "excluded), the first key its [CLS]; uniform attention puts 1/T on it, T the "
           "row's real tokens (<= 128)."]
  if short:
    notes.append(f"Fewer than {stats.MIN_SEEDS} seeds at the best rate (still running): "
                 + ", ".join(short) + ".")
  paths = write_label_tables(rows, out, "normalisers_bert", what=" in the small BERT",
                             notes=notes + [code], code=code, claims=claims)
  return paths + [_runs_csv(rows, os.path.join(out, "normalisers_bert_runs.csv"))]


# Reads the normalisers sweep's layout: only when asked for.
def add_arguments(p) -> None:
  g = p.add_argument_group("normalisers")
  g.add_argument(
      "--sink_runs", nargs="*", default=[], metavar="STORE_OR_DIR",
      help="evaluated runs outside the sweep (the sink hunt's: "
           "docs/results/normalisers/sink_hunt.parquet): normalisers_sink_hunt.md/csv, "
           "their sinks and activations per layer")
  g.add_argument(
      "--bert_runs", default=None, metavar="STORE_OR_DIR",
      help="the bert_normalisers sweep's runs (configs/bert_small_sweeps.py; "
           "docs/results/normalisers/bert_runs.parquet): normalisers_bert*.md/csv and "
           "figures, the same tables for the small BERT")


STUDY = registry.Study(run_cli, in_all=False, needs_workdirs=True, arguments=add_arguments)
