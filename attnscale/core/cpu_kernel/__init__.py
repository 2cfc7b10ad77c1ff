"""The native CPU kernel: FlashAttention-2 in C++ through `jax.ffi`, forward and backward.

    z_i = sum_j p_ij v_j,   p_ij = exp(l_ij - lse_i),   lse_i = log sum_j exp(l_ij),
    l_ij = q_i . k_j over the keys j query i sees

Scale 1, as every fused kernel here: `attnscale.core.fused` folds the scaling
into q, so this one kernel serves every registered scaling, and it returns the
row log-sum-exp, from which `fused` applies a learned or off-by-one sink
(sum_j p_ij = sigmoid(lse_i - b)). It takes causality (query blocks stop at the
diagonal, key blocks past it are never visited), any boolean mask broadcastable
to [B, N, T, S] (key padding, per-query patterns), grouped-query heads, value
head dims other than q's, float32 and bfloat16 inputs (float32 products and
softmax inside), and any lengths. Memory is O(T) per query block: one 64 x 64
tile of logits at a time, never a T x S buffer. What it does not take (other
normalisers, a soft-cap, per-pair logit transforms, FoX's forget gate,
selective attention, the diagnostics' stats) runs on the XLA kernel;
`fused.kernel_for` is the one place that decides.

Forward: Dao 2023, "FlashAttention-2" (arXiv 2307.08691), Algorithm 1; backward
its Algorithm 2 with D_i = dz_i . z_i - dlse_i (the sink's gradient reaches the
logits through lse). The tiling is FlashAttention-2's and close to PyTorch's CPU
flash attention (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): query
blocks of 64 rows for the forward, one task per (batch, key/value head) for the
backward so that dq, dk and dv need no atomics, and the bits are the same
whatever the number of threads. Source, tiles and micro-kernel:
flash_attention.cc; the build (at first use, cached, one library with the
native LayerNorm, `norms`): `build`.

Environment: ATTNSCALE_NATIVE_KERNEL=0 turns it off (the XLA kernel runs);
ATTNSCALE_NATIVE_THREADS=n caps its threads (default: XLA's intra-op pool's);
ATTNSCALE_NATIVE_POOL=own runs it on its own threads instead of XLA's pool.

Dimension legend: B batch, T query length, S key/value length, N query heads,
K key/value heads, H head dim, V value head dim.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from attnscale.core.cpu_kernel import build

Array = jax.Array

DTYPES = (jnp.float32, jnp.bfloat16)


def available() -> bool:
  """Whether the library built and loaded (builds it at the first call; warns once if not)."""
  return build.load() is not None


def dot_product_attention(q_BTNH: Array, k_BSKH: Array, v_BSKH: Array,
                          mask_BNTS: Array | None = None,
                          is_causal: bool = False) -> tuple[Array, Array]:
  """softmax(q k^T) v over the visible keys, scale 1, on the native kernel.

  Args:
    q_BTNH: queries (scale folded in), float32 or bfloat16.
    k_BSKH: keys, q's dtype and head dim; K divides N (head n reads n // (N / K)).
    v_BSKH: values, k's shape but for the head dim V.
    mask_BNTS: boolean, rank 4, broadcastable to [B, N, T, S]; True = visible.
    is_causal: query i sees keys j <= i only (top-left aligned).

  Returns:
    (z_BTNV in q's dtype, lse_BTN float32). A query that sees no key gets
    z = 0 and lse = -inf. Differentiable in q, k, v and through lse.
  """
  if build.load() is None:
    raise RuntimeError("the native CPU attention kernel is unavailable (see the warning)")
  S = k_BSKH.shape[1]
  if mask_BNTS is None:
    mask = jnp.ones((1, 1, 1, 1), jnp.uint8)
    has_mask = False
  else:
    mask = jnp.broadcast_to(mask_BNTS, mask_BNTS.shape[:3] + (S,)).astype(jnp.uint8)
    has_mask = True
  return _attention(q_BTNH, k_BSKH, v_BSKH, mask, bool(is_causal), has_mask)


def _attrs(is_causal: bool, has_mask: bool) -> dict:
  pool = os.environ.get("ATTNSCALE_NATIVE_POOL", "xla")
  if pool not in ("xla", "own"):
    raise ValueError(f"ATTNSCALE_NATIVE_POOL must be 'xla' or 'own', got {pool!r}")
  threads = int(os.environ.get("ATTNSCALE_NATIVE_THREADS", "0") or 0)
  return {"is_causal": np.int64(is_causal), "has_mask": np.int64(has_mask),
          "pool": np.int64(pool == "own"), "threads": np.int64(threads)}


def _forward(q_BTNH, k_BSKH, v_BSKH, mask, is_causal, has_mask):
  B, T, N, _ = q_BTNH.shape
  out_types = (jax.ShapeDtypeStruct((B, T, N, v_BSKH.shape[-1]), q_BTNH.dtype),
               jax.ShapeDtypeStruct((B, T, N), jnp.float32))
  call = jax.ffi.ffi_call("attnscale_flash_fwd", out_types, vmap_method="sequential")
  return call(q_BTNH, k_BSKH, v_BSKH, mask, **_attrs(is_causal, has_mask))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(q_BTNH, k_BSKH, v_BSKH, mask, is_causal, has_mask):
  return tuple(_forward(q_BTNH, k_BSKH, v_BSKH, mask, is_causal, has_mask))


def _attention_fwd(q_BTNH, k_BSKH, v_BSKH, mask, is_causal, has_mask):
  z_BTNV, lse_BTN = _forward(q_BTNH, k_BSKH, v_BSKH, mask, is_causal, has_mask)
  return (z_BTNV, lse_BTN), (q_BTNH, k_BSKH, v_BSKH, mask, z_BTNV, lse_BTN)


def _attention_bwd(is_causal, has_mask, residuals, cotangents):
  q_BTNH, k_BSKH, v_BSKH, mask, z_BTNV, lse_BTN = residuals
  dz_BTNV, dlse_BTN = cotangents
  out_types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q_BTNH, k_BSKH, v_BSKH))
  call = jax.ffi.ffi_call("attnscale_flash_bwd", out_types, vmap_method="sequential")
  dq, dk, dv = call(q_BTNH, k_BSKH, v_BSKH, mask, z_BTNV, lse_BTN,
                    dz_BTNV.astype(q_BTNH.dtype), dlse_BTN.astype(jnp.float32),
                    **_attrs(is_causal, has_mask))
  return dq, dk, dv, None


_attention.defvjp(_attention_fwd, _attention_bwd)
