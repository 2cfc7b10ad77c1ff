"""The fused path's XLA kernel: softmax(q k^T) v with causal blocks and matmul-friendly layouts.

    z_i = sum_j p_ij v_j,   p_i = softmax_j(l_ij)   over the keys j query i sees,
    l_ij = cap(mod_ij(q_i . k_j)) + b_i

The scale is already folded into q (`attnscale.core.fused`), so this is scaling-free.
Options `attention` uses: `logit_softcap` c, cap(x) = c tanh(x / c) (Gemma 2),
applied to the scaled logits before masking; a per-query logit bias b_i
(`logit_bias_BTN`); a per-pair transform mod_ij (`logit_mod`, scale-invariant
attention's multiply and shift by the distance i - j); normalizer="sigmoid", p_ij = sigmoid(l_ij) with no row
normalisation (Ramapuram et al. 2024; `attention` passes b_i = -log n_i), where
an invisible key's weight is exactly 0; and `return_lse`, which also returns
lse_i = log sum_j exp(l_ij) over the visible keys, from which `attention`
applies an attention sink (sum_j p_ij = sigmoid(lse_i - b) with a sink logit b).
It is what `attention(..., implementation="xla")` runs, and what the default runs
wherever cuDNN does not (CPU, TPU, and GPU shapes cuDNN refuses). It replaces
`jax.nn.dot_product_attention(implementation="xla")` because that one is slow on
CPU: its `BTNH,BSNH->BNTS` einsums leave XLA transposing inside batched dots;
here q, k and v are moved to [B, K, G, T, H] / [B, K, S, H] once, so every
product is a plain batched matmul (8.0 ms against 24.2 ms forward + backward at
B=32, T=128, N=4, H=32 on 2 CPU cores, without causal blocks; 5.8 ms with them;
`benchmarks/attention.py` compares the two kernels at other shapes).

Causal attention skips the blocks above the diagonal: the queries are cut into
blocks of `block_q` rows, and block [t0, t1) only meets keys [0, t1), so about
half the T x S products and softmax work disappear for long sequences (that is
the point of flash attention's causal tiling, here at the XLA level: each block's
logits are still materialised, [B, N, t1 - t0, t1]).

Numerics: logits and softmax in float32 (or wider) whatever the input dtype; the
products take the input dtype with float32 accumulation, so bfloat16 runs as on
a GPU's tensor cores. Under softmax, invisible keys get the dtype's lowest
finite value, not -inf, so a query that sees no key gets a uniform average
instead of NaN (the caller zeroes it: `attention` multiplies such rows by 0).
Under sigmoid they get weight 0, selected after the sigmoid, so such a row is 0.
Sigmoid has no row normalisation, so each causal block is complete on its own
and its backward pass has no row reduction (FlashSigmoid's argument, Ramapuram
et al. 2024).
The other normalisers (`attnscale.core.normalizers`: softpick, ReLU/L,
stick-breaking) normalise each row over its own visible keys, which a causal
block holds whole, so they run blockwise as softmax does, by autodiff; FoX's
forget gate (`log_forget_BTN`) adds its bias D_ij = c_i - c_j per block.

The backward pass of plain softmax attention (no soft-cap, bias, lse or stats:
what every scaling runs by default) is written by hand (`_softmax_attention`,
FlashAttention's, Dao et al. 2022, Algorithm 2 / eq. 4):

    dv_j = sum_i p_ij dz_i,   dp_ij = dz_i . v_j,
    dl_ij = p_ij (dp_ij - D_i),   D_i = sum_j p_ij dp_ij = dz_i . z_i,
    dq_i = sum_j dl_ij k_j,   dk_j = sum_i dl_ij q_i

D_i is a dot product over H (here 32) instead of autodiff's row sum over the
keys, and no select runs backward for the causal mask (p_ij = 0 already):
21.2 ms against 26.4 forward + backward at B=32, T=128, N=4, H=32 (one CPU
core, medians of interleaved runs; autodiff's row sums ran as YNNPACK
reductions at 2-4 ns an element; docs/benchmarks.md). Same forward ops
and bits; the gradients differ from autodiff's in rounding only (D_i is summed
in another order, and in bf16 from z, which used p rounded to bf16).

Dimension legend: B batch, T query length, S key/value length, N query heads,
K key/value heads, G = N // K query heads per key/value head, H head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from attnscale.core import normalizers

Array = jax.Array

# Causal blocks: at least MIN_BLOCK_Q query rows each (2 CPU cores: T=128 ran
# fastest as 4 blocks of 32, 5.8 ms against 8.0 unblocked, forward + backward),
# and at most MAX_BLOCKS of them: n blocks skip (n - 1) / 2n of the T x S work, so
# 8 already skip 44% (of the 50% possible), and every block is one more pair of
# products in the program (compile time).
MIN_BLOCK_Q = 32
MAX_BLOCKS = 8


def default_block_q(T: int) -> int:
  """Query rows per causal block for a sequence of length T."""
  return max(MIN_BLOCK_Q, -(-T // MAX_BLOCKS))


def causal_blocks(T: int, S: int, block_q: int) -> list[tuple[int, int, int]]:
  """(t0, t1, s1) per query block: rows [t0, t1) see keys [0, s1) and no later one.

  Top-left aligned causality (query i sees keys j <= i), so s1 = min(t1, S).
  Blocks are as equal as possible, none shorter than block_q / 2 unless T is.
  """
  num = max(1, round(T / block_q))
  edges = [round(i * T / num) for i in range(num + 1)]
  return [(t0, t1, min(t1, S)) for t0, t1 in zip(edges[:-1], edges[1:]) if t1 > t0]


NORMALIZERS = ("softmax", "sigmoid", *normalizers.ROW_NORMALIZERS)


def dot_product_attention(q_BTNH: Array,
                          k_BSKH: Array,
                          v_BSKH: Array,
                          mask_BNTS: Array | None = None,
                          is_causal: bool = False,
                          block_q: int | None = None,
                          *,
                          normalizer: str = "softmax",
                          logit_softcap: float | None = None,
                          logit_bias_BTN: Array | None = None,
                          log_forget_BTN: Array | None = None,
                          logit_bias_BTS: Array | None = None,
                          logit_mod=None,
                          return_lse: bool = False,
                          return_stats: bool = False,
                          batch_chunk: int | None = None):
  """softmax(q k^T) v over the visible keys, scale 1; [B, T, N, H] in q's dtype.

  Args:
    q_BTNH: queries, already scaled.
    k_BSKH: keys; K divides N (query head n reads key/value head n // G).
    v_BSKH: values, k's shape but for the head dim, which may differ (the
      output has v's head dim).
    mask_BNTS: boolean, rank 4, broadcastable to [B, N, T, S]; True = visible.
    is_causal: query i sees keys j <= i only.
    block_q: query rows per causal block (None: `default_block_q(T)`).
    normalizer: "softmax", or "sigmoid": p_ij = sigmoid(l_ij), each weight on
      its own (no row sum), exactly 0 for an invisible key, or one of
      `normalizers.ROW_NORMALIZERS` ("softpick", "relu", "stickbreaking"), each
      row's weights from that row's visible logits (complete in every causal block).
    logit_softcap: c > 0: logits -> c * tanh(logits / c) before the bias and
      the mask (Gemma 2); None = off.
    logit_bias_BTN: float, [B|1, T, N]: b_i added to query i's logits (after
      the soft-cap); a softmax cancels it except in lse. None = 0.
    log_forget_BTN: float, [B|1, T, N], causal self-attention only (T = S):
      FoX's per-position log forget gate log f_t (Lin et al. 2025); adds
      D_ij = sum_{l=j+1}^{i} log f_l to l_ij after the bias
      (`normalizers.forget_bias`). None = off.
    logit_bias_BTS: float, [B|1, T, S]: b_ij added to every head's l_ij after the
      soft-cap (selective attention's -F, `attnscale.core.selective`), sliced per
      causal block. None = off.
    logit_mod: `f(logits, i, j)` applied to each block's logits before the
      soft-cap, i and j the query and key positions (int arrays of the logits'
      rank, broadcasting against them); a scaling's per-pair transform
      (`ScaleInvariant.logit_mod`). None = identity.
    return_lse: softmax only: also return lse_i = log sum_j exp(l_ij) over the
      visible keys, [B, T, N] in float32 (or wider). A query that sees no key
      gets about the dtype's lowest value (its sink factor sigmoid(lse - b) is 0).
    return_stats: also return (row_max_BTN, entropy_BTN), float32, without
      gradient: row_max_i = max_j l_ij over the visible keys (with the bias b_i;
      about the dtype's lowest value for a query that sees no key), and under
      softmax H_i = -sum_j p_ij log p_ij = lse_i - sum_j p_ij l_ij, under
      any other normaliser -sum_j p_ij log p_ij of its weights. Both from each
      causal block's logits, which exist anyway: no T x S array beyond them.
    batch_chunk: rows of the batch per pass (`in_batch_chunks`: a `lax.map`
      over groups of rows, so one group's logits stay in cache; the CPU default
      is `default_batch_chunk`); None = the whole batch at once.

  Returns:
    z_BTNH, then lse_BTN with `return_lse`, then (row_max_BTN, entropy_BTN)
    with `return_stats` (a tuple when either is asked for).
  """
  if normalizer not in NORMALIZERS:
    raise ValueError(f"normalizer must be one of {NORMALIZERS}, got {normalizer!r}")
  rows = q_BTNH.shape[0]
  if batch_chunk is not None and _divisor_at_most(rows, batch_chunk) < rows:
    kernel = functools.partial(
        dot_product_attention, is_causal=is_causal, block_q=block_q, normalizer=normalizer,
        logit_softcap=logit_softcap, logit_mod=logit_mod, return_lse=return_lse,
        return_stats=return_stats)
    return in_batch_chunks(kernel, batch_chunk, q_BTNH, k_BSKH, v_BSKH, mask_BNTS=mask_BNTS,
                           logit_bias_BTN=logit_bias_BTN, log_forget_BTN=log_forget_BTN,
                           logit_bias_BTS=logit_bias_BTS)
  if return_lse and normalizer != "softmax":
    raise ValueError(f"return_lse needs normalizer='softmax', got {normalizer!r}")
  B, T, N, H = q_BTNH.shape
  S, K = k_BSKH.shape[1], k_BSKH.shape[2]
  G = N // K
  dtype = q_BTNH.dtype
  acc = jnp.promote_types(dtype, jnp.float32)  # accumulation and softmax precision
  block_q = block_q or default_block_q(T)
  if log_forget_BTN is not None and not (is_causal and T == S):
    raise ValueError(f"log_forget_BTN needs causal self-attention (is_causal=True, q_len = "
                     f"kv_len), got is_causal={is_causal}, q_len {T}, kv_len {S}")
  if (normalizer == "softmax" and logit_softcap is None and logit_bias_BTN is None
      and log_forget_BTN is None and logit_bias_BTS is None and logit_mod is None
      and not (return_lse or return_stats)):
    return _softmax_attention(q_BTNH, k_BSKH, v_BSKH, mask_BNTS, is_causal, block_q)
  q_BKGTH, k_BKSH, v_BKSH, mask_BKGTS = _to_heads(q_BTNH, k_BSKH, v_BSKH, mask_BNTS)
  bias_BKGT1 = None
  if logit_bias_BTN is not None:
    bB = logit_bias_BTN.shape[0]
    bias_BKGT1 = (logit_bias_BTN.astype(acc).reshape(bB, T, K, G)
                  .transpose(0, 2, 3, 1)[..., None])
  log_forget_BKGT = None
  if log_forget_BTN is not None:
    fB = log_forget_BTN.shape[0]
    log_forget_BKGT = log_forget_BTN.reshape(fB, T, K, G).transpose(0, 2, 3, 1)

  z_blocks, lse_blocks, max_blocks, entropy_blocks = [], [], [], []
  for t0, t1, s1 in _blocks(T, S, block_q, is_causal):
    logits_BKGtS = _block_logits(q_BKGTH, k_BKSH, t0, t1, s1)
    if logit_mod is not None:
      logits_BKGtS = logit_mod(logits_BKGtS, jnp.arange(t0, t1).reshape(1, 1, 1, -1, 1),
                               jnp.arange(s1).reshape(1, 1, 1, 1, -1))
    if logit_softcap is not None:
      logits_BKGtS = jnp.tanh(logits_BKGtS / logit_softcap) * logit_softcap
    if bias_BKGT1 is not None:
      logits_BKGtS = logits_BKGtS + bias_BKGT1[:, :, :, t0:t1]
    if log_forget_BKGT is not None:
      logits_BKGtS = logits_BKGtS + normalizers.forget_bias(log_forget_BKGT, t0, t1, s1)
    if logit_bias_BTS is not None:  # one [t, s] bias for every head
      logits_BKGtS = logits_BKGtS + logit_bias_BTS[:, None, None, t0:t1, :s1].astype(acc)
    visible = _block_visible(mask_BKGTS, is_causal, t0, t1, s1)
    if normalizer in normalizers.ROW_NORMALIZERS:
      p_BKGtS = normalizers.weights(normalizer, logits_BKGtS, visible)
      if return_stats:
        max_BKGt, entropy_BKGt = normalizers.row_stats(logits_BKGtS, p_BKGtS, visible)
        max_blocks.append(max_BKGt)
        entropy_blocks.append(entropy_BKGt)
    elif normalizer == "sigmoid":
      # No row sum: a block is complete on its own. Invisible keys weigh exactly
      # 0 (selected after the sigmoid, so no "lowest value" can leak through).
      p_BKGtS = jax.nn.sigmoid(logits_BKGtS)
      if visible is not None:
        p_BKGtS = jnp.where(visible, p_BKGtS, 0.0)
      if return_stats:
        max_blocks.append(_sigmoid_row_max(logits_BKGtS, visible))
        entropy_blocks.append(_sigmoid_plogp_sum(logits_BKGtS, p_BKGtS))
    else:
      if visible is not None:
        logits_BKGtS = jnp.where(visible, logits_BKGtS, jnp.finfo(logits_BKGtS.dtype).min)
      if return_lse or return_stats:
        p_BKGtS, lse_BKGt = _softmax_and_lse(logits_BKGtS)
        lse_blocks.append(lse_BKGt)
      else:
        p_BKGtS = jax.nn.softmax(logits_BKGtS, axis=-1)
      if return_stats:
        max_BKGt, entropy_BKGt = _softmax_row_stats(logits_BKGtS, p_BKGtS, lse_BKGt)
        max_blocks.append(max_BKGt)
        entropy_blocks.append(entropy_BKGt)
    z_blocks.append(jnp.einsum("bkgts,bksh->bkgth", p_BKGtS.astype(dtype), v_BKSH[:, :, :s1],
                               preferred_element_type=acc))
  z_BTNH = _from_heads(_concat_rows(z_blocks)).astype(dtype)
  if not (return_lse or return_stats):
    return z_BTNH

  def per_query(blocks):
    x_BKGT = blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis=3)
    return x_BKGT.transpose(0, 3, 1, 2).reshape(B, T, N)

  out = (z_BTNH,)
  if return_lse:
    out += (per_query(lse_blocks),)
  if return_stats:
    out += ((per_query(max_blocks), per_query(entropy_blocks)),)
  return out


# On CPU, bidirectional attention takes the rows of the batch in groups whose
# float32 logits, [rows, N, T, S], fill at most this many bytes
# (`default_batch_chunk`; `fused.cpu_batch_chunk` decides where): a group's
# logits, p and their gradients then stay in a core's L2 cache (512 KiB to 2 MiB
# on x86 server cores) across the softmax and the products, instead of streaming
# [B, N, T, S] through L3 pass after pass. At the small BERT's shape (B=32,
# T=S=128, N=4, H=32: groups of 2) forward + backward took 33 ms a layer against
# 44 for the whole batch (one AMD EPYC core, quiet, medians of 12), and its train
# step 5-8% less (docs/benchmarks.md).
CPU_CHUNK_BYTES = 512 * 1024


def default_batch_chunk(B: int, N: int, T: int, S: int) -> int:
  """Rows per group on CPU: the most whose [rows, N, T, S] float32 logits fit
  CPU_CHUNK_BYTES, at least 1, at most B."""
  return max(1, min(B, CPU_CHUNK_BYTES // max(1, N * T * S * 4)))


def _divisor_at_most(B: int, chunk: int) -> int:
  """The largest divisor of B that is at most `chunk` (at least 1)."""
  chunk = max(1, min(B, chunk))
  while B % chunk:
    chunk -= 1
  return chunk


def in_batch_chunks(kernel, batch_chunk, q_BTNH, k_BSKH, v_BSKH, *, mask_BNTS=None,
                    logit_bias_BTN=None, log_forget_BTN=None, logit_bias_BTS=None):
  """`kernel(q, k, v, mask, logit_bias_BTN=..., log_forget_BTN=..., logit_bias_BTS=...)`
  over groups of c batch rows, c the
  largest divisor of B at most `batch_chunk`, one group a step of a `lax.map`;
  the outputs (any pytree of [B, ...] arrays) put back together as [B, ...].

  Each row's attention is its own, so this computes what one call computes; only
  the products' shapes change (XLA may round them differently). A mask, bias or
  log forget gate with a leading 1 (shared by every row) is passed whole to each group.
  """
  B = q_BTNH.shape[0]
  c = _divisor_at_most(B, batch_chunk)
  grouped = lambda x: x.reshape(B // c, c, *x.shape[1:])
  per_row = {"q": q_BTNH, "k": k_BSKH, "v": v_BSKH}
  shared = {"mask": mask_BNTS, "bias": logit_bias_BTN, "forget": log_forget_BTN,
            "pair_bias": logit_bias_BTS}
  for name in ("mask", "bias", "forget", "pair_bias"):
    if shared[name] is not None and shared[name].shape[0] == B:
      per_row[name] = shared.pop(name)

  def group(xs):
    x = {**shared, **xs}
    return kernel(x["q"], x["k"], x["v"], x.get("mask"), logit_bias_BTN=x.get("bias"),
                  log_forget_BTN=x.get("forget"), logit_bias_BTS=x.get("pair_bias"))

  out = jax.lax.map(group, {name: grouped(x) for name, x in per_row.items()})
  return jax.tree.map(lambda x: x.reshape(B, *x.shape[2:]), out)


def _to_heads(q_BTNH, k_BSKH, v_BSKH, mask_BNTS):
  """q [B, K, G, T, H], k and v [B, K, S, H], the mask [B|1, K|1, G|1, T|1, S].

  One transpose each, so that every product is a batched matmul over (B, K).
  """
  B, T, N, H = q_BTNH.shape
  K = k_BSKH.shape[2]
  q_BKGTH = q_BTNH.reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)
  mask_BKGTS = None
  if mask_BNTS is not None:
    mB, mN, mT, mS = mask_BNTS.shape
    mask_BKGTS = (mask_BNTS.reshape(mB, K, N // K, mT, mS) if mN == N
                  else mask_BNTS.reshape(mB, 1, 1, mT, mS))
  return q_BKGTH, k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3), mask_BKGTS


def _from_heads(x_BKGTH):
  """[B, K, G, T, H] -> [B, T, N, H]."""
  B, K, G, T, H = x_BKGTH.shape
  return x_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, K * G, H)


def _concat_rows(blocks_BKGtX):
  """The query blocks' rows, [B, K, G, t, X] each, as one [B, K, G, T, X]."""
  return blocks_BKGtX[0] if len(blocks_BKGtX) == 1 else jnp.concatenate(blocks_BKGtX, axis=3)


def _blocks(T, S, block_q, is_causal):
  return causal_blocks(T, S, block_q) if is_causal else [(0, T, S)]


def _block_logits(q_BKGTH, k_BKSH, t0, t1, s1):
  """q_i . k_j for rows [t0, t1) and keys [0, s1), in float32 (or wider)."""
  acc = jnp.promote_types(q_BKGTH.dtype, jnp.float32)
  return jnp.einsum("bkgth,bksh->bkgts", q_BKGTH[:, :, :, t0:t1], k_BKSH[:, :, :s1],
                    preferred_element_type=acc)


def _block_visible(mask_BKGTS, is_causal, t0, t1, s1):
  """Which keys rows [t0, t1) see, broadcastable to [B, K, G, t, s1]; None = all."""
  visible = None
  if is_causal:
    # Only the diagonal part of the block has invisible keys; iota, no T x S constant.
    rows_t1 = jax.lax.broadcasted_iota(jnp.int32, (t1 - t0, 1), 0) + t0
    cols_1S = jax.lax.broadcasted_iota(jnp.int32, (1, s1), 1)
    visible = (cols_1S <= rows_t1)[None, None, None]
  if mask_BKGTS is not None:
    m = mask_BKGTS[..., :s1]
    m = m if m.shape[3] == 1 else m[:, :, :, t0:t1]
    visible = m if visible is None else visible & m
  return visible


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _softmax_attention(q_BTNH, k_BSKH, v_BSKH, mask_BNTS, is_causal, block_q):
  """Plain softmax attention (`dot_product_attention` without options), [B, T, N, H].

  Its forward pass is the general path's ops; its backward pass is written by
  hand (the module docstring's equations).
  """
  return _softmax_attention_fwd(q_BTNH, k_BSKH, v_BSKH, mask_BNTS, is_causal, block_q)[0]


def _softmax_attention_fwd(q_BTNH, k_BSKH, v_BSKH, mask_BNTS, is_causal, block_q):
  """(z_BTNH, residuals): each block's p (float32) and z before its cast to q's dtype."""
  T, S = q_BTNH.shape[1], k_BSKH.shape[1]
  dtype = q_BTNH.dtype
  acc = jnp.promote_types(dtype, jnp.float32)
  q_BKGTH, k_BKSH, v_BKSH, mask_BKGTS = _to_heads(q_BTNH, k_BSKH, v_BSKH, mask_BNTS)
  p_blocks, z_blocks = [], []
  for t0, t1, s1 in _blocks(T, S, block_q, is_causal):
    logits_BKGtS = _block_logits(q_BKGTH, k_BKSH, t0, t1, s1)
    visible = _block_visible(mask_BKGTS, is_causal, t0, t1, s1)
    if visible is not None:
      logits_BKGtS = jnp.where(visible, logits_BKGtS, jnp.finfo(logits_BKGtS.dtype).min)
    p_BKGtS = jax.nn.softmax(logits_BKGtS, axis=-1)
    z_blocks.append(jnp.einsum("bkgts,bksh->bkgth", p_BKGtS.astype(dtype), v_BKSH[:, :, :s1],
                               preferred_element_type=acc))
    p_blocks.append(p_BKGtS)
  z_BKGTH = _concat_rows(z_blocks)
  residuals = (q_BKGTH, k_BKSH, v_BKSH, mask_BKGTS, tuple(p_blocks), z_BKGTH)
  return _from_heads(z_BKGTH).astype(dtype), residuals


def _softmax_attention_bwd(is_causal, block_q, residuals, dz_BTNH):
  """(dq, dk, dv, None): FlashAttention's backward pass over the saved p of each block.

  Products take q's dtype with float32 accumulation, as forward; p, dp and dl
  stay float32. An invisible key has p_ij = 0, so dl_ij = 0 with no select;
  only a row that sees no key (a uniform p, under a mask) needs one, as the
  forward's select zeroes its logits' gradient.
  """
  q_BKGTH, k_BKSH, v_BKSH, mask_BKGTS, p_blocks, z_BKGTH = residuals
  B, K, G, T, H = q_BKGTH.shape
  S = k_BKSH.shape[2]
  dtype = q_BKGTH.dtype
  acc = z_BKGTH.dtype
  # The value dim may differ from q's (differential attention's values: 2 H).
  dz_BKGTH = dz_BTNH.reshape(B, T, K, G, dz_BTNH.shape[-1]).transpose(0, 2, 3, 1, 4)
  # D_i = sum_j p_ij dp_ij = dz_i . z_i: a sum over H, not over the keys.
  d_BKGT1 = jnp.sum(dz_BKGTH.astype(acc) * z_BKGTH, axis=-1, keepdims=True)
  dk_BKSH = jnp.zeros(k_BKSH.shape, acc)
  dv_BKSH = jnp.zeros(v_BKSH.shape, acc)
  dq_blocks = []
  for (t0, t1, s1), p_BKGtS in zip(_blocks(T, S, block_q, is_causal), p_blocks):
    dz_BKGtH = dz_BKGTH[:, :, :, t0:t1]
    dv_BKSH = dv_BKSH.at[:, :, :s1].add(jnp.einsum(
        "bkgts,bkgth->bksh", p_BKGtS.astype(dtype), dz_BKGtH, preferred_element_type=acc))
    dp_BKGtS = jnp.einsum("bkgth,bksh->bkgts", dz_BKGtH, v_BKSH[:, :, :s1],
                          preferred_element_type=acc)
    dl_BKGtS = p_BKGtS * (dp_BKGtS - d_BKGT1[:, :, :, t0:t1])
    if mask_BKGTS is not None:
      dl_BKGtS = jnp.where(_block_visible(mask_BKGTS, is_causal, t0, t1, s1), dl_BKGtS, 0.0)
    dl_BKGtS = dl_BKGtS.astype(dtype)
    dq_blocks.append(jnp.einsum("bkgts,bksh->bkgth", dl_BKGtS, k_BKSH[:, :, :s1],
                                preferred_element_type=acc))
    dk_BKSH = dk_BKSH.at[:, :, :s1].add(jnp.einsum(
        "bkgts,bkgth->bksh", dl_BKGtS, q_BKGTH[:, :, :, t0:t1], preferred_element_type=acc))
  dq_BTNH = _from_heads(_concat_rows(dq_blocks)).astype(dtype)
  to_BSKH = lambda x_BKSH: x_BKSH.transpose(0, 2, 1, 3).astype(dtype)
  return dq_BTNH, to_BSKH(dk_BKSH), to_BSKH(dv_BKSH), None


_softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)


def _softmax_row_stats(logits_BKGtS, p_BKGtS, lse_BKGt):
  """(max_j l_ij, H_i = lse_i - sum_j p_ij l_ij) of one block, without gradient.

  Shifted by the row max m_i, H_i = (lse_i - m_i) - sum_j p_ij (l_ij - m_i), so a
  large logit costs no precision (the terms stay O(log S), not O(l)). Invisible
  keys hold the lowest finite value and weigh p = 0 exactly.
  """
  l_BKGtS = jax.lax.stop_gradient(logits_BKGtS)
  p_BKGtS = jax.lax.stop_gradient(p_BKGtS)
  max_BKGt1 = jnp.max(l_BKGtS, axis=-1, keepdims=True)
  mean_shifted_BKGt = jnp.sum(p_BKGtS * (l_BKGtS - max_BKGt1), axis=-1)
  lse_shifted_BKGt = jax.lax.stop_gradient(lse_BKGt) - max_BKGt1[..., 0]
  return max_BKGt1[..., 0], jnp.maximum(lse_shifted_BKGt - mean_shifted_BKGt, 0.0)


def _sigmoid_row_max(logits_BKGtS, visible):
  """max_j l_ij over the visible keys of one block (the lowest value if none)."""
  l_BKGtS = jax.lax.stop_gradient(logits_BKGtS)
  if visible is not None:
    l_BKGtS = jnp.where(visible, l_BKGtS, jnp.finfo(l_BKGtS.dtype).min)
  return jnp.max(l_BKGtS, axis=-1)


def _sigmoid_plogp_sum(logits_BKGtS, p_BKGtS):
  """-sum_j p_ij log p_ij of one block's sigmoid weights (0 where p = 0: invisible)."""
  l_BKGtS = jax.lax.stop_gradient(logits_BKGtS)
  p_BKGtS = jax.lax.stop_gradient(p_BKGtS)
  return -jnp.sum(jnp.where(p_BKGtS > 0, p_BKGtS * jax.nn.log_sigmoid(l_BKGtS), 0.0), axis=-1)


@jax.custom_jvp
def _softmax_and_lse(x_XS: Array) -> tuple[Array, Array]:
  """(softmax(x), logsumexp(x)) over the last axis, sharing one exp and one sum.

  The JVP is jax.nn.softmax's, p * (dx - <p, dx>), plus d lse = <p, dx>: the
  same backward pass as the plain softmax, and one more [.., 1] term.
  """
  max_X1 = jnp.max(x_XS, axis=-1, keepdims=True)
  e_XS = jnp.exp(x_XS - max_X1)
  sum_X1 = jnp.sum(e_XS, axis=-1, keepdims=True)
  return e_XS / sum_X1, (max_X1 + jnp.log(sum_X1))[..., 0]


@_softmax_and_lse.defjvp
def _softmax_and_lse_jvp(primals, tangents):
  (x_XS,), (dx_XS,) = primals, tangents
  p_XS, lse_X = _softmax_and_lse(x_XS)
  dlse_X1 = jnp.sum(p_XS * dx_XS, axis=-1, keepdims=True)
  return (p_XS, lse_X), (p_XS * (dx_XS - dlse_X1), dlse_X1[..., 0])
