"""What a layer may do to each head's attention output before the output projection.

Pure functions of arrays, applied after the kernel (so the fused and reference paths
share them exactly, and every normaliser and scaling takes them):

  exclusive       XSA: each head's output without its component along the token's
                  own value (Zhai 2026, arXiv 2603.09078; `model.xsa`)
  head_rms_norm   a per-head RMSNorm of the output (Li et al. 2026, arXiv 2605.06611;
                  `model.head_norm`)

Dimension legend: B batch, T sequence, N heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# Below this squared norm a value counts as zero: nothing to project out.
_EPS = 1e-12


def exclusive(y_BTNH: Array, v_BTKH: Array) -> Array:
  """Exclusive self-attention (XSA; Zhai 2026, "Exclusive Self Attention", arXiv
  2603.09078): each head's output with its projection on the query token's own
  value removed,

      z_i = y_i - (y_i . v_i) v_i / |v_i|^2,

  so attention carries only what is orthogonal to the token's own value (the
  residual stream already holds the token itself); the paper reports gains up to
  2.7B that grow with the sequence length, and a head can park its weight on its
  own position to output nothing, acting as a sink. Grouped-query attention: each
  query head uses its key/value head's v_i (heads n K/N ... in order, as the
  kernel groups them). float32; a zero value (|v_i|^2 < 1e-12) leaves y_i as is.

  Args:
    y_BTNH: the kernel's output, per query head.
    v_BTKH: the values (self-attention: v_i is the value of query position i).
  """
  N, K = y_BTNH.shape[2], v_BTKH.shape[2]
  y_BTNH = y_BTNH.astype(jnp.float32)
  v_BTNH = jnp.repeat(v_BTKH.astype(jnp.float32), N // K, axis=2)
  vv_BTN1 = jnp.sum(v_BTNH * v_BTNH, axis=-1, keepdims=True)
  yv_BTN1 = jnp.sum(y_BTNH * v_BTNH, axis=-1, keepdims=True)
  coef_BTN1 = jnp.where(vv_BTN1 > _EPS, yv_BTN1 / jnp.maximum(vv_BTN1, _EPS), 0.0)
  return y_BTNH - coef_BTN1 * v_BTNH


def head_rms_norm(y_BTNH: Array, gain_NH: Array, eps: float = 1e-6) -> Array:
  """A per-head RMSNorm of the attention output (head-wise RMSNorm: Li, Jiang, Sun
  and Hu 2026, "The Structural Origin of Attention Sink: Variance Discrepancy,
  Super Neurons, and Dimension Disparity", arXiv 2605.06611, ICML 2026):

      z_n = g_n * y_n / sqrt(mean_h y_nh^2 + eps),   per head n and token,

  so that every token's head output has the same scale whatever the number of
  values it averaged (the paper traces sinks to the variance discrepancy of that
  averaging: the first token's output, one value, against later tokens' means of
  many) and reports that it mitigates sinks and speeds pre-training. The gain g
  [N, H] is learned, initialised to 1 (the paper's account we could read does not
  say how the gain is shaped; one per head and dimension is ours). float32.
  """
  y_BTNH = y_BTNH.astype(jnp.float32)
  ms_BTN1 = jnp.mean(jnp.square(y_BTNH), axis=-1, keepdims=True)
  return y_BTNH * jax.lax.rsqrt(ms_BTN1 + eps) * gain_NH.astype(jnp.float32)
