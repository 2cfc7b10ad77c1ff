"""Comparisons between runs: the one place where attnscale decides what is noise.

Losses are final training losses in nats, one per seed; lower is better. With
the 2-3 seeds a sweep can afford, the normal approximation (z = 1.96) is far
too confident: the 97.5% point of Student's t is 12.71 with 2 seeds (1 degree of
freedom) and 4.30 with 3, so every interval here uses t.

    t_quantile(p, df)          Student's t quantile (student_t.py: no scipy, the incomplete
                               beta inverted)
    mean_interval(values)      mean with its 95% t-interval
    compare(a_by_seed, b_by_seed)
                               b - a: paired by seed where the labels share seeds,
                               Welch where they do not; interval, df and a verdict
    compare_summaries(...)     Welch from means and standard errors (nothing to pair)
    near_best_band(losses)     the rates that could still be the best (they need seeds)
    tie_set(losses)            the best rate and the rates whose paired difference from it
                               covers 0
    robust_compare(a, b)       a verdict that holds for every pairing of two tie sets, else
                               "depends on the rate chosen"
    holm(p_values)             Holm-Bonferroni adjusted p over a family of comparisons
    parabola_vertex(losses)    the interpolated best log2 rate of one sweep line
    best_rate_slope(sweep)     slope of log2(best rate) on log2(size), bootstrap interval

Sources: Student (1908); Welch (1947) and Satterthwaite (1946) for unequal
variances; Press et al., Numerical Recipes 3rd ed. section 6.4 (the regularised
incomplete beta by Lentz's continued fraction); Efron & Tibshirani, An
Introduction to the Bootstrap (1993), ch. 13 (percentile intervals); Holm,
"A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6
(1979) 65-70.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from attnscale.experiments.student_t import t_quantile, t_tail

LEVEL = 0.95  # every interval and verdict: two-sided 95%
# Nats: the near-best margin where there are not yet the seeds to measure noise.
# The width study's band (studies/width.py BAND); its best points' two seeds agree
# within 0.025 nats (half-range) away from the edge of stability (docs/experiments/width.md).
BAND_NATS = 0.02
MIN_SEEDS = 3  # seeds the protocol runs at every near-best rate
RESAMPLES = 2000  # bootstrap resamples of best_rate_slope
TOO_FEW = "too few seeds"
DEPENDS = "depends on the rate chosen"


# ---------------------------------------------------------------------------
# Student's t (its quantile and tail: attnscale/experiments/student_t.py).

def t_multiplier(df: float, level: float = LEVEL) -> float:
  """The half-width of a two-sided `level` interval in standard errors: t_{(1+level)/2, df}."""
  return t_quantile(0.5 + 0.5 * level, df)


# ---------------------------------------------------------------------------
# A mean and a comparison.

@dataclasses.dataclass(frozen=True)
class Interval:
  """A mean with its two-sided t-interval: mean +- t_{0.975, n-1} s / sqrt(n)."""

  mean: float
  lo: float  # NaN with fewer than 2 values
  hi: float
  n: int
  df: float  # n - 1

  @property
  def half(self) -> float:
    return self.hi - self.mean

  def format(self, fmt: str = ".3f") -> str:
    """One table cell: "mean [lo, hi]" (each by `fmt`), the mean alone for one value,
    "" for none."""
    if self.n == 0:
      return ""
    return (format(self.mean, fmt) if self.n < 2 else
            f"{self.mean:{fmt}} [{self.lo:{fmt}}, {self.hi:{fmt}}]")


def _finite(values: Iterable[float]) -> list[float]:
  return [float(v) for v in values if math.isfinite(v)]


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample variance (n - 1; NaN for one value)."""
  n = len(values)
  mean = sum(values) / n
  var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else math.nan
  return mean, var


def mean_interval(values: Iterable[float], level: float = LEVEL) -> Interval:
  """The mean of the finite `values` and its t-interval (NaN ends with fewer than 2).

  Non-finite values (a diverged run's NaN) are left out: say so where it matters.
  """
  values = _finite(values)
  if not values:
    return Interval(math.nan, math.nan, math.nan, 0, math.nan)
  mean, var = _mean_var(values)
  n = len(values)
  if n < 2:
    return Interval(mean, math.nan, math.nan, n, math.nan)
  half = t_multiplier(n - 1, level) * math.sqrt(var / n)
  return Interval(mean, mean - half, mean + half, n, n - 1)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """b against a: `effect` = b - a in nats of loss (positive: b is worse).

  Paired: effect = mean over shared seeds s of (b_s - a_s), interval
  effect +- t_{0.975, n-1} sd(b_s - a_s) / sqrt(n), n = shared seeds.
  Welch: effect = mean(b) - mean(a), interval effect +- t_{0.975, df} se with
  se^2 = s_a^2 / n_a + s_b^2 / n_b and the Welch-Satterthwaite
  df = se^4 / ((s_a^2/n_a)^2 / (n_a-1) + (s_b^2/n_b)^2 / (n_b-1)).
  verdict: "better" (b lower: the interval lies below 0), "worse" (above 0),
  "within noise" (it covers 0), or "too few seeds" (no spread to judge by).
  """

  effect: float
  lo: float
  hi: float
  df: float
  n: int  # pairs (paired), or seeds of a + seeds of b (welch, "none")
  method: str  # "paired", "welch", or "none" (too few seeds for either)
  verdict: str
  n_a: int = 0  # seeds of a that entered
  n_b: int = 0
  unpaired: int = 0  # paired only: seeds of one label only, left out

  @property
  def p(self) -> float:
    """The two-sided p-value of effect = 0 under the same t: 2 P(T_df > |effect| / se),
    se = half-width / t_{0.975, df}; NaN without an interval. A zero-width interval
    (every pair differing by the same amount) gives 0 unless the effect is 0."""
    if self.method == "none" or not math.isfinite(self.df):
      return math.nan
    half = self.hi - self.effect
    if half <= 0:
      return 1.0 if self.effect == 0 else 0.0
    se = half / t_multiplier(self.df)
    return min(1.0, 2.0 * t_tail(abs(self.effect) / se, self.df))

  def read(self, higher_is_better: bool = False) -> str:
    """The verdict; for a measure where higher is better (accuracy) compare's "worse"
    (b higher than a) reads "better", and "better" reads "worse"."""
    if not higher_is_better:
      return self.verdict
    return {"worse": "better", "better": "worse"}.get(self.verdict, self.verdict)

  def format(self, verdict: bool = True, higher_is_better: bool = False) -> str:
    """One table cell: "+0.080 [+0.052, +0.108] paired n=3: worse" (`read`'s verdict)."""
    if self.method == "none":
      text = (f"{self.effect:+.3f} n={self.n_a}+{self.n_b}" if math.isfinite(self.effect)
              else f"n={self.n_a}+{self.n_b}")
    else:
      n = f"n={self.n}" if self.method == "paired" else f"n={self.n_a}+{self.n_b}"
      text = f"{self.effect:+.3f} [{self.lo:+.3f}, {self.hi:+.3f}] {self.method} {n}"
      if self.unpaired:
        text += f" ({self.unpaired} unpaired left out)"
    return f"{text}: {self.read(higher_is_better)}" if verdict else text


def verdict_of(lo: float, hi: float) -> str:
  """The verdict on an interval of b - a where lower is better: "worse" above 0,
  "better" below, "within noise" covering it (the one rule every page's words use)."""
  if lo > 0:
    return "worse"
  if hi < 0:
    return "better"
  return "within noise"


def format_interval(values: Iterable[float], fmt: str = ".3f") -> str:
  """The finite `values`' mean and 95% t-interval as one table cell (`Interval.format`)."""
  return mean_interval(values).format(fmt)


def compare(a_by_seed: Mapping[Hashable, float], b_by_seed: Mapping[Hashable, float],
            level: float = LEVEL) -> Comparison:
  """b against a, from {seed: loss} of each; `effect` = b - a (positive: b is worse).

  Runs with the same seed share their initialisation and data order, so their
  losses move together; the difference per seed cancels that shared part, which
  an unpaired test counts as noise. So:

  * The labels share >= 2 seeds: paired, on the shared seeds only. Seeds that
    only one label has are left out (counted in `unpaired`): mixing them in
    would need a model of how paired and unpaired draws combine, and the
    protocol gives both labels the same seeds. The effect is then the mean of the
    per-seed differences, which can differ from the difference of all-seed means.
  * Otherwise, each has >= 2 seeds: Welch's unequal-variance t on all seeds,
    with the Welch-Satterthwaite degrees of freedom.
  * Otherwise: method "none", verdict "too few seeds" (never a z = 1.96 guess).

  Non-finite losses (diverged runs) are left out first. The verdict is a
  two-sided test at `level`: "better" or "worse" when the interval excludes 0.
  """
  a = {s: float(v) for s, v in a_by_seed.items() if math.isfinite(v)}
  b = {s: float(v) for s, v in b_by_seed.items() if math.isfinite(v)}
  shared = [s for s in a if s in b]
  if len(shared) >= 2:
    diffs = [b[s] - a[s] for s in shared]
    mean, var = _mean_var(diffs)
    n = len(diffs)
    half = t_multiplier(n - 1, level) * math.sqrt(var / n)
    unpaired = len(a) + len(b) - 2 * n
    return Comparison(mean, mean - half, mean + half, n - 1, n, "paired",
                      verdict_of(mean - half, mean + half), n, n, unpaired)
  if len(a) >= 2 and len(b) >= 2:
    (mean_a, var_a), (mean_b, var_b) = _mean_var(list(a.values())), _mean_var(list(b.values()))
    return compare_summaries(mean_a, math.sqrt(var_a / len(a)), len(a),
                             mean_b, math.sqrt(var_b / len(b)), len(b), level)
  effect = (sum(b.values()) / len(b) - sum(a.values()) / len(a)) if a and b else math.nan
  return Comparison(effect, math.nan, math.nan, math.nan, len(a) + len(b), "none", TOO_FEW,
                    len(a), len(b))


def compare_summaries(mean_a: float, se_a: float, n_a: int, mean_b: float, se_b: float,
                      n_b: int, level: float = LEVEL) -> Comparison:
  """b against a by Welch's t from each side's mean, standard error and seed count,
  for when the per-seed losses are not at hand (so nothing can be paired: prefer
  `compare`). `effect` = mean_b - mean_a; "too few seeds" when a side has < 2.
  """
  if n_a < 2 or n_b < 2 or not (math.isfinite(se_a) and math.isfinite(se_b)):
    return Comparison(mean_b - mean_a, math.nan, math.nan, math.nan, n_a + n_b, "none",
                      TOO_FEW, n_a, n_b)
  va, vb = se_a ** 2, se_b ** 2
  se2 = va + vb
  df = (se2 ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1)) if se2 > 0
        else n_a + n_b - 2)  # no spread at all: the pooled df, a zero-width interval
  effect = mean_b - mean_a
  half = t_multiplier(df, level) * math.sqrt(se2)
  return Comparison(effect, effect - half, effect + half, df, n_a + n_b, "welch",
                    verdict_of(effect - half, effect + half), n_a, n_b)


# ---------------------------------------------------------------------------
# The near-best band.

@dataclasses.dataclass(frozen=True)
class Band:
  """The rates that could be the best: `best` (lowest seed mean), `rates` (the
  band, ascending, the best included) and `short` (the band's rates with fewer
  than `min_seeds` seeds: what still has to run)."""

  best: float
  rates: tuple[float, ...]
  short: tuple[float, ...]


def near_best_band(losses: Mapping[float, Mapping[Hashable, float]], *,
                   nats: float = BAND_NATS, min_seeds: int = MIN_SEEDS,
                   level: float = LEVEL) -> Band:
  """The rates whose loss could be the best's, from {rate: {seed: loss}}.

  The best rate is the one with the lowest seed mean. A best chosen on one seed
  is a draw: a rate whose loss is within noise of it may be the real best, so
  the protocol runs >= `min_seeds` seeds at every rate of this band (`short`
  lists those that still lack them) and then asks again. A rate is in the band
  when it is not measurably worse than the best:

  * where seeds allow a comparison (`compare(best, rate)`: >= 2 shared seeds,
    or >= 2 each), its verdict is not "worse" at `level`;
  * where they do not (one seed on a side, the search's stage 1), its seed mean
    is within `nats` of the best's. The default, 0.02 nats, is the width study's
    band; the two seeds at its best points agree within 0.025 nats (half-range)
    away from the edge of stability, so a single-seed gap smaller than that is
    not evidence.

  A rate with any diverged seed (a non-finite loss) is never in the band: the
  best rate must train on every seed. `rates` may be a rate or its log2, as the
  caller keys them.

  Raises:
    ValueError: no rate has every seed finite.
  """
  means, seeds = {}, {}
  for rate, by_seed in losses.items():
    values = list(by_seed.values())
    if values and all(math.isfinite(v) for v in values):
      means[rate], seeds[rate] = sum(values) / len(values), by_seed
  if not means:
    raise ValueError("near_best_band: no rate with every seed finite (all diverged?)")
  best = min(means, key=lambda r: (means[r], r))
  band = []
  for rate in sorted(means):
    c = compare(seeds[best], seeds[rate], level)
    if rate == best or (c.verdict != "worse" if c.method != "none"
                        else means[rate] - means[best] <= nats):
      band.append(rate)
  return Band(best, tuple(band), tuple(r for r in band if len(seeds[r]) < min_seeds))


# ---------------------------------------------------------------------------
# The best rate and how it moves with size.

def parabola_vertex(losses: Mapping[float, float]) -> tuple[float, float]:
  """(grid best, interpolated best) of {log2 rate: loss}; NaN, NaN when all diverged.

  The grid best is the lowest finite loss (a tie: the smaller rate). Interpolated:
  the vertex of the parabola through it and its two neighbours on the grid,
      x* = x0 - ((x0-x1)^2 (y0-y2) - (x0-x2)^2 (y0-y1))
               / (2 ((x0-x1)(y0-y2) - (x0-x2)(y0-y1))),
  which for neighbours one step h away is x0 + h/2 (y1 - y2) / (y1 - 2 y0 + y2).
  Kept within the neighbours; the grid best itself when a neighbour is missing
  or diverged (no bracket) or the three are not convex.
  """
  xs = sorted(losses)
  finite = [x for x in xs if math.isfinite(losses[x])]
  if not finite:
    return math.nan, math.nan
  x0 = min(finite, key=lambda x: (losses[x], x))
  i = xs.index(x0)
  if i == 0 or i == len(xs) - 1:
    return x0, x0
  x1, x2 = xs[i - 1], xs[i + 1]
  y0, y1, y2 = losses[x0], losses[x1], losses[x2]
  if not (math.isfinite(y1) and math.isfinite(y2)):
    return x0, x0
  curvature = ((y2 - y0) / (x2 - x0) - (y0 - y1) / (x0 - x1)) / (x2 - x1)
  if curvature <= 0:
    return x0, x0
  num = (x0 - x1) ** 2 * (y0 - y2) - (x0 - x2) ** 2 * (y0 - y1)
  den = 2 * ((x0 - x1) * (y0 - y2) - (x0 - x2) * (y0 - y1))
  return x0, float(np.clip(x0 - num / den, x1, x2))


@dataclasses.dataclass(frozen=True)
class Slope:
  """log2(best rate) = slope * log2(size) + intercept, with a bootstrap interval.

  `best`: size -> (grid, interpolated) best log2 rate on the seed means;
  `best_lo`/`best_hi`: each size's percentile interval of the interpolated best.
  `resamples` were drawn; `used` gave a fit (>= 2 sizes with a finite best).
  """

  slope: float
  intercept: float
  lo: float
  hi: float
  resamples: int
  used: int
  best: dict
  best_lo: dict
  best_hi: dict


def _best_by_size(means: Mapping[float, Mapping[float, float]]) -> dict:
  return {x: parabola_vertex(by_rate) for x, by_rate in means.items()}


def _fit(points: Mapping[float, float]) -> tuple[float, float]:
  """Least squares of y on log2(x) over the finite points: (slope, intercept)."""
  xs = [x for x, y in points.items() if math.isfinite(y)]
  if len(xs) < 2:
    return math.nan, math.nan
  slope, intercept = np.polyfit(np.log2(xs), [points[x] for x in xs], 1)
  return float(slope), float(intercept)


def _resampled_means(values: Sequence[float], resamples: int, rng) -> np.ndarray:
  """`resamples` means of n draws with replacement from the n `values`, recentred
  and widened by sqrt(n / (n - 1)) first: a plain resample's mean has variance
  (n - 1)/n s^2/n, half the unbiased s^2/n at n = 2 (Davison & Hinkley 1997,
  sec. 2.3 and 3.3: the adjusted bootstrap)."""
  v_S = np.asarray(values, float)
  n = len(v_S)
  if n > 1:
    mean = v_S.mean()
    v_S = mean + math.sqrt(n / (n - 1)) * (v_S - mean)
  return v_S[rng.integers(0, n, (resamples, n))].mean(axis=1)


def best_rate_slope(sweep: Iterable[tuple[float, float, Hashable, float]], *,
                    resamples: int = RESAMPLES, seed: int = 0,
                    level: float = LEVEL) -> Slope:
  """How the best learning rate moves with size, and how sure that is.

  `sweep`: rows (x, log2 rate, seed, loss), x a size (width, depth). Per x the
  best log2 rate is `parabola_vertex` of the seed-mean loss at each rate (a rate
  whose mean is NaN diverged); then log2(best) = slope * log2(x) + intercept
  by least squares (0: the rate transfers; -1: it falls as 1/x).

  The interval: a bootstrap over seeds (Efron & Tibshirani ch. 13). Each
  resample draws, independently for every (x, rate) point, as many of that
  point's seeds as it has, with replacement (from the seeds widened by
  sqrt(n / (n - 1)) about their mean, so that a resampled mean has the
  unbiased variance s^2 / n: `_resampled_means`); re-finds every x's best on
  the resampled means; refits. The `level` interval is the percentiles
  (1-level)/2 and (1+level)/2 of the `resamples` slopes (2000 by default; the
  same `seed`, the same interval).

  How far to trust it: on synthetic sweeps (4 sizes, 12 rates, Gaussian seed
  noise of 0.02 nats, 300 resamples; tests/test_stats.py) a 95% interval covered
  the true slope in 88% of 100 sweeps with 2 seeds per point, 92% with 3 and 96% with 5
  (without the widening: 77%, 85%, 93%). A bootstrap of 2-3 values cannot know
  the tails of the noise, so with 2-3 seeds read it as roughly a 90% interval.
  Independent draws per point ignore that seeds are shared across rates. A
  point with one seed always resamples to itself: the interval knows only the
  noise of points with seeds, which is why the protocol puts >= 3 seeds on
  every near-best rate (`near_best_band`).

  Raises:
    ValueError: fewer than 2 sizes with a finite best rate (no slope).
  """
  grouped: dict[tuple[float, float], list[float]] = {}
  for x, log2_lr, _, loss in sweep:
    grouped.setdefault((x, float(log2_lr)), []).append(float(loss))
  keys = sorted(grouped)

  def best_of(point_means):
    by_size: dict[float, dict[float, float]] = {}
    for (x, rate), m in zip(keys, point_means):
      by_size.setdefault(x, {})[rate] = m
    return _best_by_size(by_size)

  best = best_of([float(np.mean(grouped[k])) for k in keys])
  slope, intercept = _fit({x: interp for x, (_, interp) in best.items()})
  if not math.isfinite(slope):
    raise ValueError(f"best_rate_slope needs 2 sizes with a finite best rate, got "
                     f"{sum(math.isfinite(i) for _, i in best.values())}")
  rng = np.random.default_rng(seed)
  # (resamples, points): each point's resampled seed mean, drawn point by point.
  means_RP = np.stack([_resampled_means(grouped[k], resamples, rng) for k in keys], axis=1)
  slopes, per_size = [], {x: [] for x in best}
  for row in means_RP:
    b = best_of(row.tolist())
    for x, (_, interp) in b.items():
      per_size[x].append(interp)
    slopes.append(_fit({x: interp for x, (_, interp) in b.items()})[0])
  q = (50 * (1 - level), 50 * (1 + level))
  finite = [s for s in slopes if math.isfinite(s)]
  lo, hi = np.percentile(finite, q) if finite else (math.nan, math.nan)

  def ends(values):
    values = [v for v in values if math.isfinite(v)]
    return tuple(float(e) for e in np.percentile(values, q)) if values else (math.nan,) * 2

  intervals = {x: ends(v) for x, v in per_size.items()}
  return Slope(slope, intercept, float(lo), float(hi), resamples, len(finite), best,
               {x: e[0] for x, e in intervals.items()}, {x: e[1] for x, e in intervals.items()})


# ---------------------------------------------------------------------------
# Verdicts that survive the choice of a best rate, and a family of comparisons.

def tie_set(losses: Mapping[float, Mapping[Hashable, float]], best: float | None = None,
            level: float = LEVEL) -> tuple[float, ...]:
  """The rates tied with the best: `best` (default: the lowest seed mean among the
  rates with every seed finite) and each rate whose paired difference from it,
  `compare(best, rate)`, covers 0. A rate that shares fewer than 2 seeds with the
  best (nothing to pair) is left out: a tie needs the evidence of a tie. Ascending.

  This is the set a verdict must survive (`robust_compare`): with 3 seeds, two
  rates a factor 2 apart are often within noise of each other, and a verdict that
  holds at one and not the other is the choice of rate speaking, not the labels.
  """
  finite = {r: s for r, s in losses.items()
            if s and all(math.isfinite(v) for v in s.values())}
  if best is None:
    if not finite:
      raise ValueError("tie_set: no rate with every seed finite (all diverged?)")
    best = min(finite, key=lambda r: (sum(finite[r].values()) / len(finite[r]), r))
  ties = [best]
  for rate, by_seed in finite.items():
    if rate == best:
      continue
    c = compare(losses[best], by_seed, level)
    if c.method == "paired" and c.lo <= 0 <= c.hi:
      ties.append(rate)
  return tuple(sorted(ties))


@dataclasses.dataclass(frozen=True)
class Robust:
  """b against a over every pairing of a's and b's tie sets (`tie_set`).

  verdict: the one verdict every pairing gives, or DEPENDS when they differ (a
  pairing with too few seeds counts as differing); `pairs`: ((rate_a, rate_b),
  Comparison) for each; lo/hi: the smallest lower and largest upper end over them.
  """

  verdict: str
  pairs: tuple
  lo: float
  hi: float

  def read(self, higher_is_better: bool = False) -> str:
    if not higher_is_better:
      return self.verdict
    return {"worse": "better", "better": "worse"}.get(self.verdict, self.verdict)

  def format(self, higher_is_better: bool = False) -> str:
    """One table cell: "worse (4 pairings)"; "depends on the rate chosen (worse 1,
    within noise 3)" (each verdict's count of pairings); the verdict alone for one
    pairing."""
    n = len(self.pairs)
    if self.verdict != DEPENDS:
      return self.read(higher_is_better) + (f" ({n} pairings)" if n > 1 else "")
    words = [c.read(higher_is_better) for _, c in self.pairs]
    counts = ", ".join(f"{w} {words.count(w)}" for w in sorted(set(words)))
    return f"{DEPENDS} ({counts})"


def robust_compare(a: Mapping[float, Mapping[Hashable, float]],
                   b: Mapping[float, Mapping[Hashable, float]],
                   a_rates: Iterable[float], b_rates: Iterable[float],
                   level: float = LEVEL) -> Robust:
  """b against a at every pairing of `a_rates` x `b_rates` (their tie sets), from
  {rate: {seed: value}} of each: a finding only where every pairing agrees."""
  pairs = tuple(((ra, rb), compare(a[ra], b[rb], level))
                for ra in a_rates for rb in b_rates)
  if not pairs:
    raise ValueError("robust_compare: empty tie set")
  verdicts = {c.verdict for _, c in pairs}
  verdict = verdicts.pop() if len(verdicts) == 1 else DEPENDS
  if verdict == TOO_FEW and len(pairs) > 1:
    verdict = DEPENDS
  los = [c.lo for _, c in pairs if math.isfinite(c.lo)]
  his = [c.hi for _, c in pairs if math.isfinite(c.hi)]
  return Robust(verdict, pairs, min(los) if los else math.nan, max(his) if his else math.nan)


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm-Bonferroni adjusted p-values, in the order given (NaN stays NaN and is not
  counted in the family).

  Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max over j <= i of
  min(1, (m - j + 1) p_(j)). Rejecting where the adjusted p < 1 - LEVEL keeps the
  chance of any false "better"/"worse" in the family at most 1 - LEVEL under any
  dependence between the comparisons (Holm 1979), which matters here: every
  comparison of a study shares its baseline's runs.
  """
  idx = sorted((i for i, p in enumerate(p_values) if math.isfinite(p)),
               key=lambda i: p_values[i])
  m = len(idx)
  out = [math.nan] * len(p_values)
  running = 0.0
  for rank, i in enumerate(idx):
    running = max(running, min(1.0, (m - rank) * p_values[i]))
    out[i] = running
  return out


def holm_verdict(c: Comparison, adjusted_p: float, higher_is_better: bool = False) -> str:
  """The verdict of `c` where its Holm-adjusted p is below 1 - LEVEL, else "within
  noise" (family-wise); TOO_FEW where `c` has no interval."""
  if c.method == "none" or not math.isfinite(adjusted_p):
    return TOO_FEW
  return c.read(higher_is_better) if adjusted_p < 1 - LEVEL else "within noise"


def resolution(comparisons: Iterable[Comparison]) -> float:
  """The smallest difference a design resolves: the median half-width of its
  comparisons' intervals (NaN without any)."""
  halves = sorted(c.hi - c.effect for c in comparisons
                  if c.method != "none" and math.isfinite(c.hi))
  if not halves:
    return math.nan
  mid = len(halves) // 2
  return halves[mid] if len(halves) % 2 else 0.5 * (halves[mid - 1] + halves[mid])
