"""normalisers: softmax, its amendments and the normalisers that replace it (docs/experiments/normalisers.md).

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
  normalisers_sinks.png      sink rate, the heaviest key's weight (where eval.json has
                             it) and kurtosis per label and layer
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

The runs, their labels and the measures read off eval.json live in
normalisers_runs.py; the figures in normalisers_figures.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence

import numpy as np

from attnscale.experiments import (
  reporting,
  results_store,
  run_records,
  stats,
  sweep_results,
  verdicts,
)
from attnscale.studies import registry, transfer_sensitivity
from attnscale.studies.normalisers_figures import plot_lengths, plot_rates, plot_sinks
from attnscale.studies.normalisers_runs import (
  BERT_LABELS,
  LABELS,
  LATER_MEASURES,
  REFERENCE,
  at_length,
  best_runs,
  by_seed,
  has_accuracy,
  has_layer_key,
  later_measures,
  lengths_of,
  mean_finite,
  measures,
  measures_of,
  order,
  ordered_best,
  read_rows,
  readings,
  ties_cell,
  value,
  versus,
)

# ---------------------------------------------------------------------------
# The tables.

def _train_loss(runs: Sequence[dict]) -> dict[int, float]:
  return {r["seed"]: r["final_train_loss"] for r in runs
          if math.isfinite(r["final_train_loss"])}


def summary_rows(rows: Sequence[dict]) -> list[dict]:
  """One row per label in table order (module docstring, normalisers.md), with the
  protocol's two readings of each comparison against softmax (`readings`)."""
  best, lengths = best_runs(rows), lengths_of(rows)
  m = measures_of(rows)
  sens = {r["label"]: r for r in transfer_sensitivity.sensitivity_rows(rows)}
  ref = best.get(REFERENCE, (math.nan, []))[1]
  longest = f"loss@{lengths[-1]}" if lengths else "loss@longest"
  out = []
  for label in order(r["label"] for r in rows):
    lr, runs = best.get(label, (math.nan, []))
    row = {"label": label, "best_lr": lr, "ties": ties_cell(rows, label, lr), "seeds": len(runs),
           "train_loss": stats.format_interval(_train_loss(runs).values()),
           "val_loss": stats.format_interval(by_seed(runs, m["val_loss"][1]).values())}
    row["val_vs_softmax"] = versus(label, ref, runs, m["val_loss"][1])
    if "accuracy" in m:  # the masked LM's: higher is better
      accuracy = by_seed(runs, m["accuracy"][1]).values()
      row["accuracy_pct"] = stats.format_interval(accuracy, ".2f")
      row["acc_vs_softmax"] = versus(label, ref, runs, m["accuracy"][1], higher=True)
    s = sens.get(label, {})
    row |= {"S": s.get("S", math.nan), "S_rates": s.get("rates", 0)}
    for name in ("sink_rate", "sink_rate_max", "top_key_weight", "act_ratio", "kurtosis",
                 "max_logit"):
      if name in m:
        row[name] = mean_finite(by_seed(runs, m[name][1]).values())
    if lengths:
      row[longest] = mean_finite(by_seed(runs, m["loss_longest"][1]).values())
      row[f"{longest}_vs_softmax"] = versus(label, ref, runs, m["loss_longest"][1])
    out.append(row)
  readings(rows, out, "val", m["val_loss"][1])
  if lengths:
    readings(rows, out, longest, m["loss_longest"][1])
  return out


def _resolution(rows: Sequence[dict]) -> list[str]:
  """The design's resolution on each compared measure (`verdicts.resolution_note`)."""
  best, m = best_runs(rows), measures_of(rows)
  ref = best.get(REFERENCE, (math.nan, []))[1]
  names = [("val_vs_softmax", "val_loss")] + (
      [(f"loss@{lengths_of(rows)[-1]}_vs_softmax", "loss_longest")] if lengths_of(rows) else [])
  notes = []
  for column, key in names:
    cs = [stats.compare(by_seed(ref, m[key][1]), by_seed(runs, m[key][1]))
          for label, (_, runs) in best.items() if label != REFERENCE and runs]
    notes.append(verdicts.resolution_note(column, cs, "nats"))
  return notes


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
  m = measures_of(rows)
  ref = best.get(REFERENCE, (math.nan, []))[1]
  out = []
  for c in claims:
    for label in c.labels:
      runs = best.get(label, (math.nan, []))[1]
      for name, predicts in c.predicts:
        if name in LATER_MEASURES and name not in m:
          continue  # the runs were evaluated before eval.json had it
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
  keys = [k for k in LAYER_KEYS if k not in LATER_MEASURES or k in later_measures(rows)]
  out = []
  for label, (lr, runs) in ordered_best(rows):
    evaluated = [r for r in runs if r["eval"] and r["eval"].get("attention")]
    if not evaluated:
      continue
    for i in range(min(len(r["eval"]["attention"]) for r in evaluated)):
      out.append({"label": label, "best_lr": lr, "seeds": len(evaluated), "layer": i,
                  **{k: mean_finite(float(r["eval"]["attention"][i].get(k, math.nan))
                                    for r in evaluated) for k in keys}})
  return out


def length_rows(rows: Sequence[dict]) -> list[dict]:
  """Per label: the validation loss at each evaluated length and its growth, mean
  [95% t] over the seeds at the best rate."""
  lengths = lengths_of(rows)
  if not lengths:
    return []
  growth = measures(lengths)["growth"][1]
  ref = best_runs(rows).get(REFERENCE, (math.nan, []))[1]
  out = []
  for label, (lr, runs) in ordered_best(rows):
    row = {"label": label, "best_lr": lr, "seeds": len(by_seed(runs, at_length(lengths[-1])))}
    row |= {f"L={L}": stats.format_interval(by_seed(runs, at_length(L)).values())
            for L in lengths}
    row[f"L={lengths[-1]} - L={lengths[0]}"] = stats.format_interval(
        by_seed(runs, growth).values(), "+.3f")
    row["growth_vs_softmax"] = versus(label, ref, runs, growth)
    out.append(row)
  return out


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
             if has_layer_key(rows, "top_key_weight") else "")
  top_key_layer = ("top_key_weight (the heaviest key's, wherever it sits), "
                   if has_layer_key(rows, "top_key_weight") else "")
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
             "ties, *_robust, *_holm: the rates tied with the best rate, the verdict at "
             "every pairing of softmax's and the label's ties, and the Holm-adjusted p over "
             "the labels with the verdict where it survives (docs/guides/sweeps.md, "
             "verdicts that hold).",
             *_resolution(rows),
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
      [{**r, **{f"val_loss_L{L}": value(r, at_length(L)) for L in lengths},
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
             "the longest minus the shortest: each seed's growth, mean [95% t]; "
             "growth_vs_softmax: the label's growth minus softmax's, paired by seed "
             "(stats.compare).", code])
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
