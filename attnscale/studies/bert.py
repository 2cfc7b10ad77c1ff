"""The BERT study: which attention scaling pretrains the small BERT best.

    python -m attnscale.studies bert --out docs/results/bert --workdirs runs/bert

Reads the `bert` sweep (configs/bert_small_sweeps.py: the study protocol, each
label's best rate on the seed mean with 3+ seeds at every near-best rate) and
evaluates every run at each label's best rate on the whole validation split
(eval.py's `evaluate_run`, skipped where the run's eval.json is from its last
step). Writes:

  bert.md/csv            per label: best rate, seeds, final training MLM loss, and
                         validation MLM loss and masked-token accuracy with 95%
                         t-intervals; each against `standard` (paired by seed)
  bert_claims.md/csv     Graphcore's observation tested directly: fully scaled
                         attention against standard, and the unit-scaled model
                         against both, paired differences with intervals
  bert_vs_char.md/csv    the ranking of the scalings on the BERT beside their
                         ranking on the char LM (docs/results/practice/results.csv,
                         `--char_results`), each against its own standard, and
                         where the two disagree
  bert_attention.md/csv  per label and layer (the seed-0 run at the best rate):
                         attention entropy and largest logit on the first
                         validation batch, padded keys excluded, bidirectional
  bert.png               loss against learning rate with the seed spread; the
                         validation loss per label with its interval; entropy
                         and largest logit by layer
  runs.csv               every run: label, rate, seed, losses, validation loss and
                         accuracy where evaluated, largest logit, steps, commit
  sweep/                 the sweep's own tables and figures (sweep_results)

Labels are the sweep's: the post-LN encoder (BERT's) under its scaling's name,
`standard_pre` the pre-LN one, `unit_scaled` the unit-scaled, residual-weighted
model (pre-LN), each declared by the sweep in the run's config.label. A run's derived
label (`labels.run_label`) marks post-LN "+post_ln".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from attnscale.experiments import (
  reporting,
  results_store,
  run_records,
  stats,
  sweep_results,
  sweeps,
  verdicts,
)
from attnscale.studies import registry

BASELINE = "standard"  # BERT's own model: post-LN, 1/sqrt(d)
# Graphcore: fully scaled attention alone hurts; the unit-scaled model recovers it.
# (reference, label): the label's difference from the reference.
CLAIMS = (("standard", "fully_scaled"), ("fully_scaled", "unit_scaled"),
          ("standard", "unit_scaled"), ("standard_pre", "unit_scaled"),
          ("standard", "standard_pre"))
METRICS = (("val_loss", "validation MLM loss"), ("accuracy", "masked-token accuracy"),
           ("final_train_loss", "final training MLM loss"))
CHAR_RESULTS = os.path.join("docs", "results", "practice", "results.csv")


def bert_label(row: Mapping) -> str:
  """The sweep's label of a run row that declares none (made before sweeps declared
  labels), from its derived one: 'cosine+post_ln' -> 'cosine', a pre-LN
  standard-variant run 'standard' -> 'standard_pre', 'unit_scaled' as it is."""
  label = row["scaling"]
  if row.get("variant", "standard") != "standard":
    return label
  return label.removesuffix("+post_ln") if label.endswith("+post_ln") else f"{label}_pre"


def read_rows(workdir: str) -> list[dict]:
  """The sweep's started runs, `scaling` the sweep's label: the one each run declares
  (config.label: every committed run), else `bert_label`."""
  rows = []
  for r in sweeps.collect(workdir):
    if r["status"] != "new":
      with open(os.path.join(workdir, r["run"], "config.json")) as f:
        declared = json.load(f).get("label")
      rows.append(dict(r, scaling=declared or bert_label(r)))
  return rows


def at_best(rows: Sequence[dict], workdir: str, evaluate: bool = True) -> dict[str, dict]:
  """Per label: `best_per_scaling`'s entry plus "runs", its finished runs at the
  best rate, each with val_loss, accuracy and attention from its eval.json
  (run by `evaluate_run` first where missing or stale, when `evaluate`), and
  "unevaluated": those that have neither an eval.json nor weights (a run archived
  before it was evaluated), whose validation numbers are missing. The rows are
  updated in place, so `rows` carries the validation results too (runs.csv reads
  them there)."""
  from attnscale.evaluation import eval_lib  # JAX: only when runs are read

  best = sweep_results.best_per_scaling(rows)
  for label, b in best.items():
    b["runs"] = []
    for r in rows:
      if r["scaling"] != label or r["learning_rate"] != b["learning_rate"] or (
          r["status"] != "done"):
        continue
      path = os.path.join(workdir, r["run"])
      if evaluate and not run_records.evaluated(path):
        if _has_weights(path):
          print(f"bert: evaluating {r['run']} (whole validation split)")
          eval_lib.evaluate_run(path)
        else:  # archived (run_records.archive) before it was evaluated: no weights to read
          print(f"bert: {r['run']} has no weights and no eval.json (archived before it was "
                "evaluated): its validation numbers are missing")
          b.setdefault("unevaluated", []).append(r["run"])
      result = _eval_json(path)
      if result is not None:
        r.update(val_loss=result["val_loss"], accuracy=result["accuracy"],
                 attention=result["attention"])
      b["runs"].append(r)
  return best


def _has_weights(path: str) -> bool:
  """Whether the run directory holds a checkpoint (a step folder under checkpoints/)."""
  folder = os.path.join(path, "checkpoints")
  return os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder))


def _eval_json(path: str) -> dict | None:
  """The run's eval.json if it is from its last step, else None."""
  import json
  if not run_records.evaluated(path):
    return None
  with open(os.path.join(path, "eval.json")) as f:
    return json.load(f)


def _by_seed(best: Mapping, metric: str) -> dict:
  return {r["seed"]: r[metric] for r in best["runs"] if metric in r}


def label_rows(best: Mapping[str, dict], rows: Sequence[dict] = (),
               workdir: str = "") -> list[dict]:
  """One row per label, lowest validation loss first (`bert.md`); with the sweep's
  `rows` (and `workdir`, where their eval.json files are) also each label's tie set
  and the tie-robust validation verdict (`_robust`)."""
  out = []
  for label, b in best.items():
    val = stats.mean_interval(_by_seed(b, "val_loss").values())
    acc = stats.mean_interval(_by_seed(b, "accuracy").values())
    row = {"label": label, "best_lr": b["learning_rate"], "seeds": b["seeds"],
           "val_seeds": len(_by_seed(b, "val_loss")),
           "train_loss": b["final_train_loss"], "train_se": b["se"],
           "val_loss": val.mean, "val_lo": val.lo, "val_hi": val.hi,
           "accuracy_pct": 100 * acc.mean, "acc_lo": 100 * acc.lo, "acc_hi": 100 * acc.hi}
    if BASELINE in best and label != BASELINE:
      c = stats.compare(_by_seed(best[BASELINE], "val_loss"), _by_seed(b, "val_loss"))
      row["val_vs_standard"] = c.format()
      points = lambda x: {s: 100 * v for s, v in _by_seed(x, "accuracy").items()}
      a = stats.compare(points(best[BASELINE]), points(b))
      row["acc_vs_standard"] = a.format(higher_is_better=True)
    else:
      row["val_vs_standard"] = row["acc_vs_standard"] = (
          "baseline" if label == BASELINE else "-")
    out.append(row)
  # Holm over the labels' comparisons with standard (docs/guides/sweeps.md, verdicts
  # that hold): the family-wise reading beside each per-comparison one.
  family = verdicts.family({
      row["label"]: stats.compare(_by_seed(best[BASELINE], "val_loss"),
                                  _by_seed(best[row["label"]], "val_loss"))
      for row in out if BASELINE in best and row["label"] != BASELINE})
  for row in out:
    row["val_holm"] = family.get(row["label"]) or (
        "baseline" if row["label"] == BASELINE else "-")
  if rows:
    _robust(out, best, rows, workdir)
  return sorted(out, key=lambda r: (math.isnan(r["val_loss"]), r["val_loss"], r["train_loss"]))


def _robust(table: list[dict], best: Mapping[str, dict], rows: Sequence[dict],
            workdir: str) -> None:
  """Adds `ties` (the label's tie set on the final training loss, the measure its
  best rate is chosen by: `stats.tie_set`) and `val_robust` (validation loss against
  standard at every pairing of the two tie sets: `stats.robust_compare`) to each row.
  The validation loss of a tied rate comes from its runs' eval.json; a tied rate
  without one is left out of the pairings (`verdicts.robust`)."""
  def runs(label):
    return [r for r in rows if r["scaling"] == label and r["status"] == "done"]

  def val(r):
    result = _eval_json(os.path.join(workdir, r["run"]))
    return result["val_loss"] if result is not None else None

  def val_by_rate(label):
    out: dict[float, dict] = {}
    for r in runs(label):
      v = val(r)
      if v is not None:
        out.setdefault(r["learning_rate"], {})[r["seed"]] = v
    return out

  ties = {label: stats.tie_set(verdicts.by_rate(runs(label), lambda r: r["final_train_loss"]),
                               b["learning_rate"])
          for label, b in best.items() if runs(label)}
  base = val_by_rate(BASELINE) if BASELINE in ties else {}
  for row in table:
    label = row["label"]
    row["ties"] = " ".join(verdicts.rate_label(r) for r in ties.get(label, ()))
    if label == BASELINE:
      row["val_robust"] = "baseline"
    elif label in ties and base:
      row["val_robust"] = verdicts.robust(base, val_by_rate(label), ties[BASELINE],
                                          ties[label]) or "-"
    else:
      row["val_robust"] = "-"


def claim_rows(best: Mapping[str, dict]) -> list[dict]:
  """Graphcore's comparisons (`CLAIMS`) in each metric: label minus reference,
  paired by seed, a 95% t-interval. For accuracy, in points; "better" there means
  higher accuracy."""
  out = []
  for ref, label in CLAIMS:
    if ref not in best or label not in best:
      continue
    for metric, name in METRICS:
      scale = 100.0 if metric == "accuracy" else 1.0  # accuracy in points
      c = stats.compare({s: scale * v for s, v in _by_seed(best[ref], metric).items()},
                        {s: scale * v for s, v in _by_seed(best[label], metric).items()})
      verdict = c.read(higher_is_better=metric == "accuracy")
      out.append({"comparison": f"{label} - {ref}", "metric": name, "effect": c.effect,
                  "lo": c.lo, "hi": c.hi, "method": c.method, "n": c.n, "verdict": verdict})
  return out


def ranking_rows(bert_rows: Sequence[dict], char_rows: Sequence[dict]) -> list[dict]:
  """The labels both sweeps ran, by BERT rank: each model's final training loss
  at the label's best rate, its rank, and its paired difference from that
  model's own `standard` (the char LM's is pre-LN, BERT's post-LN). `agree`:
  "yes" (same verdict), "no" (opposite verdicts, both carried by their
  intervals), "partly" (one a difference, the other within noise) or "-" (a
  side has too few seeds for a verdict)."""
  bert, char = sweep_results.best_per_scaling(bert_rows), sweep_results.best_per_scaling(
      char_rows)
  shared = [k for k in bert if k in char]  # standard_pre: the char LM has one standard

  def verdict(rows, best, label):
    if label == BASELINE:
      return 0.0, "baseline"
    ref = sweep_results.seed_losses(rows, BASELINE, best[BASELINE]["learning_rate"])
    mine = sweep_results.seed_losses(rows, label, best[label]["learning_rate"])
    c = stats.compare(ref, mine)
    return c.effect, c.verdict if c.method != "none" else "-"

  ranked_b = sorted(shared, key=lambda k: bert[k]["final_train_loss"])
  ranked_c = sorted(shared, key=lambda k: char[k]["final_train_loss"])
  out = []
  for label in ranked_b:
    db, vb = verdict(bert_rows, bert, label)
    dc, vc = verdict(char_rows, char, label)
    sig = {"better", "worse"}
    agree = ("-" if "-" in (vb, vc) else "yes" if vb == vc  # "-": too few seeds to say
             else "no" if vb in sig and vc in sig else "partly")
    out.append({"label": label, "bert_rank": ranked_b.index(label) + 1,
                "bert_loss": bert[label]["final_train_loss"], "bert_vs_standard": db,
                "bert_verdict": vb, "char_rank": ranked_c.index(label) + 1,
                "char_loss": char[label]["final_train_loss"], "char_vs_standard": dc,
                "char_verdict": vc, "agree": agree})
  return out


def kendall_tau(rows: Sequence[dict]) -> float:
  """Kendall's tau between the two rankings of `ranking_rows` (1: the same order)."""
  ranks = [(r["bert_rank"], r["char_rank"]) for r in rows]
  pairs = [(a, b) for i, a in enumerate(ranks) for b in ranks[i + 1:]]
  if not pairs:
    return math.nan
  return sum(np.sign(a[0] - b[0]) * np.sign(a[1] - b[1]) for a, b in pairs) / len(pairs)


def attention_rows(best: Mapping[str, dict]) -> list[dict]:
  """Per label and layer, its seed-0 run at the best rate (the lowest seed with an
  eval.json otherwise): entropy (nats), largest logit and sink rate."""
  out = []
  for label, b in best.items():
    runs = sorted((r for r in b["runs"] if "attention" in r), key=lambda r: r["seed"])
    if not runs:
      continue
    for i, layer in enumerate(runs[0]["attention"]):
      out.append({"label": label, "seed": runs[0]["seed"], "layer": i,
                  "entropy": layer["entropy"], "max_logit": layer["max_logit"],
                  "sink_rate": layer["sink_rate"]})
  return out


def plot(rows: Sequence[dict], table: Sequence[dict], attention: Sequence[dict]):
  """Loss against rate (mean and seed range); validation loss per label (95% t);
  entropy and largest logit by layer."""
  fig = reporting.new_figure(16, 9)
  (ax_lr, ax_val), (ax_ent, ax_logit) = fig.subplots(2, 2)
  labels = sorted({r["scaling"] for r in rows})
  for i, label in enumerate(labels):
    by_lr: dict[float, list[float]] = {}
    for r in rows:
      if r["scaling"] == label and r["status"] == "done":
        by_lr.setdefault(r["learning_rate"], []).append(r["final_train_loss"])
    lrs = sorted(by_lr)
    mean = np.array([np.mean(by_lr[x]) for x in lrs])
    lo = mean - np.array([np.min(by_lr[x]) for x in lrs])
    hi = np.array([np.max(by_lr[x]) for x in lrs]) - mean
    ax_lr.errorbar(lrs, mean, yerr=[lo, hi], label=label, capsize=2, **reporting.style(i))
  ax_lr.set_xscale("log", base=2)
  reporting.label_axes(ax_lr, xlabel="learning rate", ylabel="final training MLM loss",
                       title="seed mean, bars: seed range")
  ax_lr.legend(fontsize=7, ncol=2)
  for j, r in enumerate(table):
    if math.isfinite(r["val_loss"]):
      err = [[r["val_loss"] - r["val_lo"]], [r["val_hi"] - r["val_loss"]]] if math.isfinite(
          r["val_lo"]) else None
      ax_val.errorbar([j], [r["val_loss"]], yerr=err, fmt="o", capsize=3, color="k")
  ax_val.set_xticks(range(len(table)), [r["label"] for r in table], rotation=35, ha="right",
                    fontsize=7)
  reporting.label_axes(ax_val, xlabel="", ylabel="validation MLM loss",
                       title="at each label's best rate: seed mean, 95% t-interval")
  for i, label in enumerate(labels):
    layers = [a for a in attention if a["label"] == label]
    if layers:
      x = [a["layer"] for a in layers]
      ax_ent.plot(x, [a["entropy"] for a in layers], label=label, **reporting.style(i))
      ax_logit.plot(x, [a["max_logit"] for a in layers], label=label, **reporting.style(i))
  reporting.label_axes(ax_ent, xlabel="layer", ylabel="attention entropy (nats)",
                       title="seed 0 at the best rate, first validation batch")
  reporting.label_axes(ax_logit, xlabel="layer", ylabel="largest attention logit",
                       title="padded keys excluded")
  ax_logit.set_yscale("log")
  ax_ent.legend(fontsize=7, ncol=2)
  return fig


def arguments(p) -> None:
  g = p.add_argument_group("bert")
  g.add_argument("--char_results", default=CHAR_RESULTS,
                 help="bert: the char LM sweep's results.csv to rank the same scalings by "
                      f"(default {CHAR_RESULTS})")
  g.add_argument("--no_eval", action="store_true",
                 help="bert: read the eval.json files there are; evaluate nothing")


def run_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies bert --out DIR --workdirs SWEEP_DIR`."""
  if len(args.workdirs) != 1:
    raise SystemExit("bert: give --workdirs SWEEP_DIR (the bert sweep's workdir)")
  workdir = args.workdirs[0]
  rows = read_rows(workdir)
  code = registry.code_note(rows, args, "bert")
  best = at_best(rows, workdir, evaluate=not args.no_eval)
  table = label_rows(best, rows, workdir)
  claims = claim_rows(best)
  attention = attention_rows(best)
  notes = [f"{len(rows)} runs of the bert sweep ({results_store.shown(workdir)}); {code}.",
           "Final training MLM loss: mean of the last 20 steps; validation: eval.py over the "
           "whole WikiText-2 validation split; mean [95% t-interval] over the seeds at each "
           "label's best rate (the lowest seed mean among the rates with the most seeds).",
           "val_vs_standard: the label's validation loss minus standard's (post-LN, 1/sqrt(d)), "
           "paired by seed (attnscale.experiments.stats.compare): worse, better or within "
           "noise at 95%; acc_vs_standard: the same for masked-token accuracy, in points "
           "(better = higher); val_holm: val_vs_standard's Holm-adjusted p over the labels, "
           "with its verdict where it survives; ties: the rates tied with the label's best "
           "on the final training loss (stats.tie_set: paired over 2+ shared seeds, the "
           "interval covers 0); val_robust: val_vs_standard at every pairing of the two "
           "labels' tied rates that were evaluated, the verdict where all agree, else "
           "'depends on the rate chosen' (docs/guides/sweeps.md, verdicts that hold)."]
  missing = [run for b in best.values() for run in b.get("unevaluated", [])]
  if missing:
    notes.append(f"Not evaluated ({len(missing)}: archived without weights before eval.py "
                 f"ran, so their validation columns have one seed fewer): {', '.join(missing)}.")
  paths = reporting.write_tables(
      table, args.out, "bert", title="The small BERT: each scaling at its best rate",
      notes=notes, floats=".4f", formats={"best_lr": reporting.power_of_two, "seeds": "d",
                                          "val_seeds": "d", "accuracy_pct": ".2f",
                                          "acc_lo": ".2f", "acc_hi": ".2f"})
  paths += reporting.write_tables(
      claims, args.out, "bert_claims", title="Graphcore's observation on BERT, tested",
      notes=["effect: label minus reference at each one's best rate, paired by seed, "
             "[95% t-interval]; losses in nats, accuracy in points (better = lower loss, "
             "higher accuracy)."], floats="+.4f", formats={"n": "d"})
  char_rows = sweep_results.read_results_csv(args.char_results)
  ranking = ranking_rows(rows, char_rows)
  tau = kendall_tau(ranking)
  paths += reporting.write_tables(
      ranking, args.out, "bert_vs_char",
      title="The same scalings on the BERT and on the char LM",
      notes=[f"Char LM: {args.char_results} (the practice sweep, pre-LN, 3 seeds at each "
             "best rate). Both by final training loss at each label's best rate; each "
             "vs its own standard, paired by seed.",
             f"Kendall's tau between the two rankings: {tau:+.2f} over {len(ranking)} labels."],
      floats=".4f", formats={"bert_rank": "d", "char_rank": "d",
                             "bert_vs_standard": "+.4f", "char_vs_standard": "+.4f"})
  paths += reporting.write_tables(
      attention, args.out, "bert_attention",
      title="Attention by layer at each label's best rate",
      notes=["eval.py's diagnostics on the first validation batch (padded keys excluded, "
             "bidirectional): mean entropy over heads and queries, the largest logit, "
             "the rate of queries putting > half their weight on one key."], floats=".3f",
      formats={"seed": "d", "layer": "d"})
  paths.append(reporting.save_figure(plot(rows, table, attention), args.out, "bert"))
  run_rows = []
  for r in rows:
    extra = {k: r.get(k, math.nan) for k in ("val_loss", "accuracy")}
    run_rows.append({**r, "label": r["scaling"], **extra})
  path = os.path.join(args.out, "runs.csv")
  sweep_results.write_runs_csv(run_rows, path, hyperparameters=("variant",),
                               results=("val_loss", "accuracy"))
  paths.append(path)
  sweep_results.write_results(rows, os.path.join(args.out, "sweep"), title="bert sweep")
  return paths, notes + [f"Kendall's tau (BERT vs char LM ranking): {tau:+.2f}"]


# Reads the bert sweep's layout: only when asked for.
STUDY = registry.Study(run_cli, in_all=False, needs_workdirs=True, arguments=arguments)
