"""A staged learning-rate search: bracket each label's best rate, then add seeds.

Rates are powers of two, 2^-e, named by their exponent e (larger e, smaller rate).

Stage 1 (seed 0), per label: three rates around its start, 2^-(e-1), 2^-e,
2^-(e+1); then one rate further while the best of those tried is at an edge
(all diverged: a smaller rate), never leaving `bounds`. The best is
"bracketed" when it has a worse (or diverged) neighbour on both sides, or the
next step would leave the bounds.

Stage 2: `more_seeds` at the bracketed best, so a table can give mean ± s.e.

The study protocol (`band_seeds`, docs/guides/sweeps.md "The study protocol")
replaces stage 2: the best is chosen on the seed mean, and every rate inside the
near-best band (`attnscale.experiments.stats.near_best_band`: the rates that are
not measurably worse than the best, so could be it) runs `band_seeds` too, 3 seeds
in all with seed 0. With their losses the best is found again on the means; if it
moved to an edge, the search steps on; the band is asked again, until the best is
bracketed on the mean and every band rate has its seeds. A rate where any seed
diverged counts as diverged. With packed sweeps (`sweep.py --pack`), each round's
rates x seeds of a label train as one program.

A run that did not learn is no candidate (`no_learning`, optional): a final loss
at or above that level (e.g. near the unigram, what predicting token
frequencies scores) counts as diverged. Without it, a label that learns nothing
at every rate tried has a "best" chosen by noise among the failures, inside the
rates tried, and the search would stop there and add seeds to it; with it, every
rate failed means "all diverged", and the search goes to smaller rates (the
small BERT's `umup` at 2^-7 ... 2^-4, where every label failed at 2^-7 or
above: docs/experiments/bert.md).

Window (optional): once a label's best is settled, seed 0 also runs at every rate
within `window` octaves of it (inside `bounds`) that the search did not try, so
that each label has the same rates around its best: what a sensitivity measure
over a fixed range (Wortsman et al. 2023's S) needs to compare labels and sizes.
These runs do not move the best (the search reads only its own trials).
`window_seeds` runs those seeds at every window rate too (the band's rates already
have theirs), so that S has a value per seed and an interval over seeds.

Under the study protocol, a window or transfer run whose loss lands in the
near-best band (seed 0 within the band's margin of the best) gets `band_seeds`
too: a study reads every rate a label ran, so such a rate is in its band, and the
protocol wants 3 seeds at every band rate (`_off_search_band_seeds`).

Transfer (optional): once a source label's best is bracketed, each of its
target labels also runs (seed 0) at the source's best rate, if its own search did
not try it: what a model tuned at one size gets at another (the width study:
every width at the smallest width's best rate).

The search is a pure function of what has finished: `search(starts, loss)` asks
`loss(trial)` for each trial's final loss (None: not finished yet, NaN:
diverged) and returns every trial the search needs so far. Called again as runs
finish, it returns the same trials plus the next ones, so a sweep runs it until
the list stops growing (sweep.py does). `points` wraps it for a sweep: trials
as sweep points, losses read from the sweep's run directories.

    trials = lr_search.search({"standard": 9}, loss, bounds=(3, 12), more_seeds=(1, 2))
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Trial:
  """One run of the search: `label` at learning rate 2^-`exponent`, seed `seed`."""

  label: str
  exponent: int
  seed: int = 0

  @property
  def learning_rate(self) -> float:
    return 2.0**-self.exponent


def best_exponent(losses: Mapping[int, float]) -> int | None:
  """The exponent of the lowest finite loss (a tie: the smaller rate); None when
  every rate diverged."""
  finite = [(loss, -e) for e, loss in losses.items() if math.isfinite(loss)]
  return -min(finite)[1] if finite else None


def _mean(by_seed: Mapping[int, float]) -> float:
  """The seed mean of one rate's losses; NaN if any seed diverged."""
  values = list(by_seed.values())
  return sum(values) / len(values) if all(math.isfinite(v) for v in values) else math.nan


def search(starts: Mapping[str, int], loss: Callable[[Trial], float | None], *,
           bounds: tuple[int, int] = (3, 12),
           more_seeds: Sequence[int] = (1, 2),
           band_seeds: Sequence[int] = (),
           transfer: Mapping[str, Sequence[str]] | None = None,
           no_learning: float | None = None, window: int = 0,
           window_seeds: Sequence[int] = ()) -> list[Trial]:
  """The trials needed so far: stage 1 of every label (seed 0), then stage 2.

  Args:
    starts: label -> the exponent its search starts at (in order: the trials
      come label by label).
    loss: a finished trial's final loss (NaN when it diverged); None while it
      has not finished (that label's search waits for it).
    bounds: (lo, hi): the search never steps beyond lo <= e <= hi (the first
      three rates are the start's neighbours, whatever the bounds).
    more_seeds: the seeds added at each label's bracketed best.
    band_seeds: the study protocol (module docstring): seeds added at every rate
      of the near-best band, the best chosen on the seed mean (with `more_seeds`
      usually empty).
    transfer: source label -> target labels run (seed 0) at the source's best.
    no_learning: a final loss at or above it counts as diverged (a run that
      learned nothing; module docstring). None: every finite loss counts.
    window: seed 0 at every rate within this many octaves of each settled best
      (module docstring); 0: none.
    window_seeds: these seeds too at every rate of the window (with `window`).

  Returns:
    Stage 1's trials (label by label, in the order they were needed), then
    stage 2's (a label whose search is still running, or whose every rate
    diverged, has none), then the window's, then the transfer trials.
  """
  lo, hi = bounds
  if no_learning is not None:
    raw_loss = loss

    def loss(t: Trial) -> float | None:
      value = raw_loss(t)
      return math.nan if value is not None and value >= no_learning else value

  stage1, stage2, around, best_of, settled = [], [], [], {}, {}
  for label, start in starts.items():
    tried, banded = [start - 1, start, start + 1], set()
    while True:
      trials = [Trial(label, e, seed) for e in tried
                for seed in (0, *(band_seeds if e in banded else ()))]
      stage1 += [t for t in trials if t not in stage1]
      by_seed: dict[int, dict[int, float | None]] = {}
      for t in trials:
        by_seed.setdefault(t.exponent, {})[t.seed] = loss(t)
      if any(v is None for seeds in by_seed.values() for v in seeds.values()):
        break  # this label's search is still running
      best = best_exponent({e: _mean(seeds) for e, seeds in by_seed.items()})
      # All diverged: a smaller rate; best at an edge: one step beyond it.
      if best is None or best == max(tried):
        beyond = max(tried) + 1
      elif best == min(tried):
        beyond = best - 1
      else:
        beyond = None
      if beyond is not None and lo <= beyond <= hi and beyond not in tried:
        tried = sorted(tried + [beyond])
        continue
      if band_seeds and best is not None:
        from attnscale.experiments import stats
        band = stats.near_best_band(by_seed).rates
        if set(band) - banded:
          banded |= set(band)
          continue
      if best is not None:
        stage2 += [Trial(label, best, seed) for seed in more_seeds]
        around += [Trial(label, e, 0) for e in range(best - window, best + window + 1)
                   if lo <= e <= hi and e not in tried]
        around += [Trial(label, e, seed) for seed in window_seeds
                   for e in range(best - window, best + window + 1)
                   if lo <= e <= hi and not (e in banded and seed in band_seeds)]
        best_of[label], settled[label] = best, by_seed
      break
  moved = [Trial(target, best_of[source], 0) for source, targets in (transfer or {}).items()
           if source in best_of for target in targets]
  trials = list(dict.fromkeys(stage1 + stage2 + around))
  trials += [t for t in dict.fromkeys(moved) if t not in trials]
  if band_seeds:  # the rates outside the search that land in its band: their seeds too
    trials += [t for t in dict.fromkeys(_off_search_band_seeds(trials, settled, loss,
                                                               band_seeds))
               if t not in trials]
  return trials


def _off_search_band_seeds(trials: Sequence[Trial], settled: Mapping[str, Mapping],
                           loss: Callable[[Trial], float | None],
                           band_seeds: Sequence[int]) -> list[Trial]:
  """`band_seeds` at every rate a settled label ran outside its search (a window or
  transfer trial, seed 0) whose loss lands in the search's near-best band.

  A study reads every rate a label ran (attnscale/studies/transfer.py), and a rate
  with seed 0 alone that is within the band's margin of the best cannot be shown
  worse, so it is in the study's band: the protocol's 3 seeds there too. These
  seeds do not move the search's best (it reads only its own trials); a study that
  finds its best there says so. Once asked for, they stay asked for (the list only
  grows as runs finish): decided on seed 0's loss, kept once any of them finishes.
  """
  from attnscale.experiments import stats
  out = []
  for t in trials:
    if t.seed != 0 or t.label not in settled or t.exponent in settled[t.label]:
      continue
    first = loss(t)
    if first is None or not math.isfinite(first):
      continue
    extra = [Trial(t.label, t.exponent, seed) for seed in band_seeds]
    if any(loss(e) is not None for e in extra) or t.exponent in stats.near_best_band(
        {**settled[t.label], t.exponent: {0: first}}).rates:
      out += extra
  return out


def points(preset: str, labels: Mapping[str, tuple[str, dict]], starts: Mapping[str, int],
           workdir: str | None, *, bounds: tuple[int, int] = (3, 12),
           more_seeds: Sequence[int] = (1, 2), band_seeds: Sequence[int] = (),
           transfer: Mapping[str, Sequence[str]] | None = None,
           no_learning: float | None = None, window: int = 0,
           window_seeds: Sequence[int] = (), eval_flags: Sequence[str] = (),
           declared: Mapping[str, str] | None = None) -> list[dict]:
  """`search` as sweep points (`attnscale.experiments.sweeps`), reading the
  finished runs in `workdir` (None: nothing has run, stage 1's first trials);
  `eval_flags`: eval.py's flags every point is evaluated with after training.

  Args:
    preset: the config argument's preset.
    labels: label -> (the config argument's scaling, field overrides): one search
      each.
    starts: label -> the exponent its search starts at.
    declared: search label -> the label its runs declare (config.label) where they
      differ: a search per width, "sp_adam_standard@256", declares
      "sp_adam_standard" (its width is a field of the run). Default: the search's.
  """
  from attnscale.experiments import run_records, sweeps

  def point(t: Trial) -> dict:
    scaling, overrides = labels[t.label]
    return {"arg": f"preset={preset},scaling={scaling},seed={t.seed}",
            "overrides": {"learning_rate": t.learning_rate, **overrides},
            "label": (declared or {}).get(t.label, t.label),
            **({"eval": list(eval_flags)} if eval_flags else {})}

  def loss(t: Trial) -> float | None:
    if workdir is None:
      return None
    p = point(t)
    row = run_records.read_run(os.path.join(workdir, sweeps.Point(
        p["arg"], tuple(sorted(p["overrides"].items()))).name))
    if row is None or row["status"] not in ("done", "diverged"):
      return None
    return row["final_train_loss"] if row["status"] == "done" else math.nan

  return [point(t) for t in search({label: starts[label] for label in labels}, loss,
                                   bounds=bounds, more_seeds=more_seeds,
                                   band_seeds=band_seeds, transfer=transfer,
                                   no_learning=no_learning, window=window,
                                   window_seeds=window_seeds)]
