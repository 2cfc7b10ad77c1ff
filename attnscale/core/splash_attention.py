"""The fused path's TPU kernel: JAX's Pallas splash attention, scale 1, with padding and sharding.

    z_i = sum_j p_ij v_j,   p_ij = exp(l_ij) / (e^b + sum_k exp(l_ik)),   l_ij = cap(q_i . k_j)

over the keys j (and k) that query i sees.

The scale is already folded into q (`attnscale.core.fused`), and splash computes q.k
unscaled, so this is scaling-free like `attnscale.core.xla_attention`. Options: the
logit soft-cap c, cap(x) = c tanh(x / c) (Gemma Team 2024, "Gemma 2", arXiv
2408.00118), applied before masking; an attention sink b per query head, the
e^b term above (Miller 2023, "Attention Is Off By One"; learned per head in
OpenAI's gpt-oss, 2025), which splash applies in the kernel, so z already
carries the sink's down-weighting sum_j p_ij = sigmoid(lse_i - b) (the caller
must not apply it again). Both run inside the kernel, and so do their gradients.

Splash ("sparse flash") attention is flash attention (Dao et al. 2022, arXiv
2205.14135) as a Pallas TPU kernel in JAX
(`jax.experimental.pallas.ops.tpu.splash_attention`): q, k, v in [heads, len,
head_dim] blocks, an online softmax over key blocks, and a static mask (here
causal or full) from which whole blocks above the causal diagonal are skipped,
forward and backward. What it needs, and what this module does about it (read
off the kernel source of JAX 0.10 and 0.12, which agree on all of it):

* sequence blocks: the key blocks (and the dkv pass's query blocks, which carry
  segment ids along lanes) must be whole multiples of 128 lanes, and the grid
  has no partial blocks, so the block sizes must divide the lengths. T and S are
  padded up to multiples of 128 and each gets the largest block of 512, 256, 128
  that divides its padded length (512: MaxText's default splash block; larger
  blocks mean fewer grid steps and fuller MXU tiles). Padded queries are sliced
  off; padded keys get segment id 0, which no query has, so they are invisible
  to every query, causal or not (a causal query past S would otherwise see them).
* head dim: q, k and v are zero-padded to a multiple of 128 (q.k and the
  output's first H columns are unchanged; the rest is sliced off). The kernels
  of JAX 0.10 and 0.12 accept any head dim, but earlier releases raised for a
  value head dim that is not a multiple of 128 lanes (jax-ml/jax#30861: gpt-oss's
  64), and Mosaic lays the minor dim out in 128-lane tiles anyway: the padding
  fills lanes (and 128-wide MXU passes) that would otherwise sit idle, and costs
  HBM traffic (2x for H = 64). `HEAD_DIM_MULTIPLE = 1` turns it off.
* key padding: `kv_mask_BS` becomes segment ids (query id 1 everywhere, key id 1
  where visible, 0 where not), which is exactly a [B, 1, 1, S] mask. Only that
  maps to segment ids; a per-query [.., T, S] mask does not (`unsupported_reason`).
* grouped-query attention: `make_splash_mha` takes K <= N key/value heads and
  sends query head n to key/value head n // (N // K) (jax.nn's grouping), and its
  dkv kernel sums dk, dv over a group in VMEM. That beats both alternatives:
  repeating k and v G times in HBM, or vmapping the MQA kernel over K (K kernels
  per call, each with its own grid).

A query that sees no key (a left-padded causal row, a fully padded batch row)
gets the mean of the values its kernel blocks ran over without a sink, exactly
0 with one; never NaN. `attention` zeroes those rows. With a `mesh` the kernel
runs under `shard_map` over the batch axes (each device its own batch rows,
heads and the sink replicated), as MaxText does for splash: a Pallas call cannot
be partitioned by XLA's SPMD pass.

Dimension legend: B batch, T query length, S key/value length, N query heads,
K key/value heads, H head dim; padded for the kernel's tiles: X = T and Y = S
rounded up to multiples of 128, D = H rounded up to a multiple of HEAD_DIM_MULTIPLE (128).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

Array = jax.Array

# TPU vector registers are 8 sublanes x 128 lanes; the kernel tiles key blocks,
# segment ids and (here) head dims in whole lanes.
LANES = 128
# Sequence blocks, largest first: the first that divides the padded length.
BLOCK_CHOICES = (512, 256, 128)
# Head dims are zero-padded to a multiple of this (module docstring).
HEAD_DIM_MULTIPLE = LANES


def _splash():
  """(kernel module, mask module), or raises ImportError (a JAX without Pallas TPU ops)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel,
    splash_attention_mask,
  )
  return splash_attention_kernel, splash_attention_mask


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def padded_length_and_block(n: int) -> tuple[int, int]:
  """(n rounded up to a multiple of 128, the sequence block for it)."""
  padded = _round_up(n, LANES)
  return padded, next(b for b in BLOCK_CHOICES if padded % b == 0)


def unsupported_reason(q_shape, k_shape, *, normalizer: str,
                       has_custom_mask: bool) -> str | None:
  """None if splash can run this call, else a short reason.

  Args:
    q_shape: [B, T, N, H].
    k_shape: [B, S, K, H] (v has k's shape).
    normalizer: "softmax" runs; splash has no sigmoid kernel.
    has_custom_mask: a mask other than key padding [B, 1, 1, S] (which becomes
      segment ids): splash's masks are static per head, not per batch row and query.

  Any length and head dim runs after padding (module docstring), so only empty
  sequences are refused for their shape. The caller checks the backend: off a
  TPU splash runs only in interpret mode.
  """
  try:
    _splash()
  except ImportError as e:
    return f"splash attention is not importable from this JAX ({e})"
  if normalizer != "softmax":
    return f"normalizer={normalizer!r}: splash has a softmax kernel only"
  if has_custom_mask:
    return ("a custom [.., T, S] mask: splash takes key padding [B, 1, 1, S] only "
            "(as segment ids)")
  if len(q_shape) != 4 or len(k_shape) != 4:
    return f"q and k must have rank 4, got shapes {tuple(q_shape)} and {tuple(k_shape)}"
  (B, T, N, H), (Bk, S, K, Hk) = q_shape, k_shape
  if B != Bk or H != Hk:
    return f"q {tuple(q_shape)} and k {tuple(k_shape)} differ in batch or head_dim"
  if K == 0 or N % K:
    return f"kv_heads ({K}) must divide heads ({N})"
  if min(T, S, H) == 0:
    return f"empty query, key or head dimension (T={T}, S={S}, H={H})"
  return None


@functools.lru_cache(maxsize=32)
def _kernel(num_heads: int, X: int, Y: int, is_causal: bool, logit_softcap: float | None,
            interpret):
  """A splash MHA kernel for [num_heads, X, D] queries and [K, Y, D] keys/values.

  Cached: the static mask's block tables are built in Python (numpy), once per
  configuration, not once per layer and trace. They are made concrete arrays
  (ensure_compile_time_eval), so that a kernel first built inside one jit trace
  leaks no tracer into the next.
  """
  kernel_lib, mask_lib = _splash()
  block_q, block_kv = padded_length_and_block(X)[1], padded_length_and_block(Y)[1]
  # Top-left aligned causality: CausalMask(offset=0) is q_index >= kv_index.
  head_mask = mask_lib.CausalMask((X, Y)) if is_causal else mask_lib.FullMask((X, Y))
  mask = mask_lib.MultiHeadMask([head_mask] * num_heads)
  # One block size per axis for every pass (forward, dq, dkv).
  blocks = kernel_lib.BlockSizes(
      block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
      block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
      block_q_dq=block_q, block_kv_dq=block_kv)
  with jax.ensure_compile_time_eval():
    return kernel_lib.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                      attn_logits_soft_cap=logit_softcap, interpret=interpret)


def dot_product_attention(q_BTNH: Array,
                          k_BSKH: Array,
                          v_BSKH: Array,
                          *,
                          is_causal: bool,
                          kv_mask_BS: Array | None = None,
                          logit_softcap: float | None = None,
                          sink_N: Array | None = None,
                          mesh: jax.sharding.Mesh | None = None,
                          batch_axes: tuple[str, ...] = ("data", "fsdp"),
                          interpret: bool = False) -> Array:
  """softmax(cap(q k^T)) v over the visible keys, scale 1, on splash; [B, T, N, H] in q's dtype.

  Differentiable in q, k, v and the sink (splash's own backward kernels).

  Args:
    q_BTNH: queries, already scaled.
    k_BSKH: keys; K divides N (query head n reads key/value head n // (N // K)).
    v_BSKH: values, k's shape.
    is_causal: query i sees keys j <= i only (top-left aligned, also for T != S).
    kv_mask_BS: boolean [B, S], True = the key is visible to every query
      (padding); None = all visible.
    logit_softcap: c > 0: logits -> c tanh(logits / c) before masking; None = off.
    sink_N: float [N], one sink logit b per query head (a scalar sink broadcast
      by the caller), or None. The output includes the sink: sum_j p_ij < 1.
    mesh: a Mesh whose axis names include `batch_axes`: the kernel runs under
      shard_map with the batch dim sharded over those axes (the product of
      their sizes must divide B), heads and the sink replicated. None: no shard_map.
    batch_axes: the mesh axes the batch dim is sharded over.
    interpret: run the kernel in the Pallas interpreter (CPU, tests); False on
      a TPU. A `pltpu.InterpretParams()` also passes through (the TPU-faithful
      interpreter, about 2x slower on CPU).

  Raises:
    ValueError: a shape `unsupported_reason` refuses, a kv_mask_BS or sink_N of
      the wrong shape, or a mesh without `batch_axes` or not dividing B.
  """
  reason = unsupported_reason(q_BTNH.shape, k_BSKH.shape, normalizer="softmax",
                              has_custom_mask=False)
  if reason is not None:
    raise ValueError(f"splash attention cannot run this call: {reason}")
  B, T, N, H = q_BTNH.shape
  S = k_BSKH.shape[1]
  if v_BSKH.shape != k_BSKH.shape:
    raise ValueError(f"k and v must have one shape, got {k_BSKH.shape} and {v_BSKH.shape}")
  if kv_mask_BS is not None and (kv_mask_BS.shape != (B, S) or kv_mask_BS.dtype != jnp.bool_):
    raise ValueError(f"kv_mask_BS must be boolean [B, S] = [{B}, {S}], got "
                     f"{kv_mask_BS.dtype} {tuple(kv_mask_BS.shape)}")
  if sink_N is not None:
    sink_N = jnp.asarray(sink_N)
    if sink_N.shape != (N,):
      raise ValueError(f"sink_N must have shape [heads] = ({N},), got {tuple(sink_N.shape)}")
    # The kernel reads the sink as float32 and returns its gradient in the sink's
    # dtype: keep that at least float32 (a bfloat16 sink would get a rounded one).
    sink_N = sink_N.astype(jnp.promote_types(sink_N.dtype, jnp.float32))
  if logit_softcap is not None:
    logit_softcap = float(logit_softcap)  # static: a constant of the kernel (and a cache key)
  attend = functools.partial(_attend, is_causal=bool(is_causal), logit_softcap=logit_softcap,
                             interpret=interpret)
  if mesh is None:
    return attend(q_BTNH, k_BSKH, v_BSKH, kv_mask_BS, sink_N)

  batch_axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
  missing = [a for a in batch_axes if a not in mesh.axis_names]
  if missing:
    raise ValueError(f"batch_axes {missing} are not axes of the mesh {mesh.axis_names}")
  shards = math.prod(mesh.shape[a] for a in batch_axes)
  if B % shards:
    raise ValueError(f"batch {B} is not divisible by the {shards} devices on mesh axes "
                     f"{batch_axes}")
  batch, replicated = PartitionSpec(batch_axes), PartitionSpec()
  # P() also stands for an absent (None) kv_mask_BS or sink_N: a None has no leaves.
  # check_vma=False: splash's pallas_calls declare outputs without the varying-axes
  # types shard_map's check needs (JAX 0.10 and 0.12 both refuse them); the
  # transpose still sums the replicated sink's gradient over the batch shards.
  sharded = jax.shard_map(
      attend, mesh=mesh,
      in_specs=(batch, batch, batch, batch if kv_mask_BS is not None else replicated,
                replicated),
      out_specs=batch, check_vma=False)
  return sharded(q_BTNH, k_BSKH, v_BSKH, kv_mask_BS, sink_N)


def _attend(q_BTNH, k_BSKH, v_BSKH, kv_mask_BS, sink_N, *, is_causal, logit_softcap,
            interpret) -> Array:
  """Pads to the kernel's tiles, vmaps the kernel over B, slices the padding off."""
  B, T, N, H = q_BTNH.shape
  S = k_BSKH.shape[1]
  X, Y, D = _round_up(T, LANES), _round_up(S, LANES), _round_up(H, HEAD_DIM_MULTIPLE)

  def to_kernel_layout(x_BLhH, length):
    # [B, len, heads, H] -> [B, heads, padded len, D], zeros appended: the kernel
    # reads [heads, len, head_dim] blocks with the head dim minor.
    x_BhLH = x_BLhH.transpose(0, 2, 1, 3)
    return jnp.pad(x_BhLH, ((0, 0), (0, 0), (0, length - x_BhLH.shape[2]), (0, D - H)))

  q_BNXD = to_kernel_layout(q_BTNH, X)
  k_BKYD = to_kernel_layout(k_BSKH, Y)
  v_BKYD = to_kernel_layout(v_BSKH, Y)

  kernel_lib, _ = _splash()
  segment_ids = None
  if kv_mask_BS is not None or Y > S:
    # Key padding and the padded keys as segment ids: every query is in segment
    # 1; a key is in segment 1 if visible, else 0, so no query sees it.
    visible_BS = jnp.ones((B, S), bool) if kv_mask_BS is None else kv_mask_BS
    kv_ids_BY = jnp.pad(visible_BS, ((0, 0), (0, Y - S))).astype(jnp.int32)
    segment_ids = kernel_lib.SegmentIds(q=jnp.ones((B, X), jnp.int32), kv=kv_ids_BY)

  kernel = _kernel(N, X, Y, is_causal, logit_softcap, interpret)

  def one_row(q_NXD, k_KYD, v_KYD, segment_ids, sink_N):
    return kernel(q_NXD, k_KYD, v_KYD, segment_ids=segment_ids, sinks=sink_N)

  # The kernel takes one batch row; splash's custom VJP batches under vmap (the
  # sink's gradient is summed over B).
  z_BNXD = jax.vmap(one_row, in_axes=(0, 0, 0, None if segment_ids is None else 0, None))(
      q_BNXD, k_BKYD, v_BKYD, segment_ids, sink_N)
  return z_BNXD[:, :, :T, :H].transpose(0, 2, 1, 3).astype(q_BTNH.dtype)
