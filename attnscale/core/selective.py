"""Selective attention's logit bias: what earlier queries chose to forget.

    S_kj = relu(l0_kj)   for keys 0 < j < k that query k sees, else 0
    F_ij = sum_{k < i} S_kj
    l_ij -> l_ij - F_ij   in every head, before the normaliser

Leviathan, Kalman & Matias 2024, "Selective Attention Improves Transformer", arXiv
2410.02703 (their Listing 1): head 0's logits l0 (as the scaling makes them, after
any per-pair transform and soft-cap, before FoX's bias) select; a query k that
scores key j highly masks j for every later query i > k, in every head. The first
key (<BOS> in the paper) and a query's own key are never masked (S_k0 = S_kk = 0),
and S_kj = 0 for a key query k does not see (causality, padding); F_ii = F_i0 = 0.
The selection is not detached: gradients reach head 0's q and k through F.

Cost: F is a [B, T, S] array per layer, not a per-key vector as FoX's gate, so it
cannot be built inside a flash kernel's tiles from O(B T) inputs. `attention`
computes head 0's logits once more (O(B T S H) FLOPs, 1/N of the logits' work)
and F from them (O(B T S) memory per layer, kept for the backward pass), and
adds -F to the logits of the XLA kernel's causal blocks (or of the reference's
one T x S block). Splash and cuDNN take no [T, S] bias here: refused in one line.

Dimension legend: B batch, T query length, S key length (T = S: causal self-attention).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def selection_bias(logits0_BTS: Array, visible_BTS: Array) -> Array:
  """F [B, T, S] in float32 from head 0's logits and which keys each query sees.

  S = relu(l0) where visible, 0 on the first key and on the diagonal; F is S's
  cumulative sum over the queries, shifted by one (F_i = sum of S_k over k < i),
  so no query's own logits enter its own bias.
  """
  T, S = logits0_BTS.shape[-2:]
  i_1T1, j_11S = jnp.arange(T).reshape(1, T, 1), jnp.arange(S).reshape(1, 1, S)
  keep_BTS = visible_BTS & (j_11S > 0) & (j_11S != i_1T1)
  s_BTS = jnp.where(keep_BTS, jax.nn.relu(logits0_BTS.astype(jnp.float32)), 0.0)
  inclusive_BTS = jnp.cumsum(s_BTS, axis=-2)
  return jnp.concatenate([jnp.zeros_like(inclusive_BTS[..., :1, :]),
                          inclusive_BTS[..., :-1, :]], axis=-2)


def visible_BTS(mask_BNTS: Array | None, T: int, S: int) -> Array:
  """Which keys head 0's queries see under causality and `mask_BNTS` ([B|1, T, S])."""
  visible_1TS = jnp.tril(jnp.ones((T, S), bool))[None]
  return visible_1TS if mask_BNTS is None else visible_1TS & mask_BNTS[:, 0]


def head0_bias(q_BTNH: Array, k_BSKH: Array, mask_BNTS: Array | None,
               logit_softcap: float | None = None, logit_mod=None) -> Array:
  """-F [B, T, S] from head 0 of q and k already scaled (the fused path's folded q):
  its logits made as the XLA kernel makes them (products in the inputs' dtype,
  float32 accumulation; then the per-pair transform and the soft-cap)."""
  T, S = q_BTNH.shape[1], k_BSKH.shape[1]
  acc = jnp.promote_types(q_BTNH.dtype, jnp.float32)
  l_BTS = jnp.einsum("bth,bsh->bts", q_BTNH[:, :, 0], k_BSKH[:, :, 0],
                     preferred_element_type=acc)
  if logit_mod is not None:
    l_BTS = logit_mod(l_BTS, jnp.arange(T).reshape(1, T, 1), jnp.arange(S).reshape(1, 1, S))
  if logit_softcap is not None:
    l_BTS = jnp.tanh(l_BTS / logit_softcap) * logit_softcap
  return -selection_bias(l_BTS, visible_BTS(mask_BNTS, T, S))
