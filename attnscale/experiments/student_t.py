"""Student's t without scipy: its upper tail through the regularised incomplete
beta, and its quantile by bisection on that tail.

    incomplete_beta(x, a, b)   I_x(a, b), Lentz's continued fraction (NR 6.4)
    t_tail(t, df)              P(T > t); df may be fractional (Welch's)
    t_quantile(p, df)          t with P(T <= t) = p: 12.706 at (0.975, 1), 4.303 at (0.975, 2)

attnscale/experiments/stats.py builds its intervals on these (and re-exports
them). Sources: Student (1908); Press et al., Numerical Recipes 3rd ed. section
6.4; Abramowitz & Stegun 26.7.1 and 26.5.27.
"""

from __future__ import annotations

import math


def _betacf(a: float, b: float, x: float) -> float:
  """The continued fraction of the incomplete beta (Numerical Recipes' betacf,
  modified Lentz): converges fast for x < (a + 1) / (a + b + 2)."""
  tiny, eps = 1e-300, 1e-15
  qab, qap, qam = a + b, a + 1.0, a - 1.0
  c, d = 1.0, 1.0 - qab * x / qap
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, 1000):
    m2 = 2 * m
    for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
               -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
      d = 1.0 + aa * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + aa / c
      c = c if abs(c) > tiny else tiny
      h *= d * c
    if abs(d * c - 1.0) < eps:
      break
  return h


def incomplete_beta(x: float, a: float, b: float) -> float:
  """The regularised incomplete beta I_x(a, b) = B(x; a, b) / B(a, b), 0 <= x <= 1.

  I_x(a, b) = x^a (1-x)^b / (a B(a, b)) * betacf(a, b, x), using the symmetry
  I_x(a, b) = 1 - I_{1-x}(b, a) where the fraction converges slowly (NR 6.4).
  """
  if x <= 0.0:
    return 0.0
  if x >= 1.0:
    return 1.0
  front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                   + a * math.log(x) + b * math.log1p(-x))
  if x < (a + 1.0) / (a + b + 2.0):
    return front * _betacf(a, b, x) / a
  return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_tail(t: float, df: float) -> float:
  """P(T > t) for Student's t with `df` degrees of freedom (df may be fractional,
  as Welch's is; math.inf gives the normal tail).

  For t >= 0, P(T > t) = I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 (Abramowitz &
  Stegun 26.7.1, through 26.5.27).
  """
  if math.isinf(df):
    return 0.5 * math.erfc(t / math.sqrt(2.0))
  tail = 0.5 * incomplete_beta(df / (df + t * t), 0.5 * df, 0.5)
  return tail if t >= 0 else 1.0 - tail


def t_quantile(p: float, df: float) -> float:
  """The p quantile of Student's t with `df` degrees of freedom: t with P(T <= t) = p.

  Bisection on the upper tail `t_tail` (monotone, so it always converges; a
  tail probability avoids the cancellation of 1 - CDF near p = 1), to 1e-12
  relative. t_quantile(0.975, 1) = 12.706, (0.975, 2) = 4.303, (0.975, 4) = 2.776,
  (0.975, 9) = 2.262, (0.975, inf) = 1.960.

  Raises:
    ValueError: p outside (0, 1) or df not positive.
  """
  if not 0.0 < p < 1.0:
    raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
  if not df > 0:
    raise ValueError(f"t_quantile: df must be positive, got {df}")
  if p == 0.5:
    return 0.0
  if p < 0.5:
    return -t_quantile(1.0 - p, df)
  if df > 1e7:  # the beta's parameters lose precision; t is normal to 1e-7 there
    df = math.inf
  tail = 1.0 - p
  lo, hi = 0.0, 1.0
  while t_tail(hi, df) > tail:
    lo, hi = hi, 2.0 * hi
  while hi - lo > 1e-12 * hi:
    mid = 0.5 * (lo + hi)
    if t_tail(mid, df) > tail:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)
