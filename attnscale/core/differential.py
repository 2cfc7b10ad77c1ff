"""Differential attention's two-map combination on the one attention kernel.

    z_i = sum_j (p1_ij - lambda p2_ij) v_j = attention(q1, k1, v)_i - lambda attention(q2, k2, v)_i

Ye et al. 2025, "Differential Transformer", ICLR 2025, arXiv 2410.05258 (their code,
github.com/microsoft/unilm/tree/master/Diff-Transformer): two softmax maps from two
halves of the query and key projections, subtracted with a learned lambda, then a
per-head norm and a (1 - lambda_init) factor. The output is linear in the weights,
so the difference of maps is the difference of outputs: one `attention` call over
2N query heads (the first N read k1, the second N read k2, both read v) serves it,
with any scaling, normaliser, mask and kernel. The values may be wider than q and
k (the paper's are 2 head dims wide; splash and cuDNN then run once per head-dim
slice of v, `fused.by_value_slices`).

Here too, as pure functions, the rest of the paper's formulas, which the model
(`model.differential`, attnscale/models/base.py) applies with its parameters:
lambda's reparameterisation (`reparameterised_lambda`), its initial value by
depth (`lambda_init`) and the head's output norm and factor (`head_output`).

Dimension legend: B batch, T query length, S key/value length, N query heads per
map, K key/value heads per map, H head dim (q and k), V value dim.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attnscale.core import attention as attention_lib
from attnscale.core.fused import AttentionStats

Array = jax.Array


def differential_attention(q1_BTNH: Array, q2_BTNH: Array, k1_BSKH: Array, k2_BSKH: Array,
                           v_BSKH: Array, lam: float | Array, *, mask: Array | None = None,
                           sink: float | Array | None = None,
                           log_forget: Array | None = None, return_stats: bool = False,
                           **options) -> Array | tuple[Array, AttentionStats]:
  """attention(q1, k1, v) - lam * attention(q2, k2, v), in one kernel call.

  Args:
    q1_BTNH, q2_BTNH: the two maps' queries [batch, q_len, heads, head_dim].
    k1_BSKH, k2_BSKH: their keys [batch, kv_len, kv_heads, head_dim].
    v_BSKH: the values both maps weigh [batch, kv_len, kv_heads, value_dim]
      (value_dim may differ from head_dim: the paper's is 2 head_dim).
    lam: lambda, a scalar or [heads] (traced arrays welcome: a model learns it).
    mask, sink, log_forget: as in `attention`, for one map's N heads ([heads]
      sinks, a [.., heads, ..] mask and a [batch, q_len, heads] gate serve both).
    return_stats: also return the `AttentionStats` of the 2N heads (the first
      N the first map's, the second N the second's).
    **options: `attention`'s other keywords (scale_fn, is_causal, normalizer,
      implementation, logit_softcap).

  Returns:
    [batch, q_len, heads, value_dim] in q1's dtype; with `return_stats`, (that, stats).
  """
  N = q1_BTNH.shape[2]
  if q1_BTNH.shape != q2_BTNH.shape or k1_BSKH.shape != k2_BSKH.shape:
    raise ValueError(f"the two maps must have one shape: q1 {tuple(q1_BTNH.shape)}, q2 "
                     f"{tuple(q2_BTNH.shape)}, k1 {tuple(k1_BSKH.shape)}, k2 "
                     f"{tuple(k2_BSKH.shape)}")
  lam = jnp.asarray(lam)
  if lam.shape not in ((), (N,)):
    raise ValueError(f"lam must be a scalar or have shape [heads] = ({N},), "
                     f"got shape {tuple(lam.shape)}")
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.ndim == 4 and mask.shape[1] == N and N > 1:
      mask = twice(mask, 1)
  if sink is not None and jnp.ndim(sink) == 1:
    sink = twice(jnp.asarray(sink), 0)
  if log_forget is not None:
    log_forget = twice(jnp.asarray(log_forget), 2)
  out = attention_lib.attention(
      jnp.concatenate([q1_BTNH, q2_BTNH], axis=2), jnp.concatenate([k1_BSKH, k2_BSKH], axis=2),
      twice(v_BSKH, 2), mask=mask, sink=sink, log_forget=log_forget,
      return_stats=return_stats, **options)
  z_BTMV, stats = (out if return_stats else (out, None))
  z_BTNV = combine(z_BTMV, lam).astype(q1_BTNH.dtype)
  return (z_BTNV, stats) if return_stats else z_BTNV


def twice(x: Array, axis: int) -> Array:
  """x and x again along `axis`: one map's heads (values, sinks, gates) for both maps."""
  return jnp.concatenate([x, x], axis=axis)


def combine(z_BTMV: Array, lam: float | Array) -> Array:
  """z1 - lam z2 in float32, from one call's 2N heads [B, T, 2N, V] (the first N the
  first map's outputs, the second N the second's); lam a scalar or [N]."""
  N = z_BTMV.shape[2] // 2
  lam_11N1 = jnp.broadcast_to(jnp.asarray(lam, jnp.float32), (N,)).reshape(1, 1, N, 1)
  return z_BTMV[:, :, :N].astype(jnp.float32) - lam_11N1 * z_BTMV[:, :, N:].astype(jnp.float32)


def lambda_init(layer: int) -> float:
  """lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for layer l = 1, 2, ... (Ye et al.,
  Sec. 2.1); the reference code's `lambda_init_fn(depth)` is the same with the
  0-based depth = l - 1 (0.2 at the first layer, towards 0.8 deeper)."""
  if isinstance(layer, bool) or not isinstance(layer, int) or layer < 1:
    raise ValueError(f"lambda_init's layer is 1-based: an int >= 1, got {layer!r}")
  return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


def reparameterised_lambda(lq1_H: Array, lk1_H: Array, lq2_H: Array, lk2_H: Array,
                           init: float) -> Array:
  """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init (Ye et al., eq. 2), float32:
  learned vectors (the reference code's N(0, 0.1) init) whose dot products keep
  the learning dynamics of lambda in step with the other weights'."""
  dot = lambda a, b: jnp.sum(jnp.asarray(a, jnp.float32) * jnp.asarray(b, jnp.float32), -1)
  return jnp.exp(dot(lq1_H, lk1_H)) - jnp.exp(dot(lq2_H, lk2_H)) + init


def head_output(z_BTNV: Array, gain_V: Array, init: float, eps: float = 1e-5) -> Array:
  """(1 - lambda_init) RMSNorm(z) per head, float32 (Ye et al., eq. 3: GroupNorm over
  each head, the reference code's `subln`, an RMSNorm over the head's 2 H values
  with one learned gain shared by the heads, eps 1e-5). The norm undoes the
  difference's smaller, head-dependent scale; the fixed factor puts the gradient's
  scale back near the standard transformer's, so its hyperparameters carry over."""
  z_BTNV = jnp.asarray(z_BTNV, jnp.float32)
  y_BTNV = z_BTNV * jax.lax.rsqrt(jnp.mean(jnp.square(z_BTNV), -1, keepdims=True) + eps)
  return y_BTNV * jnp.asarray(gain_V, jnp.float32).reshape(1, 1, 1, -1) * (1.0 - init)
