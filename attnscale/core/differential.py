"""Differential attention's two-map combination on the one attention kernel.

    z_i = sum_j (p1_ij - lambda p2_ij) v_j = attention(q1, k1, v)_i - lambda attention(q2, k2, v)_i

Ye et al. 2025, "Differential Transformer", ICLR 2025, arXiv 2410.05258 (their code,
github.com/microsoft/unilm/tree/master/Diff-Transformer): two softmax maps from two
halves of the query and key projections, subtracted with a learned lambda, then a
per-head norm and a (1 - lambda_init) factor. The output is linear in the weights,
so the difference of maps is the difference of outputs: one `attention` call over
2N query heads (the first N read k1, the second N read k2, both read v) serves it,
with any scaling, normaliser, mask and kernel. What stays in the model: the two
projections, lambda's reparameterisation exp(lq1 . lk1) - exp(lq2 . lk2) +
lambda_init, the per-head norm and the (1 - lambda_init) factor.

Dimension legend: B batch, T query length, S key/value length, N query heads per
map, K key/value heads per map, H head dim.
"""

from __future__ import annotations

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
    v_BSKH: the values both maps weigh.
    lam: lambda, a scalar or [heads] (traced arrays welcome: a model learns it).
    mask, sink, log_forget: as in `attention`, for one map's N heads ([heads]
      sinks, a [.., heads, ..] mask and a [batch, q_len, heads] gate serve both).
    return_stats: also return the `AttentionStats` of the 2N heads (the first
      N the first map's, the second N the second's).
    **options: `attention`'s other keywords (scale_fn, is_causal, normalizer,
      implementation, logit_softcap).

  Returns:
    [batch, q_len, heads, head_dim] in q1's dtype; with `return_stats`, (that, stats).
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
  twice = lambda x, axis: jnp.concatenate([x, x], axis=axis)
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
  z_BTMH, stats = (out if return_stats else (out, None))
  lam_11N1 = jnp.broadcast_to(lam.astype(jnp.float32), (N,)).reshape(1, 1, N, 1)
  z_BTNH = (z_BTMH[:, :, :N].astype(jnp.float32)
            - lam_11N1 * z_BTMH[:, :, N:].astype(jnp.float32)).astype(q1_BTNH.dtype)
  return (z_BTNH, stats) if return_stats else z_BTNH
