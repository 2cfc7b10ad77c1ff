"""Sweep results: the best learning rate per scaling, tables and figures.

Rows are what `sweeps.collect` reads from run directories, one per point, with
the columns of COLUMNS plus `curve` ((step, training loss) pairs), `max_logit`
and `commit`. A scaling's best learning rate is the lowest seed mean among its
rates with the most seeds (`best_per_scaling`: the staged search's choice). Whether two scalings differ is `stats.compare`'s
call: paired by seed where their best rates share seeds, Welch otherwise, a
Student-t interval at 95%, never a z = 1.96 with 2-3 seeds. `write_results`
writes results.csv, runs.csv (`write_runs_csv`: one line a run, with its commit),
results.md and Graphcore-style figures: final training loss against learning
rate per scaling (loss_vs_lr.png), the loss curves at each scaling's best rate
(loss_curves.png) and, with several seeds, each scaling's seeds and 95%
t-interval at its best rate (best.png). `commit_note` refuses rows from several
commits unless asked, and says which they are.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from attnscale.experiments import (
  reporting,  # tables and figures, written as the studies write theirs
  stats,  # every comparison: t-intervals, paired or Welch
  verdicts,  # the protocol's tie-robust and family-wise readings
)

# A row per run (`run_records.read_run`): these columns, plus "curve".
COLUMNS = ("scaling", "variant", "learning_rate", "seed", "steps", "final_train_loss",
           "best_val_loss", "wall_s", "status", "run")
TEXT_COLUMNS = ("scaling", "variant", "status")  # left-aligned in Markdown


def best_per_scaling(rows: Sequence[dict]) -> dict[str, dict]:
  """Per scaling, the best learning rate and its final training loss, as
  {scaling: {"learning_rate", "final_train_loss", "seeds", "se"}}.

  The rate is the lowest seed mean among the scaling's rates with the most
  finished seeds. That is the staged search's own choice under each protocol
  (attnscale/experiments/lr_search.py): under the study protocol every rate
  of the near-best band has 3+ seeds and the rates outside it, with one, are
  measurably worse; with seeds added at the best only, it is the rate the
  search picked; on a grid, the seed mean. Never a single run's lucky draw
  against a 3-seed mean. The loss is the mean over all seeds at the chosen
  rate and "se" its standard error (NaN with one seed).
  """
  by_key: dict[tuple[str, float], list[float]] = {}
  for r in rows:
    if r["status"] == "done" and math.isfinite(r["final_train_loss"]):
      by_key.setdefault((r["scaling"], r["learning_rate"]), []).append(r["final_train_loss"])
  most: dict[str, int] = {}
  for (scaling, _), losses in by_key.items():
    most[scaling] = max(most.get(scaling, 0), len(losses))
  best: dict[str, dict] = {}
  for (scaling, lr), losses in sorted(by_key.items()):
    mean = sum(losses) / len(losses)
    if len(losses) == most[scaling] and (
        scaling not in best or mean < best[scaling]["final_train_loss"]):
      best[scaling] = {"learning_rate": lr, "final_train_loss": mean,
                       "seeds": len(losses), "se": standard_error(losses)}
  return best


def best_runs(rows: Sequence[dict], seed=0) -> list[str]:
  """The `run` directory names of seed `seed` at each scaling's best learning
  rate (`best_per_scaling`), in row order: what the `trained` study reads."""
  best = best_per_scaling(rows)
  return [r["run"] for r in rows if r["seed"] == seed and r["status"] == "done"
          and r["learning_rate"] == best.get(r["scaling"], {}).get("learning_rate")]


def standard_error(values: Sequence[float]) -> float:
  """Sample std / sqrt(n) (NaN for fewer than two values): what tables print
  after "±"; intervals and verdicts come from `stats`."""
  n = len(values)
  if n < 2:
    return math.nan
  mean = sum(values) / n
  return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def within_noise(a: dict, b: dict) -> bool | None:
  """Whether two `best_per_scaling` entries are within noise of each other: the
  95% Welch t-interval of their difference covers 0 (`stats.compare_summaries`;
  t with Welch-Satterthwaite degrees of freedom, not z = 1.96). None when either
  has a single seed (no spread to judge by).

  A summary has no per-seed losses, so nothing is paired here; `best_table`
  pairs shared seeds (`stats.compare`), which can find a difference this misses.
  """
  c = stats.compare_summaries(a["final_train_loss"], a["se"], a["seeds"],
                              b["final_train_loss"], b["se"], b["seeds"])
  return None if c.method == "none" else c.verdict == "within noise"


def seed_losses(rows: Sequence[dict], scaling: str, learning_rate: float) -> dict:
  """{seed: final training loss} of the finished runs of `scaling` at
  `learning_rate`: what `stats.compare` pairs."""
  return {r.get("seed"): r["final_train_loss"] for r in rows
          if r["scaling"] == scaling and r["learning_rate"] == learning_rate
          and r["status"] == "done" and math.isfinite(r["final_train_loss"])}


def markdown_table(rows: Sequence[dict]) -> str:
  """The results as a Markdown table, the best learning rate per scaling in bold.

  Every column but `run`; losses to 4 decimals, learning rates as powers of two,
  wall time in whole seconds, NaN (not run, diverged) as "-".
  """
  best = best_per_scaling(rows)
  columns = COLUMNS[:-1]

  def bold(row):
    is_best = best.get(row["scaling"], {}).get("learning_rate") == row["learning_rate"]
    return ("final_train_loss",) if is_best else ()

  return reporting.to_markdown(
      rows, columns, floats=".4f", nan="-", bold=bold,
      formats={"learning_rate": reporting.power_of_two, "wall_s": ".0f"},
      numeric=[c for c in columns if c not in TEXT_COLUMNS])


def best_table(rows: Sequence[dict], baseline: str = "standard") -> str:
  """Markdown: the best learning rate per scaling and its loss, lowest loss first.

  With several seeds at a scaling's best learning rate the loss is mean ± standard
  error, and the "vs best" column says whether it is better, worse or within
  noise of the best scaling (`stats.compare` of the two best rates' seeds: paired
  where they share seeds, Welch otherwise, a 95% t-interval; "-" with too few
  seeds); when `baseline` is one of the scalings, "vs <baseline>" says the same
  against it. The last columns give the difference in nats with its interval,
  method and seeds ("+0.080 [+0.052, +0.108] paired n=3").
  """
  best = sorted(best_per_scaling(rows).items(), key=lambda kv: kv[1]["final_train_loss"])
  if any(b["seeds"] > 1 for _, b in best):
    top = best[0][0]
    base = baseline if baseline in dict(best) else None
    seeds = {scaling: seed_losses(rows, scaling, b["learning_rate"]) for scaling, b in best}
    columns = ("scaling", "best lr", "seeds", "final train loss", "vs best")
    if base is not None:
      columns += (f"vs {baseline}",)
    columns += ("minus best (95% t)",) + ((f"minus {baseline} (95% t)",) if base else ())
    readings = {}
    if base is not None:  # the protocol's two readings (docs/guides/sweeps.md)
      columns += ("tied rates", f"vs {baseline}, tie-robust", f"vs {baseline}, Holm")
      readings = _readings(rows, dict(best), seeds, base)

    def comparison(scaling, ref):
      c = stats.compare(seeds[ref], seeds[scaling])
      return ("-" if c.method == "none" else c.verdict), c.format(verdict=False)

    def cells(scaling, b):
      loss = (f"{b['final_train_loss']:.4f} ± {b['se']:.4f}" if b["seeds"] > 1
              else f"{b['final_train_loss']:.4f}")
      refs = [(top, "best")] + ([(base, "baseline")] if base is not None else [])
      against = [("-", "-") if scaling == ref else comparison(scaling, ref) for ref, _ in refs]
      verdicts = [name if scaling == ref else v for (ref, name), (v, _) in zip(refs, against)]
      values = [scaling, b["learning_rate"], b["seeds"], loss, *verdicts,
                *(d for _, d in against), *readings.get(scaling, ())]
      return dict(zip(columns, values))

    return reporting.to_markdown([cells(*kv) for kv in best], columns,
                                 formats={"best lr": reporting.power_of_two},
                                 numeric=("best lr", "seeds", "final train loss"))
  columns = ("scaling", "best lr", "final train loss")
  return reporting.to_markdown(
      [dict(zip(columns, (scaling, b["learning_rate"], b["final_train_loss"])))
       for scaling, b in best],
      columns, floats=".4f", formats={"best lr": reporting.power_of_two},
      numeric=columns[1:])


def _readings(rows: Sequence[dict], best: dict, seeds: dict, base: str) -> dict:
  """{scaling: (tied rates, tie-robust verdict against `base`, Holm cell)}: the
  best rate's tie set on the training loss (`stats.tie_set`), the verdict over every
  pairing of the two tie sets (`stats.robust_compare`) and the Holm-adjusted p over
  every scaling's comparison with `base` (`verdicts.family`)."""
  by_rate = {scaling: {r["learning_rate"]: seed_losses(rows, scaling, r["learning_rate"])
                       for r in rows if r["scaling"] == scaling}
             for scaling in best}
  ties = {scaling: stats.tie_set({lr: s for lr, s in by_rate[scaling].items() if s},
                                 b["learning_rate"])
          for scaling, b in best.items()}
  family = verdicts.family({scaling: stats.compare(seeds[base], seeds[scaling])
                            for scaling in best if scaling != base})
  out = {}
  for scaling in best:
    tied = " ".join(verdicts.rate_label(r) for r in ties[scaling])
    if scaling == base:
      out[scaling] = (tied, "baseline", "baseline")
      continue
    robust = verdicts.robust(by_rate[base], by_rate[scaling], ties[base], ties[scaling])
    out[scaling] = (tied, robust or "-", family.get(scaling) or "-")
  return out


def commit_note(rows: Sequence[dict], allow_mixed: bool = False) -> str:
  """Which code the rows' runs came from, as a line to print under a table:
  "runs from 1 commit: abc1234 (15 runs)" or, for several, "runs from 2
  commits: abc1234 (12 runs), def5678 (3 runs)" (most runs first); then, where
  the rows name their host (`provenance.host_of`), "; hosts: AMD EPYC/avx2 (12
  runs), unrecorded (3 runs)" ("unrecorded": provenance from before the field).
  Runs of one commit on two kinds of CPU can differ in rounding (XLA:CPU compiles
  for the host's vector width), as two seeds do, so hosts are reported, not
  refused.

  A row's "commit" is `run_records.read_run`'s (`provenance.commit_of`: "unknown"
  without a provenance.json, "+dirty" for uncommitted changes); rows never
  started (no "commit") are not counted.

  Raises:
    ValueError: the runs come from more than one commit and `allow_mixed` is
      False: a comparison across code changes is not the comparison it claims.
  """
  counts: dict[str, int] = {}
  hosts: dict[str, int] = {}
  for r in rows:
    commit = r.get("commit")
    if isinstance(commit, str) and r.get("status") != "new":
      counts[commit] = counts.get(commit, 0) + 1
      if isinstance(r.get("host"), str):
        hosts[r["host"]] = hosts.get(r["host"], 0) + 1
  ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
  listed = ", ".join(f"{_short_commit(c)} ({n} run{'s' * (n != 1)})" for c, n in ordered)
  note = f"runs from {len(ordered)} commit{'s' * (len(ordered) != 1)}: {listed}"
  if len(ordered) > 1 and not allow_mixed:
    raise ValueError(f"{note}; rerun them at one commit, or pass allow_mixed=True "
                     "to compare across code changes")
  if hosts:
    by_count = sorted(hosts.items(), key=lambda kv: (-kv[1], kv[0]))
    note += "; hosts: " + ", ".join(f"{h} ({n} run{'s' * (n != 1)})" for h, n in by_count)
  return note


def _short_commit(commit: str) -> str:
  """The first 7 hex digits of each commit in a "+"-joined commit string."""
  return "+".join(part[:7] if len(part) == 40 else part for part in commit.split("+"))


# runs.csv: the columns every run has, around the swept hyperparameters.
RUN_COLUMNS = ("label", "learning_rate", "seed", "final_train_loss", "best_val_loss",
               "max_logit", "steps", "status", "commit", "host", "run")
# Keys of a row that are results, not swept hyperparameters ("scaling" is in the label).
_NOT_SWEPT = set(RUN_COLUMNS) | {"scaling", "wall_s", "curve", "logits"}


def write_runs_csv(rows: Sequence[dict], path: str,
                   hyperparameters: Sequence[str] | None = None,
                   results: Sequence[str] = ()) -> list[str]:
  """Writes the raw results, one line a run, to `path`; returns its columns.

  Columns: label (the row's "label", else its scaling), learning_rate, the swept
  hyperparameters, seed, final_train_loss, best_val_loss, max_logit (the
  largest attention logit of the run's last log row), steps, status, commit,
  host (`provenance.host_of`), run (its directory name).
  The hyperparameters are `hyperparameters`, or by default every other key the
  rows carry with a plain value (str, int, float, bool) in every row: variant,
  and what a study adds (width, num_layers). `results`: more result columns a
  study measured (eval.py's validation loss, say), after max_logit. Floats are
  written exactly (they read back equal); a missing value is empty.
  """
  if hyperparameters is None:
    keys = dict.fromkeys(k for r in rows for k in r if k not in _NOT_SWEPT)
    hyperparameters = [k for k in keys if all(
        isinstance(r.get(k), (str, int, float, bool)) for r in rows) and k not in results]
  at = RUN_COLUMNS.index("steps")
  columns = [*RUN_COLUMNS[:2], *hyperparameters, *RUN_COLUMNS[2:at], *results,
             *RUN_COLUMNS[at:]]
  table = [{**r, "label": r.get("label", r.get("scaling"))} for r in rows]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    f.write(reporting.to_csv([{c: t.get(c) for c in columns} for t in table], columns,
                             floats=str))
  return columns


def write_results(rows: Sequence[dict], out_dir: str, *, title: str = "") -> dict[str, str]:
  """Writes results.csv, runs.csv, results.md, loss_vs_lr.png and loss_curves.png
  (and best.png where a best learning rate has several seeds); returns the paths.
  Rows without training curves (`read_results_csv`'s) leave loss_curves.png as
  it is.

  results.csv has every column of COLUMNS with floats written exactly (they
  read back equal); runs.csv is `write_runs_csv`'s; results.md has the title,
  `best_table`, the commits the runs came from (`commit_note`, several allowed)
  and a pointer to results.csv for every point (`markdown_table` prints that table).
  """
  os.makedirs(out_dir, exist_ok=True)
  paths = {name: os.path.join(out_dir, name) for name in
           ("results.csv", "runs.csv", "results.md", "loss_vs_lr.png", "loss_curves.png")}
  with open(paths["results.csv"], "w") as f:
    f.write(reporting.to_csv(rows, COLUMNS, floats=str))
  write_runs_csv(rows, paths["runs.csv"])
  # A sweep resumed after a code change still gets its tables; the note says so.
  code = commit_note(rows, allow_mixed=True) if any("commit" in r for r in rows) else ""
  with open(paths["results.md"], "w") as f:
    f.write((f"# {title}\n\n" if title else "")
            + "Best learning rate per scaling (final training loss = mean of the last 20 "
            "steps, mean over seeds):\n\n" + best_table(rows)
            + (f"\n{code}\n" if code else "")
            # Every point is in results.csv (and runs.csv), which a browser shows as a
            # table; a second copy here only grew the folder.
            + "\nAll points: results.csv, one row a run (runs.csv: with commit and host).\n")
  reporting.save_figure(plot_loss_vs_lr(rows, title=title), out_dir, "loss_vs_lr")
  if any(r.get("curve") for r in rows):  # rows read back from results.csv have none
    reporting.save_figure(plot_loss_curves(rows, title=title), out_dir, "loss_curves")
  else:
    del paths["loss_curves.png"]
  if any(b["seeds"] > 1 for b in best_per_scaling(rows).values()):
    paths["best.png"] = reporting.save_figure(plot_best(rows, title=title), out_dir, "best")
  return paths


def plot_loss_vs_lr(rows: Sequence[dict], *, title: str = ""):
  """Final training loss against learning rate (log2), one line per scaling through
  the seed means (Graphcore's almost-scaled attention figure), each seed a faint dot
  where a rate has several (the seed spread); a rate where a seed diverged marked x
  at the top."""
  fig = reporting.new_figure(6.4, 4.2)
  ax = fig.subplots()
  done = [r for r in rows if r["status"] in ("done", "diverged")]
  finite = [r["final_train_loss"] for r in done if math.isfinite(r["final_train_loss"])]
  ceiling = max(finite) + 0.05 if finite else 1.0
  for i, scaling in enumerate(sorted({r["scaling"] for r in done})):
    points: dict[float, list[float]] = {}
    for r in done:
      if r["scaling"] == scaling:
        points.setdefault(r["learning_rate"], []).append(r["final_train_loss"])
    lrs = sorted(points)
    means = [sum(v) / len(v) for v in (points[lr] for lr in lrs)]
    line, = ax.plot([lr for lr, m in zip(lrs, means) if math.isfinite(m)],
                    [m for m in means if math.isfinite(m)], label=scaling,
                    **reporting.style(i))
    spread = [(lr, v) for lr in lrs if len(points[lr]) > 1 for v in points[lr]
              if math.isfinite(v)]
    if spread:
      ax.plot(*zip(*spread), ".", color=line.get_color(), alpha=0.35, markersize=4)
    bad = [lr for lr, m in zip(lrs, means) if not math.isfinite(m)]
    if bad:
      ax.plot(bad, [ceiling] * len(bad), "x", color=line.get_color())
  ax.set_xscale("log", base=2)
  reporting.label_axes(ax, xlabel="learning rate",
                       ylabel="final training loss (mean of last 20 steps)",
                       title=title or "final training loss vs learning rate")
  _compact_legend(ax)
  return fig


def _compact_legend(ax, many: int = 8) -> None:
  """More than `many` lines: a small two-column legend (else it covers the plot)."""
  if len(ax.get_legend_handles_labels()[0]) > many:
    ax.legend(fontsize="x-small", ncol=2)


def plot_best(rows: Sequence[dict], *, title: str = ""):
  """Each scaling's final training loss at its best learning rate, best at the
  top: one dot per seed, the mean with its 95% t-interval (`stats.mean_interval`:
  t_{0.975, n-1} standard errors, 12.7 with 2 seeds), and a dotted line at the
  best scaling's mean."""
  best = sorted(best_per_scaling(rows).items(), key=lambda kv: -kv[1]["final_train_loss"])
  fig = reporting.new_figure(6.4, 1.2 + 0.28 * len(best))
  ax = fig.subplots()
  for y, (scaling, b) in enumerate(best):
    seeds = [r["final_train_loss"] for r in rows
             if r["scaling"] == scaling and r["learning_rate"] == b["learning_rate"]
             and r["status"] == "done" and math.isfinite(r["final_train_loss"])]
    ax.plot(seeds, [y] * len(seeds), "o", color="tab:blue", alpha=0.5, markersize=4)
    interval = stats.mean_interval(seeds)
    half = interval.half if math.isfinite(interval.half) else 0.0
    ax.errorbar([b["final_train_loss"]], [y], xerr=[half], fmt="|", color="black",
                markersize=10, capsize=3)
  if best:
    ax.axvline(best[-1][1]["final_train_loss"], color="gray", linestyle=":", linewidth=1)
  ax.set_yticks(range(len(best)),
                [f"{s} (lr {reporting.power_of_two(b['learning_rate'])})" for s, b in best])
  reporting.label_axes(ax, xlabel="final training loss (mean of last 20 steps)", ylabel="",
                       title=title or "each scaling at its best learning rate")
  return fig


def plot_loss_curves(rows: Sequence[dict], *, title: str = ""):
  """Training loss against step at each scaling's best learning rate."""
  fig = reporting.new_figure(6.4, 4.2)
  ax = fig.subplots()
  for i, (scaling, b) in enumerate(sorted(best_per_scaling(rows).items())):
    runs = [r for r in rows if r["scaling"] == scaling and r["learning_rate"] == b["learning_rate"]
            and r["curve"]]
    if runs:
      steps, losses = zip(*runs[0]["curve"])
      ax.plot(steps, losses, color=reporting.style(i)["color"],
              linestyle=("-", "--", ":")[i // 10 % 3],
              label=f"{scaling} (lr {reporting.power_of_two(b['learning_rate'])})")
  reporting.label_axes(ax, xlabel="step", ylabel="training loss",
                       title=title or "training loss at each scaling's best learning rate")
  _compact_legend(ax)
  return fig


def read_results_csv(path: str) -> list[dict]:
  """The rows of a sweep's results.csv (`write_results`), numbers as numbers
  (floats exact, NaN for "-" or empty): the committed results, read back to
  recompute the tables with today's statistics."""
  import csv
  ints, floats = ("seed", "steps"), ("learning_rate", "final_train_loss", "best_val_loss",
                                     "wall_s")
  with open(path) as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    for k in floats:
      r[k] = float(r[k]) if r.get(k) not in (None, "", "-", "nan") else math.nan
    for k in ints:
      r[k] = int(r[k]) if r.get(k) not in (None, "") else None
  return rows


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m attnscale.experiments.sweep_results RESULTS_CSV OUT_DIR [--title T]`:
  a committed sweep's tables and figures (all but the loss curves) again, from
  its results.csv, with today's statistics."""
  import argparse
  p = argparse.ArgumentParser(prog="python -m attnscale.experiments.sweep_results",
                              description=main.__doc__)
  p.add_argument("results_csv")
  p.add_argument("out_dir")
  p.add_argument("--title", default="")
  args = p.parse_args(argv)
  paths = write_results(read_results_csv(args.results_csv), args.out_dir, title=args.title)
  print("wrote " + ", ".join(paths.values()))


if __name__ == "__main__":
  main()
