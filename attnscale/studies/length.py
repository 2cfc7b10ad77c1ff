"""Length generalisation: validation loss against evaluation length and position in the window.

Reads what `eval.py --lengths=...` wrote into each run's eval.json ("lengths":
per length the loss and the loss by position, `attnscale.evaluation.length_eval`), and the
run's config.json (scaling label, positions, seed, training length). Runs that
differ only in seed form one group: the table gives each group's mean and
standard error over seeds (for two seeds, half their difference), the figure
its mean line and the seeds' range as a band. runs.csv has one row a run
(`sweep_results.write_runs_csv`: training loss, largest logit, commit, host)
with its validation loss at each evaluation length; length_runs.csv one row a
run and length.

  python -m attnscale.studies length --out studies_out --workdirs runs/length/*
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from collections.abc import Sequence

import numpy as np

from attnscale.config import labels, migration
from attnscale.evaluation.length_eval import position_bins
from attnscale.experiments import (
  reporting,
  results_store,
  run_records,
  stats,
  sweep_results,
  verdicts,
)
from attnscale.runtime import provenance
from attnscale.studies import registry


@dataclasses.dataclass(frozen=True)
class RunLengths:
  """One run's losses by evaluation length.

  Attributes:
    workdir: the run directory.
    scaling: the run's label (`attnscale.config.labels.of`: its sweep's, else derived;
      "unit_scaled" for the unit model).
    positions: model.positions.
    seed: config.seed.
    train_len: config.seq_len, the training window.
    lengths: {L: {"val_loss", "bits_per_char", "targets", "loss_by_position"}}.
    learning_rate: config.learning_rate (NaN where not read).
    final_train_loss: the mean of the last 20 steps (`run_records.read_run`), the
      measure a best rate is chosen by (NaN where not read).
  """

  workdir: str
  scaling: str
  positions: str
  seed: int
  train_len: int
  lengths: dict[int, dict]
  learning_rate: float = math.nan
  final_train_loss: float = math.nan

  @property
  def group(self) -> tuple[str, str]:
    return self.scaling, self.positions


def has_lengths(workdir: str) -> bool:
  """Whether eval.py --lengths has evaluated `workdir`."""
  path = os.path.join(workdir, "eval.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    return "lengths" in json.load(f)


def read_run(workdir: str) -> RunLengths:
  """The lengths evaluation of `workdir`; a one-line ValueError if it has none."""
  path = os.path.join(workdir, "eval.json")
  if not os.path.exists(path):
    raise ValueError(f"--workdirs {workdir} has no eval.json: run "
                     f"`python eval.py --workdir={workdir} --lengths=...` first")
  with open(path) as f:
    result = json.load(f)
  if "lengths" not in result:
    raise ValueError(f"--workdirs {workdir}: its eval.json has no 'lengths': rerun eval.py "
                     "with --lengths=...")
  with open(os.path.join(workdir, "config.json")) as f:
    config = migration.migrate(json.load(f))
  # A test's hand-written run has no rate and no metrics: its rate reads NaN.
  record = (run_records.read_run(workdir) if "learning_rate" in config else None) or {}
  return RunLengths(workdir, labels.of(config), config["model"].get("positions", "learned"),
                    int(config["seed"]), int(config["seq_len"]),
                    {int(k): v for k, v in result["lengths"].items()},
                    float(config.get("learning_rate", math.nan)),
                    float(record.get("final_train_loss", math.nan)))


@dataclasses.dataclass(frozen=True)
class LengthResult:
  runs: list[RunLengths]

  def groups(self) -> dict[tuple[str, str], list[RunLengths]]:
    out = collections.defaultdict(list)
    for run in self.runs:
      out[run.group].append(run)
    return dict(out)

  @property
  def lengths(self) -> list[int]:
    return sorted(set.intersection(*(set(r.lengths) for r in self.runs)))

  def rows(self) -> list[dict]:
    """One row per run and length."""
    return [{"scaling": r.scaling, "positions": r.positions, "seed": r.seed,
             "train_len": r.train_len, "eval_len": L, "val_loss": r.lengths[L]["val_loss"],
             "bits_per_char": r.lengths[L]["bits_per_char"],
             "commit": provenance.commit_of(r.workdir), "run": os.path.basename(
                 os.path.normpath(r.workdir))}
            for r in self.runs for L in sorted(r.lengths)]

  def summary_rows(self) -> list[dict]:
    """One row per (scaling, positions): loss at each length, mean +- s.e. over seeds."""
    rows = []
    for (scaling, positions), runs in sorted(self.groups().items()):
      row = {"scaling": scaling, "positions": positions, "seeds": len(runs)}
      for L in self.lengths:
        mean, se = mean_se([r.lengths[L]["val_loss"] for r in runs])
        row[f"L={L}"] = f"{mean:.3f} ± {se:.3f}" if len(runs) > 1 else f"{mean:.3f}"
      first, last = self.lengths[0], self.lengths[-1]
      growth = [r.lengths[last]["val_loss"] - r.lengths[first]["val_loss"] for r in runs]
      mean, se = mean_se(growth)
      row[f"L={last} - L={first}"] = f"{mean:+.3f} ± {se:.3f}" if len(runs) > 1 else f"{mean:+.3f}"
      rows.append(row)
    return rows


def comparison_rows(r: LengthResult, reference: str = "standard") -> list[dict]:
  """Each group against `reference` with the same positions, and rope against no
  positions for each scaling that has both: at every evaluation length and in the
  growth (loss at the last length minus at the first), `stats.compare` (b - a,
  paired by seed where they share seeds, 95% t). Positive: b is worse."""
  groups = r.groups()
  first, last = r.lengths[0], r.lengths[-1]

  def by_seed(runs, L=None):
    return {run.seed: (run.lengths[L]["val_loss"] if L else
                       run.lengths[last]["val_loss"] - run.lengths[first]["val_loss"])
            for run in runs}

  pairs = [((reference, pos), (scaling, pos), f"{reference}, {pos}")
           for scaling, pos in sorted(groups) if scaling != reference
           and (reference, pos) in groups]
  pairs += [((scaling, "rope"), (scaling, "none"), f"{scaling}, rope")
            for scaling, pos in sorted(groups) if pos == "none" and (scaling, "rope") in groups]
  rows, longest = [], {}
  for a, b, against in pairs:
    row = {"scaling": b[0], "positions": b[1], "against": against}
    for L in r.lengths:
      row[f"L={L}"] = stats.compare(by_seed(groups[a], L), by_seed(groups[b], L)).format()
    row[f"growth {first}->{last}"] = stats.compare(by_seed(groups[a]),
                                                   by_seed(groups[b])).format()
    if a == (reference, b[1]):  # against the reference with the same positions
      longest[len(rows)] = stats.compare(by_seed(groups[a], last), by_seed(groups[b], last))
    rows.append(row)
  # Holm at the longest length over every group's comparison with the reference
  # (docs/guides/sweeps.md, verdicts that hold); the rope-against-none rows are not in
  # that family.
  family = verdicts.family(longest)
  for i, row in enumerate(rows):
    row[f"holm L={last}"] = family.get(i, "")
  for (a, b, _), row in zip(pairs, rows):
    row[f"robust L={last}"] = robust(groups[a], groups[b], last)
  return rows


def robust(a_runs: Sequence[RunLengths], b_runs: Sequence[RunLengths], length: int) -> str:
  """b against a in validation loss at `length`, at every pairing of the two groups'
  tie sets on the final training loss (`verdicts.robust`); "untested: one rate each
  (...)" where each group ran one rate (`verdicts.one_rate`: the sweep trains each
  scaling at its best rate from another sweep, so no tie set is measured here)."""
  def by_rate(runs, value):
    out: dict[float, dict] = {}
    for run in runs:
      out.setdefault(run.learning_rate, {})[run.seed] = value(run)
    return out

  val = lambda run: run.lengths[length]["val_loss"]
  a, b = by_rate(a_runs, val), by_rate(b_runs, val)
  untested = verdicts.one_rate(a, b)
  if untested:
    return untested
  ties = [stats.tie_set(by_rate(runs, lambda run: run.final_train_loss))
          for runs in (a_runs, b_runs)]
  return verdicts.robust(a, b, *ties) or "-"


def mean_se(values: Sequence[float]) -> tuple[float, float]:
  """Mean and standard error (sample std / sqrt(n)); s.e. 0 for one value."""
  x = np.asarray(values, float)
  se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0
  return float(x.mean()), se


def length_study(workdirs: Sequence[str]) -> LengthResult:
  if not workdirs:
    raise ValueError("length: give one or more --workdirs (runs evaluated with eval.py --lengths)")
  return LengthResult([read_run(w) for w in workdirs])


def plot_length(result: LengthResult):
  """Per positions type: loss against evaluation length, and against position at the
  longest length (log-binned), one line per scaling (mean over seeds, band = range)."""
  groups = result.groups()
  kinds = sorted({p for _, p in groups})
  fig = reporting.new_figure(12, 4.2 * len(kinds))
  axes = fig.subplots(len(kinds), 2, squeeze=False)
  L_max = result.lengths[-1]
  bins = position_bins(L_max)
  for row, kind in enumerate(kinds):
    ax_len, ax_pos = axes[row]
    names = sorted(s for s, p in groups if p == kind)
    for i, scaling in enumerate(names):
      runs = groups[scaling, kind]
      style = reporting.style(i)
      loss_RL = np.array([[r.lengths[L]["val_loss"] for L in result.lengths] for r in runs])
      ax_len.plot(result.lengths, loss_RL.mean(0), label=scaling, **style)
      ax_len.fill_between(result.lengths, loss_RL.min(0), loss_RL.max(0),
                          color=style["color"], alpha=0.15)
      curve_RP = np.array([r.lengths[L_max]["loss_by_position"] for r in runs])
      binned_RB = np.stack([curve_RP[:, a:b].mean(1) for a, b in bins], 1)
      centres = [math.sqrt(max(a, 1) * b) for a, b in bins]
      ax_pos.plot(centres, binned_RB.mean(0), label=scaling, **style)
      ax_pos.fill_between(centres, binned_RB.min(0), binned_RB.max(0),
                          color=style["color"], alpha=0.15)
    train_len = groups[names[0], kind][0].train_len
    for ax in (ax_len, ax_pos):
      ax.set_xscale("log", base=2)
      ax.axvline(train_len, color="k", lw=0.8, ls="--")
    reporting.label_axes(ax_len, xlabel="evaluation length", ylabel="validation loss (nats)",
                         title=f"positions={kind}: loss against length (trained at {train_len})")
    reporting.label_axes(ax_pos, xlabel="position in the window (keys seen)",
                         ylabel="validation loss (nats)",
                         title=f"positions={kind}: loss against position, windows of {L_max}")
    top = max(ax_len.get_ylim()[0] + 1.5, 3.0)
    ax_len.set_ylim(top=min(ax_len.get_ylim()[1], top))
    ax_pos.set_ylim(top=min(ax_pos.get_ylim()[1], top))
  return fig


def write_runs_csv(r: LengthResult, path: str) -> str:
  """runs.csv: each run's row (`run_records.read_run`) with its positions and its
  validation loss at every evaluation length (val_loss_L<n>); returns `path`."""
  results = [f"val_loss_L{L}" for L in r.lengths]
  rows = [{**run_records.read_run(run.workdir), "positions": run.positions,
           **{f"val_loss_L{L}": run.lengths[L]["val_loss"] for L in r.lengths}}
          for run in r.runs]
  sweep_results.write_runs_csv(rows, path, hyperparameters=("positions",), results=results)
  return path


# ---------------------------------------------------------------------------
# The command line: python -m attnscale.studies length --workdirs RUN ...

def run_length(a):
  try:
    r = length_study(results_store.run_dirs(a.workdirs))  # a store: each of its runs
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  first, last = r.lengths[0], r.lengths[-1]
  notes = [f"{len(r.runs)} runs; validation loss (nats/char) over the whole split at each "
           f"evaluation length (eval.py --lengths), mean ± standard error over seeds.",
           f"Last column: loss at {last} minus loss at {first} (how much worse the model "
           "gets with longer windows; negative = longer context helps).",
           "Per-run values: runs.csv (a row a run), length_runs.csv (a row a run and length).",
           registry.code_note([{"commit": provenance.commit_of(run.workdir)} for run in r.runs],
                              a, "length")]
  paths = reporting.write_tables(r.rows(), a.out, "length_runs", title="Length study, every run")
  paths.append(write_runs_csv(r, os.path.join(a.out, "runs.csv")))
  paths += reporting.write_tables(
      comparison_rows(r), a.out, "length_compare", title="Length study: comparisons",
      notes=["b - a in nats of validation loss (positive: b is worse), 95% t-interval, "
             "paired by seed where the two share seeds (attnscale.experiments.stats.compare); "
             "a is `against`, b the row's scaling and positions. Growth: the loss at the "
             "longest evaluation length minus at the shortest.",
             "holm L=N: at the longest length, the Holm-adjusted p over every group's comparison "
             "with the reference, with the verdict where it survives; robust L=N: the same "
             "comparison at every pairing of the two groups' tied rates, 'untested: one rate "
             "each' where each group ran one rate, so nothing shows whether the verdict holds "
             "at a rate tied with it (docs/guides/sweeps.md, verdicts that hold)."])
  written, notes = reporting.write_study(plot_length(r), r.summary_rows(), a.out, "length",
                          "Loss against evaluation length", notes)
  return written + paths, notes


# In `all` only when every run given was evaluated with eval.py --lengths.
STUDY = registry.Study(run_length, needs_workdirs=True,
                       in_all=lambda args: all(map(has_lengths, args.workdirs)))
