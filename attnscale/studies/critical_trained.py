"""critical_length_trained: which length law trained models follow (the critical_length sweep).

Reads the runs of the `critical_length` sweep (configs/shakespeare_char_sweeps.py:
char LM trained at 64, evaluated by eval.py --lengths at 64 ... 4096, RoPE and no
positions) and writes, beside the simulation's tables in the same folder:

  critical_length_gamma       seed 0's loss at every length for each law at each gamma,
                              the gamma chosen (lowest loss at the held-out length,
                              `--choose_at`, 512) marked
  critical_length_compare     every label with 3 seeds (the baselines, each law at its
                              chosen gamma) against standard with the same positions,
                              paired by seed, 95% t (`length.comparison_rows`)
  critical_length_entropy     the attention entropy H against the keys a query sees n,
                              at the longest length: the slope dH/d(log n) over the
                              bins past the training length, per run (mean over
                              layers), mean and t-interval over seeds per label
  critical_length_trained.png loss against length and H against n, per positions

The entropy slope reads the regimes of arXiv 2605.08505: 1 while attention averages
everything it sees (H = log n for uniform weights: subcritical), about 0 once it keeps
a few keys whatever n (critical), H falling to 0 when it collapses on one
(supercritical). eval.json's `entropy_by_keys` (attnscale/evaluation/length_eval.py)
holds H per layer, averaged over the heads and the queries of each powers-of-two bin
of n.

  python -m attnscale.studies critical_length_trained \\
      --workdirs docs/results/critical_length/runs.parquet --out docs/results/critical_length
"""

from __future__ import annotations

import math
import re

import numpy as np

from attnscale.experiments import reporting, results_store, stats
from attnscale.runtime import provenance
from attnscale.studies import registry
from attnscale.studies.length import LengthResult, RunLengths, comparison_rows, length_study

GAMMA = re.compile(r"gamma=([^,)]+),?")


def law_and_gamma(label: str) -> tuple[str, float | None]:
  """"log_n_power(gamma=2,p=1)" -> ("log_n_power(p=1)", 2.0); no gamma: (label, None)."""
  m = GAMMA.search(label)
  if not m:
    return label, None
  return GAMMA.sub("", label).replace(",)", ")").replace("()", ""), float(m.group(1))


def gamma_rows(r: LengthResult, choose_at: int) -> list[dict]:
  """Seed 0 of every (law, positions, gamma): its loss at each length, and whether
  it has the lowest loss of its law at `choose_at` (the gamma the sweep chose)."""
  runs = [run for run in r.runs if run.seed == 0 and law_and_gamma(run.scaling)[1] is not None]
  best = {}
  for run in runs:
    key = law_and_gamma(run.scaling)[0], run.positions
    loss = run.lengths[choose_at]["val_loss"]
    if key not in best or loss < best[key][0]:
      best[key] = loss, run.scaling
  rows = []
  for run in sorted(runs, key=lambda x: (x.positions, *law_and_gamma(x.scaling))):
    law, gamma = law_and_gamma(run.scaling)
    rows.append({"law": law, "positions": run.positions, "gamma": gamma,
                 "chosen": "yes" if best[law, run.positions][1] == run.scaling else "",
                 **{f"L={L}": run.lengths[L]["val_loss"] for L in r.lengths}})
  return rows


def seeded(r: LengthResult, min_seeds: int = 3) -> LengthResult:
  """The runs of the labels with at least `min_seeds` seeds."""
  groups = r.groups()
  return LengthResult([run for run in r.runs if len(groups[run.group]) >= min_seeds])


def entropy_slope(run: RunLengths, length: int) -> float:
  """dH/d(log n) by least squares over the bins of n past the training length, at
  window `length`, H averaged over the layers; n of a bin its geometric centre."""
  at = run.lengths[length]
  n = np.array([math.sqrt(lo * hi) for lo, hi in at["keys_bins"]])
  h = np.mean(np.array(at["entropy_by_keys"]), axis=0)
  past = n > run.train_len
  return float(np.polyfit(np.log(n[past]), h[past], 1)[0])


def entropy_rows(r: LengthResult) -> list[dict]:
  """Per label with 3+ seeds: the entropy slope past the training length and H at
  the first and the last bin, at the longest length, mean [95% t] over seeds."""
  L = r.lengths[-1]
  rows = []
  for (label, positions), runs in sorted(r.groups().items()):
    h_last = [float(np.mean([e[-1] for e in run.lengths[L]["entropy_by_keys"]])) for run in runs]
    h_train = [float(np.mean([e[_bin_of(run, run.train_len)] for e in
                              run.lengths[L]["entropy_by_keys"]])) for run in runs]
    rows.append({"label": label, "positions": positions, "seeds": len(runs),
                 "slope dH/dlog n (n > L_train)":
                     stats.format_interval([entropy_slope(run, L) for run in runs]),
                 f"H at n ~ {runs[0].train_len}": stats.format_interval(h_train),
                 f"H at n ~ {L}": stats.format_interval(h_last),
                 f"log {L}": math.log(L)})
  return rows


def _bin_of(run: RunLengths, n: int) -> int:
  bins = run.lengths[max(run.lengths)]["keys_bins"]
  return next(i for i, (lo, hi) in enumerate(bins) if lo <= n <= hi)


def plot(r: LengthResult):
  """Per positions type: loss against length and H against n (longest window), one
  line per label with 3+ seeds (mean; band: the seeds' range)."""
  groups = r.groups()
  kinds = sorted({p for _, p in groups})
  fig = reporting.new_figure(12, 4.2 * len(kinds))
  axes = fig.subplots(len(kinds), 2, squeeze=False)
  L = r.lengths[-1]
  for row, kind in enumerate(kinds):
    ax_loss, ax_h = axes[row]
    for i, label in enumerate(sorted(s for s, p in groups if p == kind)):
      runs, style = groups[label, kind], reporting.style(i)
      loss_RL = np.array([[run.lengths[n]["val_loss"] for n in r.lengths] for run in runs])
      ax_loss.plot(r.lengths, loss_RL.mean(0), label=label, **style)
      ax_loss.fill_between(r.lengths, loss_RL.min(0), loss_RL.max(0), color=style["color"],
                           alpha=0.15)
      n = [math.sqrt(lo * hi) for lo, hi in runs[0].lengths[L]["keys_bins"]]
      h_RB = np.array([np.mean(run.lengths[L]["entropy_by_keys"], axis=0) for run in runs])
      ax_h.plot(n, h_RB.mean(0), label=label, **style)
      ax_h.fill_between(n, h_RB.min(0), h_RB.max(0), color=style["color"], alpha=0.15)
    ax_h.plot([1, L], [0, math.log(L)], color="k", lw=0.8, ls=":", label="log n (uniform)")
    train_len = groups[next(iter(groups))][0].train_len
    for ax in (ax_loss, ax_h):
      ax.set_xscale("log", base=2)
      ax.axvline(train_len, color="k", lw=0.8, ls="--")
    reporting.label_axes(ax_loss, xlabel="evaluation length", ylabel="validation loss (nats)",
                         title=f"positions={kind}: loss against length (trained at {train_len})")
    reporting.label_axes(ax_h, xlabel="keys seen n", ylabel="attention entropy H (nats)",
                         title=f"positions={kind}: entropy against n, windows of {L}")
    ax_loss.set_ylim(top=min(ax_loss.get_ylim()[1], ax_loss.get_ylim()[0] + 2.0))
  return fig


def run(a):
  try:
    r = length_study(results_store.run_dirs(a.workdirs))
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  if a.choose_at not in r.lengths:
    raise SystemExit(f"error: --choose_at {a.choose_at} is not an evaluated length "
                     f"(one of {r.lengths})")
  three = seeded(r)
  code = registry.code_note([{"commit": provenance.commit_of(run.workdir)} for run in r.runs],
                            a, "critical_length_trained")
  paths = reporting.write_tables(
      gamma_rows(r, a.choose_at), a.out, "critical_length_gamma",
      title="Critical length, trained: every gamma at seed 0",
      notes=[f"Validation loss (nats/char) at each evaluation length; `chosen`: the lowest "
             f"at L = {a.choose_at}, the held-out length the sweep picks gamma on (seeds 1 "
             "and 2 then run at that gamma only).", code], floats=".4f")
  if not three.runs:  # a sweep still in its first stage
    return paths, [f"{len(r.runs)} runs, no label with 3 seeds yet: the gamma table only", code]
  paths += reporting.write_tables(
      comparison_rows(three), a.out, "critical_length_compare",
      title="Critical length, trained: against standard",
      notes=["b - a in nats of validation loss (positive: b is worse), 95% t-interval, paired "
             "by seed (attnscale.experiments.stats.compare); a is `against`, b the row's label "
             "and positions; labels with 3 seeds only (each law at its chosen gamma). Growth: "
             "the loss at the longest length minus at the shortest.",
             "holm L=N: at the longest length, the Holm-adjusted p over every group's comparison "
             "with the reference, with the verdict where it survives; robust L=N: the same "
             "comparison at every pairing of the two groups' tied rates, 'untested: one rate "
             "each' where each ran one rate (docs/guides/sweeps.md, verdicts that hold).",
             code])
  paths += reporting.write_tables(
      entropy_rows(three), a.out, "critical_length_entropy",
      title="Critical length, trained: attention entropy against keys seen",
      notes=[f"At windows of {r.lengths[-1]}; H in nats, averaged over heads, layers and the "
             "queries of each powers-of-two bin of n; mean [95% t] over seeds. Slope 1: H "
             "grows as log n (averaging all keys, subcritical); 0: a fixed few keys "
             "(critical); H near 0: collapse on one key (supercritical).", code])
  paths.append(reporting.save_figure(plot(three), a.out, "critical_length_trained"))
  return paths, [f"{len(r.runs)} runs, {len(three.runs)} in labels with 3 seeds", code]


def add_arguments(p) -> None:
  p.add_argument_group("critical_length_trained").add_argument(
      "--choose_at", type=int, default=512,
      help="the held-out length each law's gamma was chosen on (critical_length_trained)")


STUDY = registry.Study(run, in_all=False, needs_workdirs=True, arguments=add_arguments)
