"""The learning-rate sensitivity study: which scalings and options keep attention
logits bounded and the loss finite as the learning rate grows?

    python -m attnscale.studies sensitivity --out DIR --workdirs runs/sensitivity

Reads the `sensitivity` sweep (configs/shakespeare_char_sweeps.py: each label from two rates below
its best up to 2^-2, three seeds at every rate) and writes:

  sensitivity.md/csv         per label: best rate and loss, Wortsman et al.'s
                             learning-rate sensitivity, the rates that trained, the
                             largest logit at the end of the highest rates
  sensitivity_logits.md/csv  per label and rate: final loss and the largest
                             attention logit at the last logged step (seed 0)
  sensitivity_by_rate.md/csv per label: the final loss at each rate (mean over
                             seeds; "+-" the 95% t half-width; "div" where every seed
                             diverged)
  sensitivity_loss.png       final loss against learning rate, one line per label
                             (seed mean, min-max bars)
  sensitivity_logits.png     the largest attention logit against step at three
                             high rates, one line per label and seed

Learning-rate sensitivity (Wortsman et al. 2023, "Small-scale proxies for
large-scale Transformer training instabilities", arXiv 2309.14322, section 3.1):

    S = E_lr[ min(L(lr), L_0) ] - min_lr L(lr)

over the rates tried, L_0 the loss at initialisation (here ln V, a uniform
prediction; a diverged run counts as L_0). Lower = less sensitive. Each seed's S
is computed over its own runs; the table gives the mean with its 95% t-interval over
seeds and each label's S against standard's, paired by seed (`stats.compare`).

The largest logit is what training logs every `log_every` steps
(`train/attn/max_logit/layer_<i>` in metrics.jsonl: the largest scaled logit of
the layer on that step's batch, from the fused kernel), maximised over layers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import numpy as np

from attnscale.config import migration
from attnscale.experiments import (
  reporting,
  results_store,
  stats,
  sweep_results,
  sweeps,
  verdicts,
)
from attnscale.runtime import metric_keys, metrics_writer
from attnscale.studies import registry

MAX_LOGIT = metric_keys.MAX_LOGIT  # + layer index: metrics.jsonl's keys
HIGH_RATES = (2.0**-7, 2.0**-5, 2.0**-3)  # the logit figure's panels
TRAINED = 0.2  # nats: a rate "still trains" when its loss is within this of the best


def max_logit_curve(run_dir: str) -> list[tuple[int, float]]:
  """(step, largest attention logit over layers) at every logged step."""
  curve = []
  for record in metrics_writer.read_rows(run_dir):  # metrics.jsonl, or an archive's .gz
    values = [v for k, v in record.items() if k.startswith(MAX_LOGIT)]
    if values:
      curve.append((record["step"], float(max(values))))
  return curve


def read_rows(workdir: str, fields=None) -> list[dict]:
  """The sweep's finished (or diverged) runs, each with its label, vocabulary and
  max-logit curve; `fields(config)` (the run's config.json, today's names) adds
  or replaces columns (the transfer study's label and width)."""
  rows = []
  for row in sweeps.collect(workdir):
    if row["status"] not in ("done", "diverged"):
      continue
    run = os.path.join(workdir, row["run"])
    with open(os.path.join(run, "config.json")) as f:
      config = migration.migrate(json.load(f))
    rows.append({**row, "label": row["scaling"], "vocab_size": config["model"]["vocab_size"],
                 "logits": max_logit_curve(run), **(fields(config) if fields else {})})
  return rows


def sensitivity(losses: Sequence[float], init_loss: float) -> float:
  """Wortsman et al.'s S over one seed's rates: mean of min(L, L_0) minus the best."""
  capped = [min(v, init_loss) if math.isfinite(v) else init_loss for v in losses]
  return float(np.mean(capped) - min(capped)) if capped else math.nan


def per_seed_sensitivity(rows: Sequence[dict], label: str) -> dict[int, float]:
  """{seed: S} of one label, each seed's S over its own runs."""
  runs = [r for r in rows if r["label"] == label]
  init = math.log(runs[0]["vocab_size"])
  return {s: sensitivity([r["final_train_loss"] for r in runs if r["seed"] == s], init)
          for s in sorted({r["seed"] for r in runs})}


def summary_rows(rows: Sequence[dict], baseline: str = "standard") -> list[dict]:
  """One row per label (see the module docstring), lowest sensitivity first. S's
  interval is the 95% t over seeds (`stats.mean_interval`); `vs_standard` compares
  each label's per-seed S with `baseline`'s, paired by seed (`stats.compare`)."""
  base = per_seed_sensitivity(rows, baseline) if any(
      r["label"] == baseline for r in rows) else None
  out = []
  for label in sorted({r["label"] for r in rows}):
    runs = [r for r in rows if r["label"] == label]
    per_seed = per_seed_sensitivity(rows, label)
    s_interval = stats.mean_interval(per_seed.values())
    by_rate: dict[float, list[float]] = {}
    for r in runs:
      by_rate.setdefault(r["learning_rate"], []).append(r["final_train_loss"])
    means = {lr: float(np.mean(v)) for lr, v in by_rate.items()}
    finite = {lr: v for lr, v in means.items() if math.isfinite(v)}
    best_lr = min(finite, key=finite.get) if finite else math.nan
    trained = [lr for lr, v in means.items()
               if math.isfinite(v) and v <= finite.get(best_lr, math.nan) + TRAINED]
    top = max(by_rate)
    top_logits = [r["logits"][-1][1] for r in runs if r["learning_rate"] == top and r["logits"]]
    worst_logit = max((v for r in runs for _, v in r["logits"]), default=math.nan)
    out.append({
        "label": label, "rates": len(by_rate), "seeds": len(per_seed),
        "best_lr": best_lr, "best_loss": finite.get(best_lr, math.nan),
        "sensitivity": s_interval.mean, "S_lo": s_interval.lo, "S_hi": s_interval.hi,
        "vs_standard": ("baseline" if label == baseline else "" if base is None
                        else stats.compare(base, per_seed).format()),
        "largest_trained_lr": max(trained) if trained else math.nan,
        "diverged_runs": sum(r["status"] == "diverged" for r in runs),
        "max_logit_at_top_lr": max(top_logits) if top_logits else math.nan,
        "max_logit_any_run": worst_logit})
  # Holm over the labels' comparisons with the baseline (docs/guides/sweeps.md,
  # verdicts that hold), beside each per-comparison verdict.
  family = verdicts.family({r["label"]: stats.compare(base, per_seed_sensitivity(rows, r["label"]))
                            for r in out if base is not None and r["label"] != baseline})
  for r in out:
    r["vs_standard_holm"] = family.get(r["label"]) or (
        "baseline" if r["label"] == baseline else "")
  _at_best(rows, out, baseline)
  return sorted(out, key=lambda r: r["sensitivity"])


def _at_best(rows: Sequence[dict], table: list[dict], baseline: str) -> None:
  """Adds the comparison S does not make, each label's final loss at its best rate
  against the baseline's at its own (`best_vs_standard`, paired by seed), with the
  rates tied with each best (`ties`: `stats.tie_set`), the verdict at every pairing
  of the two tie sets (`best_robust`) and the Holm-adjusted p over the labels
  (`best_holm`; docs/guides/sweeps.md, verdicts that hold)."""
  loss = lambda r: r["final_train_loss"]
  by_rate = {r["label"]: verdicts.by_rate([x for x in rows if x["label"] == r["label"]], loss)
             for r in table}
  best = {r["label"]: r["best_lr"] for r in table if math.isfinite(r["best_lr"])}
  ties = {label: stats.tie_set({lr: v for lr, v in by_rate[label].items() if v}, lr)
          for label, lr in best.items()}
  comparisons = {label: stats.compare(by_rate[baseline][best[baseline]], by_rate[label][lr])
                 for label, lr in best.items() if baseline in best and label != baseline}
  family = verdicts.family(comparisons)
  for r in table:
    label = r["label"]
    r["ties"] = " ".join(verdicts.rate_label(x) for x in ties.get(label, ()))
    if label == baseline:
      r["best_vs_standard"] = r["best_robust"] = r["best_holm"] = "baseline"
    elif label in comparisons:
      r["best_vs_standard"] = comparisons[label].format()
      r["best_robust"] = verdicts.robust(by_rate[baseline], by_rate[label], ties[baseline],
                                         ties[label]) or "-"
      r["best_holm"] = family.get(label) or "-"
    else:
      r["best_vs_standard"] = r["best_robust"] = r["best_holm"] = ""


def _plus_minus(mean: float, hi: float, digits: int = 2) -> str:
  """"mean +-h", h = hi - mean the 95% t half-width (the mean alone where hi is NaN:
  one value)."""
  return f"{mean:.{digits}f}" + (f" +-{hi - mean:.{digits}f}" if math.isfinite(hi) else "")


def logit_rows(rows: Sequence[dict]) -> list[dict]:
  """Per label and rate (seed 0): final loss, status and the last and largest logged
  max logit."""
  return [{"label": r["label"], "learning_rate": r["learning_rate"], "status": r["status"],
           "final_train_loss": r["final_train_loss"],
           "max_logit_last": r["logits"][-1][1] if r["logits"] else math.nan,
           "max_logit_peak": max((v for _, v in r["logits"]), default=math.nan)}
          for r in sorted(rows, key=lambda r: (r["label"], r["learning_rate"]))
          if r["seed"] == 0]


def by_rate_rows(rows: Sequence[dict]) -> list[dict]:
  """Per label (in `summary_rows`' order): the final loss at each rate, "mean +-h" over
  the seeds that finished it, h the 95% t half-width (NaN for a diverged seed is kept
  out; "div" when every seed diverged), and the label's S the same way."""
  rates = sorted({r["learning_rate"] for r in rows})
  out = []
  for summary in summary_rows(rows):
    label = summary["label"]
    row = {"label": label}
    for lr in rates:
      v = [r["final_train_loss"] for r in rows if r["label"] == label and r["learning_rate"] == lr]
      finite = [x for x in v if math.isfinite(x)]
      cell = stats.mean_interval(finite) if finite else None
      row[reporting.power_of_two(lr)] = ("" if not v else "div" if cell is None
                                         else _plus_minus(cell.mean, cell.hi))
    row["S"] = _plus_minus(summary["sensitivity"], summary["S_hi"])  # summary_rows' S
    out.append(row)
  return out


def plot_loss(rows: Sequence[dict]):
  fig = reporting.new_figure(8, 5)
  ax = fig.subplots()
  init = math.log(rows[0]["vocab_size"])
  for i, label in enumerate(sorted({r["label"] for r in rows})):
    by_rate: dict[float, list[float]] = {}
    for r in rows:
      if r["label"] == label:
        v = r["final_train_loss"]
        by_rate.setdefault(r["learning_rate"], []).append(min(v, init) if math.isfinite(v)
                                                           else init)
    lrs = sorted(by_rate)
    mean = np.array([np.mean(by_rate[lr]) for lr in lrs])
    err = [mean - [min(by_rate[lr]) for lr in lrs], [max(by_rate[lr]) for lr in lrs] - mean]
    # Each label a little to the side (2^(+-0.1) at most) so that the bars stay apart.
    shift = 2.0 ** (0.025 * (i - 3.5))
    ax.errorbar([lr * shift for lr in lrs], mean, yerr=err, capsize=2, label=label,
                **reporting.style(i))
  ax.axhline(init, color="k", ls=":", lw=1, label="loss at init (ln V); diverged")
  ax.set_xscale("log", base=2)
  reporting.label_axes(ax, xlabel="learning rate", ylabel="final training loss, min(L, L0)",
                       title="Learning-rate sensitivity (mean over seeds, min-max bars)")
  ax.legend(fontsize=7)
  return fig


def plot_logits(rows: Sequence[dict], rates: Sequence[float] = HIGH_RATES):
  fig = reporting.new_figure(5 * len(rates), 4.5)
  axes = np.atleast_1d(fig.subplots(1, len(rates), sharey=True))
  labels = sorted({r["label"] for r in rows})
  for ax, lr in zip(axes, rates):
    for i, label in enumerate(labels):
      runs = sorted((r for r in rows if r["label"] == label and r["learning_rate"] == lr
                     and r["logits"]), key=lambda r: r["seed"])
      for j, run in enumerate(runs):  # the first seed drawn in full, the others faint
        steps, values = zip(*run["logits"])
        style = reporting.style(i) | ({} if j == 0 else {"marker": None, "lw": 0.8,
                                                          "alpha": 0.35})
        ax.plot(steps, values, label=None if j else label, **style)
    ax.set_yscale("log")
    reporting.label_axes(ax, xlabel="step", ylabel="largest attention logit (over layers)",
                         title=f"learning rate {reporting.power_of_two(lr)} "
                         "(seed 0; faint: the others)")
  for ax in axes[1:]:  # one legend, on the first panel
    if ax.get_legend() is not None:
      ax.get_legend().remove()
  axes[0].legend(fontsize=7)
  return fig


def run_cli(args) -> tuple[list[str], list[str]]:
  """`python -m attnscale.studies sensitivity --out DIR --workdirs SWEEP_DIR`."""
  if len(args.workdirs) != 1:
    raise SystemExit("sensitivity: give --workdirs SWEEP_DIR (the sensitivity sweep's workdir)")
  rows = read_rows(args.workdirs[0])
  if not rows:
    raise SystemExit(f"sensitivity: no finished runs in {results_store.shown(args.workdirs[0])}")
  notes = [f"{len(rows)} finished runs ({results_store.shown(args.workdirs[0])}); final training loss = mean of "
           "the last 20 steps; best_loss: mean over seeds at the best rate.",
           "sensitivity: Wortsman et al.'s mean over rates of min(L, L0) minus the best, "
           "L0 = ln V (diverged = L0), per seed; its mean and 95% t-interval over seeds "
           "[S_lo, S_hi]; vs_standard: S minus standard's, paired by seed (stats.compare); "
           "vs_standard_holm: its Holm-adjusted p over the labels, with the verdict where it "
           "survives (docs/guides/sweeps.md, verdicts that hold). S is over every rate run, "
           "so no best rate is chosen for it.",
           "best_vs_standard: the final loss at the label's best rate minus standard's at "
           "its own, paired by seed; ties: the rates tied with the best (stats.tie_set: "
           "paired, the interval covers 0); best_robust: best_vs_standard at every pairing "
           "of the two tie sets, the verdict where all agree, else 'depends on the rate "
           "chosen'; best_holm: its Holm-adjusted p over the labels.",
           f"largest_trained_lr: the largest rate whose mean loss is within {TRAINED} nats of "
           "the best; "
           "max_logit_*: the largest attention logit logged in training (over layers), at "
           "the last step of the largest rate's runs, and anywhere in any run.",
           registry.code_note(rows, args, "sensitivity") + "; every run: runs.csv."]
  fmt = {"formats": {"best_lr": reporting.power_of_two,
                     "largest_trained_lr": reporting.power_of_two, "rates": "d", "seeds": "d",
                     "diverged_runs": "d"}, "floats": ".3f"}
  paths = reporting.write_tables(summary_rows(rows), args.out, "sensitivity",
                                 title="Learning-rate sensitivity", notes=notes, **fmt)
  paths += reporting.write_tables(
      logit_rows(rows), args.out, "sensitivity_logits", floats=".3f",
      formats={"learning_rate": reporting.power_of_two},
      title="Final loss and largest attention logit per rate (seed 0)",
      notes=["max_logit_last: at the last logged step; max_logit_peak: the largest "
             "logged in the run (a diverged run stops at its NaN)."])
  paths += reporting.write_tables(
      by_rate_rows(rows), args.out, "sensitivity_by_rate",
      title="Final training loss by learning rate (mean +- 95% t half-width over seeds)",
      notes=["div: every seed diverged (NaN); S: the learning-rate sensitivity (mean +- "
             "its 95% t half-width over seeds), as in sensitivity.md."])
  paths.append(reporting.save_figure(plot_loss(rows), args.out, "sensitivity_loss"))
  paths.append(reporting.save_figure(plot_logits(rows), args.out, "sensitivity_logits"))
  path = os.path.join(args.out, "runs.csv")
  sweep_results.write_runs_csv(rows, path)
  return paths + [path], notes


# Reads the sensitivity sweep's layout: only when asked for.
STUDY = registry.Study(run_cli, in_all=False, needs_workdirs=True)
