"""Output-scale study: how large is the attention output, per scaling, against n?

Graphcore Research, "Almost-scaled dot-product attention" (2023): with q, k, v
~ N(0, 1) and a softmax of temperature t (logits with std about 1/t), the
output z_i = sum_j p_ij v_j has std

    std(z) ~ sqrt(E[sum_j p_ij^2]) ~ sqrt(exp(t^-2) / n)

for n keys: 0.103 at n = 256 for standard attention (t = 1 at d = 64), so
multiplying by sqrt(n/e) ("fully scaled") gives std about 1. The approximation
(log-normal weights, large n) holds for t near 1 and above; as t -> 0 the
softmax becomes one-hot and std(z) -> 1, while the formula diverges.

`output_scale` measures std(z) for every registered scaling, bidirectional (n
keys) and causal (query i sees n_i = i + 1 keys: per position and pooled over a
sequence); `temperature_sweep` divides the logits by t and compares with the
formula. Both call `attnscale.core.attention` and the registry's scalings.

Dimension legend: B batch, T queries, S keys, N heads, H head dim; X the
sweep's values (n or t).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnscale.core import scalings
from attnscale.core.attention import attention, attention_weights
from attnscale.experiments import reporting
from attnscale.studies import registry

DEFAULT_N = tuple(2**i for i in range(4, 13))  # 16 ... 4096
DEFAULT_TEMPERATURES = tuple(float(2.0**(i / 2)) for i in range(-8, 9))  # 2^-4 ... 2^4


def graphcore_theory(n, t=1.0):
  """sqrt(exp(t^-2) / n): Graphcore's output std for n keys at temperature t."""
  return np.sqrt(np.exp(np.asarray(t, float)**-2) / np.asarray(n, float))


def standard_theory(n):
  """sqrt(min(1, e/n)): Graphcore's rule at t = 1, capped at 1 (a convex
  combination of unit-variance values never has std above 1; at n = 1 it is 1)."""
  return np.sqrt(np.minimum(1.0, math.e / np.asarray(n, float)))


# The prediction for each scaling that has one at q, k, v ~ N(0, 1), d >= 16.
# fully_scaled: standard times max(1, sqrt(n/e)); unit_scaled: built to be 1.
THEORY = {
    "standard": standard_theory,
    "fully_scaled": lambda n: np.ones_like(np.asarray(n, float)),
    "unit_scaled": lambda n: np.ones_like(np.asarray(n, float)),
}


def default_scalings() -> dict[str, scalings.ScaleFn]:
  """Every registered scaling with its default parameters, by name.

  cosine's default temperature is Henry et al.'s initial g0 = log2(S^2 - S) for
  S keys; key_norm_power's default p is 2. A user-registered scaling that needs
  parameters is left out (pass it in `scale_fns` with its parameters).
  """
  fns = {}
  for name in scalings.names():
    try:
      fns[name] = scalings.get(name)
    except ValueError:  # a factory with required parameters
      continue
  return fns


@dataclasses.dataclass(frozen=True)
class Tempered:
  """`base` with its logits divided by a softmax temperature t.

  logits_ij = (q'_i . k'_j) * s_i / t: the base scaling's per-query factor s_i
  divided by t, so the fused path still folds it into q.
  """

  base: scalings.ScaleFn
  temperature: Any  # a float or a traced scalar

  def __call__(self, q, k, keys):
    scaled = self.base(q, k, keys)
    return dataclasses.replace(scaled, logit_scale=scaled.logit_scale / self.temperature)


def with_temperature(scale_fn: scalings.ScaleFn, t: float) -> scalings.ScaleFn:
  """`scale_fn` with logits divided by t (t > 1 flattens the softmax)."""
  if isinstance(t, (int, float)) and not t > 0:  # t may also be a traced array
    raise ValueError(f"temperature must be > 0, got {t}")
  return Tempered(scale_fn, t)


def normal_qkv(key, B, T, S, N, H):
  """q [B, T, N, H], k and v [B, S, N, H], iid N(0, 1) float32."""
  kq, kk, kv = jax.random.split(key, 3)
  return (jax.random.normal(kq, (B, T, N, H)), jax.random.normal(kk, (B, S, N, H)),
          jax.random.normal(kv, (B, S, N, H)))


@functools.partial(jax.jit, static_argnames=("scale_fn",))
def _bidirectional_stats(q_BTNH, k_BSNH, v_BSNH, scale_fn):
  z_BTNH = attention(q_BTNH, k_BSNH, v_BSNH, scale_fn=scale_fn)
  logits_BNTS, _ = attention_weights(q_BTNH, k_BSNH, scale_fn=scale_fn)
  return jnp.std(z_BTNH), jnp.std(logits_BNTS)


@functools.partial(jax.jit, static_argnames=("scale_fn",))
def _causal_std_per_position(q_BTNH, k_BTNH, v_BTNH, scale_fn):
  z_BTNH = attention(q_BTNH, k_BTNH, v_BTNH, scale_fn=scale_fn, is_causal=True)
  # Position i sees n_i = i + 1 keys: its std is over batch, heads and features.
  return jnp.std(z_BTNH, axis=(0, 2, 3)), jnp.std(z_BTNH)


@functools.partial(jax.jit, static_argnames=("scale_fn",))
def _std_at_temperature(q_BTNH, k_BSNH, v_BSNH, t, scale_fn):
  # t is traced: one compilation serves the whole sweep.
  return jnp.std(attention(q_BTNH, k_BSNH, v_BSNH, scale_fn=with_temperature(scale_fn, t)))


@dataclasses.dataclass(frozen=True)
class OutputScaleResult:
  """std(z) per scaling: bidirectional against n, causal per position and pooled.

  Attributes:
    n_values: the key counts of the bidirectional sweep.
    std: scaling -> std(z) per n (bidirectional).
    logit_std: scaling -> std of the logits per n (bidirectional): the inverse
      of the effective softmax temperature.
    causal_lengths: the causal sequence lengths L (the n_values up to causal_len).
    causal_pooled: scaling -> std(z) over all positions of a length-L causal
      sequence, per L.
    causal_position: scaling -> std(z) at position i (n_i = i + 1 keys) of the
      longest causal sequence, per position.
    d, seed, sizes: the study's parameters.
  """

  n_values: tuple[int, ...]
  std: dict[str, np.ndarray]
  logit_std: dict[str, np.ndarray]
  causal_lengths: tuple[int, ...]
  causal_pooled: dict[str, np.ndarray]
  causal_position: dict[str, np.ndarray]
  d: int
  seed: int
  sizes: dict[str, int]

  def theory(self, name: str, n) -> np.ndarray | None:
    return THEORY[name](n) if name in THEORY else None

  def pooled_theory(self, name: str, length: int) -> float | None:
    """The per-position theory pooled over a causal sequence (mean variance)."""
    if name not in THEORY:
      return None
    return float(np.sqrt(np.mean(THEORY[name](np.arange(1, length + 1)) ** 2)))

  def rows(self) -> list[dict]:
    """One row per (scaling, mode, n); mode: bidirectional, causal_position, causal_pooled."""
    rows = []
    for name in self.std:
      for i, n in enumerate(self.n_values):
        theory = self.theory(name, n)
        rows.append({"scaling": name, "mode": "bidirectional", "n": n,
                     "std": float(self.std[name][i]),
                     "theory": None if theory is None else float(theory),
                     "logit_std": float(self.logit_std[name][i])})
      for n in self.causal_lengths:
        theory = self.theory(name, n)
        rows.append({"scaling": name, "mode": "causal_position", "n": n,
                     "std": float(self.causal_position[name][n - 1]),
                     "theory": None if theory is None else float(theory), "logit_std": None})
      for i, n in enumerate(self.causal_lengths):
        rows.append({"scaling": name, "mode": "causal_pooled", "n": n,
                     "std": float(self.causal_pooled[name][i]),
                     "theory": self.pooled_theory(name, n), "logit_std": None})
    return rows


def output_scale(n_values: Sequence[int] = DEFAULT_N, *, d: int = 64, queries: int = 64,
                 batch: int = 4, heads: int = 8, causal_len: int = 1024, causal_batch: int = 8,
                 seed: int = 0,
                 scale_fns: dict[str, scalings.ScaleFn] | None = None) -> OutputScaleResult:
  """Measures std(z) for q, k, v ~ N(0, 1) and every scaling.

  Args:
    n_values: numbers of keys for the bidirectional sweep.
    d: head dim.
    queries: queries per sequence in the bidirectional sweep (they do not
      interact, so fewer queries than keys is exact and cheaper).
    batch, heads: independent sequences and heads of the bidirectional sweep.
    causal_len: the longest causal sequence (self-attention, T = S); it costs
      causal_batch * heads * causal_len^2 logits per scaling.
    causal_batch: sequences in the causal runs; the per-position std is over
      causal_batch * heads * d values.
    seed: all randomness comes from `jax.random.key(seed)`.
    scale_fns: name -> scaling; default every registered one.

  Returns:
    An `OutputScaleResult`.
  """
  scale_fns = scale_fns or default_scalings()
  key_bi, key_causal = jax.random.split(jax.random.key(seed))
  std = {name: [] for name in scale_fns}
  logit_std = {name: [] for name in scale_fns}
  for n in n_values:
    q, k, v = normal_qkv(jax.random.fold_in(key_bi, n), batch, queries, n, heads, d)
    for name, fn in scale_fns.items():
      s_z, s_logits = _bidirectional_stats(q, k, v, fn)
      std[name].append(float(s_z))
      logit_std[name].append(float(s_logits))

  causal_lengths = tuple(sorted({n for n in n_values if n <= causal_len} | {causal_len}))
  pooled = {name: [] for name in scale_fns}
  position = {}
  for length in causal_lengths:
    q, k, v = normal_qkv(jax.random.fold_in(key_causal, length), causal_batch, length,
                         length, heads, d)
    for name, fn in scale_fns.items():
      per_position_T, s_z = _causal_std_per_position(q, k, v, fn)
      pooled[name].append(float(s_z))
      if length == causal_len:
        position[name] = np.asarray(per_position_T)
  as_arrays = lambda x: {name: np.asarray(vals) for name, vals in x.items()}
  return OutputScaleResult(
      n_values=tuple(int(n) for n in n_values), std=as_arrays(std),
      logit_std=as_arrays(logit_std), causal_lengths=causal_lengths,
      causal_pooled=as_arrays(pooled), causal_position=position, d=d, seed=seed,
      sizes=dict(queries=queries, batch=batch, heads=heads, causal_len=causal_len,
                 causal_batch=causal_batch))


def _reference_lines(ax, n):
  n = np.asarray(n, float)
  ax.plot(n, standard_theory(n), "k--", lw=1.2, label="theory sqrt(min(1, e/n)) (standard)")
  ax.plot(n, np.ones_like(n), "k-.", lw=1.0, label="theory 1 (fully/unit scaled)")
  ax.plot(n, 1 / np.sqrt(n), "k:", lw=1.0, label="uniform weights 1/sqrt(n)")


def _log_axes(ax, xlabel):
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel(xlabel)
  ax.grid(True, which="both", alpha=0.3)


def plot_output_scale(result: OutputScaleResult):
  """Three panels: bidirectional std vs n, causal std per position, causal pooled."""
  fig = reporting.new_figure(18, 5.2)
  ax_bi, ax_pos, ax_pool = fig.subplots(1, 3, sharey=True)
  n = np.asarray(result.n_values)
  positions = np.arange(1, result.sizes["causal_len"] + 1)
  lengths = np.asarray(result.causal_lengths)
  for i, name in enumerate(result.std):
    # The scalings with a prediction are drawn on top (others coincide with them).
    style = dict(reporting.style(i), zorder=3 if name in THEORY else 2)
    ax_bi.plot(n, result.std[name], label=name, lw=1.5, ms=5, **style)
    ax_pos.plot(positions, result.causal_position[name], lw=1.0, color=style["color"],
                zorder=style["zorder"], label=name)
    ax_pool.plot(lengths, result.causal_pooled[name], lw=1.5, ms=5, label=name, **style)
  _reference_lines(ax_bi, n)
  _reference_lines(ax_pos, positions)
  for name, ls in (("standard", "--"), ("fully_scaled", "-.")):
    ax_pool.plot(lengths, [result.pooled_theory(name, L) for L in lengths], "k" + ls, lw=1.2,
                 label=f"theory pooled ({name})")
  _log_axes(ax_bi, "n (keys per query)")
  _log_axes(ax_pos, "n_i = i + 1 (keys seen by position i)")
  _log_axes(ax_pool, "L (causal sequence length)")
  ax_bi.set_ylabel("std of attention output z")
  ax_bi.set_title("bidirectional: every query sees n keys")
  ax_pos.set_title(f"causal, per position (L = {result.sizes['causal_len']})")
  ax_pool.set_title("causal, pooled over positions 0 .. L-1")
  fig.legend(handles=ax_bi.get_lines() + ax_pool.get_lines()[-2:], fontsize=8,
             loc="outside right upper")
  fig.suptitle(f"Attention output std for q, k, v ~ N(0, 1): d = {result.d}, "
               f"seed = {result.seed}  (Graphcore: std(z) ~ sqrt(e/n) for standard scaling)")
  return fig


@dataclasses.dataclass(frozen=True)
class TemperatureResult:
  """std(z) of standard attention with logits divided by t, per n and t."""

  temperatures: tuple[float, ...]
  n_values: tuple[int, ...]
  std: dict[int, np.ndarray]
  d: int
  seed: int

  def rows(self) -> list[dict]:
    rows = []
    for n in self.n_values:
      for i, t in enumerate(self.temperatures):
        theory = float(graphcore_theory(n, t))
        rows.append({"n": n, "t": t, "log2_t": math.log2(t), "std": float(self.std[n][i]),
                     "theory": theory, "std_over_theory": float(self.std[n][i]) / theory})
    return rows


def temperature_sweep(temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
                      n_values: Sequence[int] = (64, 256, 1024), *, d: int = 64,
                      queries: int = 64, batch: int = 4, heads: int = 8,
                      seed: int = 0) -> TemperatureResult:
  """std(z) of `standard` attention with logits divided by t (q, k, v ~ N(0, 1)).

  Standard logits q.k/sqrt(d) have std about 1, so dividing by t gives a
  softmax of temperature t; compare with `graphcore_theory(n, t)`, which holds
  for t near 1 and above (below, the softmax saturates and std -> 1).
  """
  if not all(t > 0 for t in temperatures):
    raise ValueError(f"temperatures must be > 0, got {temperatures}")
  base = scalings.get("standard")
  key = jax.random.key(seed)
  std = {}
  for n in n_values:
    q, k, v = normal_qkv(jax.random.fold_in(key, n), batch, queries, n, heads, d)
    std[int(n)] = np.asarray([float(_std_at_temperature(q, k, v, jnp.float32(t), base))
                              for t in temperatures])
  return TemperatureResult(tuple(float(t) for t in temperatures),
                           tuple(int(n) for n in n_values), std, d, seed)


def plot_temperature(result: TemperatureResult):
  """std(z) against t (log2 axis) per n, with the theory dashed."""
  fig = reporting.new_figure(8, 5.2)
  ax = fig.subplots()
  t = np.asarray(result.temperatures)
  t_fine = np.geomspace(t.min(), t.max(), 200)
  for i, n in enumerate(result.n_values):
    style = reporting.style(i)
    ax.plot(t, result.std[n], lw=1.5, ms=5, label=f"measured, n = {n}", **style)
    ax.plot(t_fine, graphcore_theory(n, t_fine), "--", color=style["color"], lw=1.2,
            label=f"sqrt(exp(t^-2)/n), n = {n}")
  ax.axhline(1.0, color="k", ls=":", lw=1.0, label="one-hot softmax (t -> 0): 1")
  ax.axvspan(t.min(), 1.0, color="0.9", zorder=0)
  ax.text(t.min() * 1.15, 0.015,
          "t < 1: the softmax saturates and\nthe theory fails (later for larger n)",
          fontsize=8, va="bottom")
  _log_axes(ax, "softmax temperature t (logits = q.k / (t sqrt(d)))")
  ax.set_ylim(0.01, 3.0)
  ax.set_ylabel("std of attention output z")
  ax.legend(fontsize=7, loc="upper right")
  ax.set_title(f"Temperature sweep, standard attention, q, k, v ~ N(0, 1): d = {result.d}, "
               f"seed = {result.seed}", fontsize=10)
  return fig


# ---------------------------------------------------------------------------
# The command line: python -m attnscale.studies output_scale|temperature

def add_arguments(p) -> None:
  """The flags of output_scale and temperature."""
  g = p.add_argument_group("output_scale and temperature")
  g.add_argument("--min-n", type=int, default=16, help="smallest n (a power of 2)")
  g.add_argument("--max-n", type=int, default=4096, help="largest n (a power of 2)")
  g.add_argument("--causal-len", type=int, default=1024,
                 help="longest causal sequence (costs batch*2 * heads * L^2 logits)")
  g.add_argument("--scalings", nargs="+", choices=scalings.names(), default=None,
                 help="registered scalings to include (default: all, with default params)")
  g.add_argument("--d", type=int, default=64, help="head dim")
  g.add_argument("--batch", type=int, default=4, help="independent sequences")
  g.add_argument("--heads", type=int, default=8, help="heads per sequence")
  g.add_argument("--queries-per-sequence", type=int, default=64,
                 help="queries per sequence in the bidirectional runs")
  g.add_argument("--temperature-n", type=int, nargs="+", default=[64, 256, 1024],
                 help="numbers of keys for the temperature sweep")


def check_arguments(args, p) -> None:
  for name in ("min_n", "max_n"):
    n = getattr(args, name)
    if n < 1 or n & (n - 1):
      p.error(f"--{name.replace('_', '-')} must be a power of 2, got {n}")
  if args.min_n > args.max_n:
    p.error(f"--min-n ({args.min_n}) must be <= --max-n ({args.max_n})")


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
  return tuple(2**i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1))


def run_output_scale(a):
  fns = default_scalings()
  if a.scalings and not {"standard", "fully_scaled"} <= set(a.scalings):
    raise SystemExit("output_scale: --scalings must include standard and fully_scaled "
                     "(the headline)")
  n_values = _powers_of_two(a.min_n, a.max_n)
  scale_fns = {name: fns[name] for name in a.scalings} if a.scalings else fns
  r = output_scale(n_values, d=a.d, scale_fns=scale_fns,
                           queries=a.queries_per_sequence, batch=a.batch,
                           heads=a.heads, causal_len=min(a.causal_len, a.max_n),
                           causal_batch=a.batch * 2, seed=a.seed)
  n = 256 if 256 in n_values else n_values[len(n_values) // 2]
  i = n_values.index(n)
  notes = [f"q, k, v ~ N(0, 1), d = {r.d}, seed = {r.seed}, sizes {r.sizes}.",
           f"Headline (bidirectional, n = {n}): standard {r.std['standard'][i]:.4f} "
           f"(theory sqrt(e/n) = {math.sqrt(math.e / n):.4f}), "
           f"fully_scaled {r.std['fully_scaled'][i]:.4f} (theory 1).",
           "theory: Graphcore's large-n rule per scaling where one exists; causal_pooled "
           "pools the per-position rule sqrt(min(1, e/n_i)) over positions."]
  return reporting.write_study(plot_output_scale(r), r.rows(), a.out, "output_scale",
                "Attention output std against n", notes)


def run_temperature(a):
  temperatures = tuple(2.0**(i / 2) for i in range(-8, 9))
  r = temperature_sweep(temperatures, a.temperature_n, d=a.d,
                                queries=a.queries_per_sequence, batch=a.batch, heads=a.heads,
                                seed=a.seed)
  rows = r.rows()
  worst = max(abs(row["std_over_theory"] - 1) for row in rows if row["t"] >= 1)
  notes = [f"standard attention, logits divided by t; q, k, v ~ N(0, 1), d = {r.d}, "
           f"seed = {r.seed}.",
           f"Largest |std / theory - 1| for t >= 1: {worst:.3f} (theory sqrt(exp(t^-2)/n)). "
           "Below t = 1 the softmax saturates and the theory does not apply."]
  return reporting.write_study(plot_temperature(r), rows, a.out, "temperature",
                "Attention output std against softmax temperature", notes)


OUTPUT_SCALE = registry.Study(run_output_scale, arguments=add_arguments, check=check_arguments)
TEMPERATURE = registry.Study(run_temperature, arguments=add_arguments, check=check_arguments)
