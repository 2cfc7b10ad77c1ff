"""Key-norm simulations: the distribution of one key's attention weight per scaling.

Bernhard 2023, "Scaling dot-product attention by the sum of key norms" (arXiv
2311.09406), simulations: q and k components iid N(0, 1), 32 keys drawn once
and shared by all queries, d = 16 and 256, 500 queries; a kernel density
estimate of the first key's attention weight across the queries, for the raw
dot products q.k_0, softmax(q.k), softmax(q.k / sqrt(d)) and softmax(q.k /
sum_j ||k_j||). The claim: dividing by the sum of key norms keeps the
(Gaussian) shape of the raw dot products, while 1/sqrt(d) gives a right-skewed
distribution (and the unscaled softmax saturates as d grows).

Why: with logits x_j = s q.k_j, the weight p_0 = e^{x_0} / sum_j e^{x_j}. Under
1/sqrt(d) the logits have std about 1, so p_0 is close to log-normal (skewed).
Under 1/sum ||k_j|| they have std about 1/n, the softmax is nearly linear,
p_0 ~ (1 + x_0 - mean_j x_j) / n, and its distribution is that of q.k_0: Gaussian.

The paper's open questions (other distributions, unequal key lengths) are
options of `sample_qk`: normal, uniform (unit variance), student_t (df),
nonzero_mean (N(mean, 1)), unequal_lengths (each key N(0, I) times a length
drawn uniformly from length_range). Every weight comes from
`attnscale.attention_weights` with a registered scaling.

Dimension legend: Q queries, S keys, D head dim.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from matplotlib import ticker

from attnscale.core import scalings
from attnscale.core.attention import attention_weights
from attnscale.experiments import reporting
from attnscale.studies import registry

DISTRIBUTIONS = ("normal", "uniform", "student_t", "nonzero_mean", "unequal_lengths")


@dataclasses.dataclass(frozen=True)
class Method:
  """One curve of the study: a registered scaling, and whether to show its
  logit (the raw dot product) or its softmax weight."""

  label: str
  scaling: str
  params: tuple[tuple[str, float], ...] = ()
  quantity: str = "weight"  # "weight" or "logit"

  def scale_fn(self):
    return scalings.get(self.scaling, **dict(self.params))


# Bernhard's four curves, then the paper's other proposals (mean key length,
# sums of powers of key lengths).
DEFAULT_METHODS = (
    Method("q.k (raw dot product)", "none", quantity="logit"),
    Method("softmax(q.k)", "none"),
    Method("softmax(q.k / sqrt(d))", "standard"),
    Method("softmax(q.k / sum ||k||)", "key_norm_sum"),
    Method("softmax(q.k n / sum ||k||)", "key_norm_mean"),
    Method("softmax(q.k / sum ||k||^0.5)", "key_norm_power", (("p", 0.5),)),
    Method("softmax(q.k / sum ||k||^2)", "key_norm_power", (("p", 2.0),)),
)


def sample_qk(key, dist: str = "normal", *, queries: int = 500, keys: int = 32, d: int = 16,
              df: float = 3.0, mean: float = 1.0,
              length_range: tuple[float, float] = (0.5, 2.0)):
  """Draws q [Q, D] and k [S, D] with iid components from `dist`.

  Args:
    key: a `jax.random.key`.
    dist: one of DISTRIBUTIONS. uniform is U(-sqrt(3), sqrt(3)) (variance 1);
      student_t has `df` degrees of freedom (variance df / (df - 2)); nonzero_mean
      is N(mean, 1); unequal_lengths draws N(0, 1) components and multiplies
      each key by a length from U(length_range) (queries stay N(0, 1)).
    queries, keys, d: Q, S, D.

  Returns:
    (q_QD, k_SD) float32.
  """
  if dist not in DISTRIBUTIONS:
    raise ValueError(f"dist must be one of {DISTRIBUTIONS}, got {dist!r}")
  kq, kk, kl = jax.random.split(key, 3)
  shapes = ((queries, d), (keys, d))
  if dist == "uniform":
    r = math.sqrt(3.0)
    q_QD, k_SD = (jax.random.uniform(k_, s, minval=-r, maxval=r) for k_, s in zip((kq, kk), shapes))
  elif dist == "student_t":
    q_QD, k_SD = (jax.random.t(k_, df, s) for k_, s in zip((kq, kk), shapes))
  else:
    q_QD, k_SD = (jax.random.normal(k_, s) for k_, s in zip((kq, kk), shapes))
  if dist == "nonzero_mean":
    q_QD, k_SD = q_QD + mean, k_SD + mean
  if dist == "unequal_lengths":
    lo, hi = length_range
    k_SD = k_SD * jax.random.uniform(kl, (keys, 1), minval=lo, maxval=hi)
  return q_QD, k_SD


# One compilation per (scaling, shape) instead of one per operation.
_attention_weights = jax.jit(attention_weights, static_argnames=("scale_fn",))


def first_key_values(q_QD, k_SD, method: Method) -> np.ndarray:
  """The first key's logit or attention weight for every query, [Q]."""
  logits, probs = _attention_weights(q_QD[None, :, None, :], k_SD[None, :, None, :],
                                     scale_fn=method.scale_fn())
  x_BNQS = logits if method.quantity == "logit" else probs
  return np.asarray(x_BNQS[0, 0, :, 0], np.float64)


def summary(x) -> dict[str, float]:
  """Mean, sd, skewness g1 and excess kurtosis g2 (moment estimators; 0 for a Gaussian)."""
  x = np.asarray(x, np.float64)
  centred = x - x.mean()
  sd = math.sqrt(np.mean(centred**2))
  if sd == 0:
    return {"mean": float(x.mean()), "sd": 0.0, "skewness": 0.0, "excess_kurtosis": 0.0}
  z = centred / sd
  return {"mean": float(x.mean()), "sd": sd, "skewness": float(np.mean(z**3)),
          "excess_kurtosis": float(np.mean(z**4) - 3)}


def silverman_bandwidth(x) -> float:
  """0.9 min(sd, IQR / 1.34) n^(-1/5): Silverman's rule of thumb (robust to outliers)."""
  x = np.asarray(x, np.float64)
  sd = x.std()
  iqr = np.subtract(*np.percentile(x, [75, 25]))
  spread = min(sd, iqr / 1.34) if iqr > 0 else sd
  if spread == 0:  # all values equal: any small width draws the spike.
    spread = max(abs(float(x.mean())), 1.0) * 1e-6
  return 0.9 * spread * len(x) ** -0.2


def gaussian_kde(x, grid, bandwidth: float | None = None) -> np.ndarray:
  """Kernel density estimate of the samples x on `grid` with a Gaussian kernel.

  density(g) = mean_i N(g; x_i, h^2), h = `bandwidth` or `silverman_bandwidth(x)`.
  """
  x = np.asarray(x, np.float64)
  grid = np.asarray(grid, np.float64)
  h = silverman_bandwidth(x) if bandwidth is None else bandwidth
  u = (grid[:, None] - x[None, :]) / h
  return np.exp(-0.5 * u**2).mean(axis=1) / (h * math.sqrt(2 * math.pi))


@dataclasses.dataclass(frozen=True)
class KeyNormResult:
  """The first key's value per query, per head dim and method.

  Attributes:
    values: d -> method label -> [queries] array.
    methods: the `Method`s, in plot order.
    dist, dist_params, seed, queries, keys: the simulation's parameters.
  """

  values: dict[int, dict[str, np.ndarray]]
  methods: tuple[Method, ...]
  dist: str
  dist_params: dict[str, float]
  seed: int
  queries: int
  keys: int

  @property
  def d_values(self) -> tuple[int, ...]:
    return tuple(self.values)

  def rows(self) -> list[dict]:
    rows = []
    for d, by_method in self.values.items():
      for m in self.methods:
        rows.append({"d": d, "method": m.label, "scaling": m.scaling,
                     **summary(by_method[m.label])})
    return rows


def key_norms(d_values: Sequence[int] = (16, 256), *, queries: int = 500, keys: int = 32,
              dist: str = "normal", seed: int = 0, methods: Sequence[Method] = DEFAULT_METHODS,
              **dist_params) -> KeyNormResult:
  """Bernhard's simulation: keys drawn once, shared by all queries, per head dim d.

  `dist_params` go to `sample_qk` (df, mean, length_range).
  """
  base = jax.random.key(seed)
  values = {}
  for d in d_values:
    q_QD, k_SD = sample_qk(jax.random.fold_in(base, d), dist, queries=queries, keys=keys, d=d,
                           **dist_params)
    values[int(d)] = {m.label: first_key_values(q_QD, k_SD, m) for m in methods}
  return KeyNormResult(values, tuple(methods), dist, dict(dist_params), seed, queries, keys)


def _describe(result: KeyNormResult) -> str:
  params = ", ".join(f"{k} = {v}" for k, v in result.dist_params.items())
  return result.dist + (f" ({params})" if params else "")


def plot_key_norms(result: KeyNormResult):
  """A KDE per method (columns) and d (rows), summary statistics in each panel,
  and a last column overlaying the standardised shapes against N(0, 1)."""
  methods = result.methods
  rows = len(result.d_values)
  fig = reporting.new_figure(2.3 * (len(methods) + 1), 2.9 * rows + 0.6)
  axes = np.asarray(fig.subplots(rows, len(methods) + 1, squeeze=False))
  z_grid = np.linspace(-4, 6, 400)
  for r, d in enumerate(result.d_values):
    shape_ax = axes[r, -1]
    for c, m in enumerate(methods):
      ax, x = axes[r, c], result.values[d][m.label]
      stats = summary(x)
      h = silverman_bandwidth(x)
      grid = np.linspace(x.min() - 3 * h, x.max() + 3 * h, 400)
      color = reporting.style(c)["color"]
      ax.hist(x, bins=30, density=True, color="0.85")
      ax.plot(grid, gaussian_kde(x, grid, h), color=color, lw=1.6)
      ax.text(0.97, 0.97, f"mean {stats['mean']:.3g}\nsd {stats['sd']:.3g}\n"
              f"skew {stats['skewness']:.2f}", transform=ax.transAxes, ha="right", va="top",
              fontsize=7, bbox=dict(boxstyle="round", fc="white", ec="0.7", alpha=0.9))
      ax.xaxis.set_major_locator(ticker.MaxNLocator(4))
      ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
      ax.tick_params(labelsize=7)
      ax.set_yticks([])
      if r == 0:
        ax.set_title(m.label, fontsize=8)
      if c == 0:
        ax.set_ylabel(f"d = {d}\ndensity")
      ax.set_xlabel("logit" if m.quantity == "logit" else "weight of key 0", fontsize=7)
      if stats["sd"] > 0:
        # Scott's bandwidth 1.06 sd n^(-1/5) (sd = 1 here): Silverman's IQR-based one
        # is near 0 for a saturated softmax and would draw noise.
        z = (x - stats["mean"]) / stats["sd"]
        shape_ax.plot(z_grid, gaussian_kde(z, z_grid, 1.06 * len(z) ** -0.2), color=color,
                      lw=1.2, label=m.label)
    shape_ax.plot(z_grid, np.exp(-z_grid**2 / 2) / math.sqrt(2 * math.pi), "k--", lw=1.2,
                  label="N(0, 1)")
    # A saturated softmax standardises to a spike; keep the Gaussian in view.
    shape_ax.set_ylim(0, 0.8)
    shape_ax.set_yticks([])
    shape_ax.set_xlabel("(x - mean) / sd", fontsize=7)
    shape_ax.tick_params(labelsize=7)
    if r == 0:
      shape_ax.set_title("standardised shapes", fontsize=8)
  fig.legend(handles=axes[-1, -1].get_lines(), loc="outside lower center",
             ncol=len(methods) + 1, fontsize=8)
  fig.suptitle(f"First key's attention weight across {result.queries} queries, {result.keys} "
               f"keys drawn once; q, k ~ {_describe(result)}, seed = {result.seed}.  Bernhard "
               "2023: 1/sum ||k|| keeps the Gaussian shape of q.k, 1/sqrt(d) is right-skewed",
               fontsize=9)
  return fig


# ---------------------------------------------------------------------------
# The command line: python -m attnscale.studies key_norms

def add_arguments(p) -> None:
  g = p.add_argument_group("key_norms")
  g.add_argument("--dims", type=int, nargs="+", default=[16, 256], help="head dims d")
  g.add_argument("--queries", type=int, default=500, help="queries")
  g.add_argument("--keys", type=int, default=32, help="keys (drawn once, shared)")
  g.add_argument("--dist", choices=DISTRIBUTIONS, default="normal",
                 help="distribution of the q and k components")
  g.add_argument("--df", type=float, default=3.0, help="student_t degrees of freedom")
  g.add_argument("--mean", type=float, default=1.0, help="nonzero_mean: the mean")
  g.add_argument("--length-range", type=float, nargs=2, default=[0.5, 2.0],
                 help="unequal_lengths: key lengths ~ U(lo, hi)")


def run_key_norms(a):
  params = {"student_t": {"df": a.df}, "nonzero_mean": {"mean": a.mean},
            "unequal_lengths": {"length_range": tuple(a.length_range)}}.get(a.dist, {})
  r = key_norms(a.dims, queries=a.queries, keys=a.keys, dist=a.dist, seed=a.seed,
                        **params)
  notes = [f"{r.keys} keys drawn once and shared by {r.queries} queries; q, k components "
           f"iid {a.dist}{' ' + str(params) if params else ''}, seed = {r.seed}.",
           "Statistics of the first key's logit (raw dot product) or attention weight across "
           "queries; skewness and excess kurtosis are 0 for a Gaussian."]
  return reporting.write_study(plot_key_norms(r), r.rows(), a.out, "key_norms",
                "Key-norm simulations (Bernhard 2023)", notes)


STUDY = registry.Study(run_key_norms, arguments=add_arguments)
