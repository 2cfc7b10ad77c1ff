"""Which keys each query may see, and per-query sums over exactly those keys.

Dimension legend (as in `jax.nn.dot_product_attention`):
  B batch, T query length, S key/value length, N query heads, K key/value heads,
  G = N // K query heads per key/value head, H head dim.

Causality is part of a scaling's definition (docs/science.md, "The causal rule"): any per-query quantity,
such as a sum of key norms or the number of keys n_i, must use only the keys that
query i may attend to. A sum over all keys would leak the future into a causal
model. `VisibleKeys.sum` is the one place where that rule is implemented; every
scaling goes through it. It never builds a T x S array unless the caller's mask
already is one (a custom pattern); causal and padding masks cost O(B S N).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def upcast(x) -> jax.Array:
  """At least float32 (bf16/fp16 -> float32, float64 stays): the math precision."""
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


@dataclasses.dataclass(frozen=True)
class VisibleKeys:
  """The keys visible to each query: a boolean mask and/or causality.

  Attributes:
    mask_BNTS: boolean mask broadcastable to [B, N, T, S] (rank 4 after
      `attention` normalised it), True = may attend; None = all keys.
    is_causal: query i sees key j only if j <= i (top-left aligned, as in
      `jax.nn.dot_product_attention`).
    q_len: T.
    kv_len: S.
    num_heads: N (query heads).
    num_kv_heads: K.
  """

  mask_BNTS: jax.Array | None
  is_causal: bool
  q_len: int
  kv_len: int
  num_heads: int
  num_kv_heads: int

  def sum(self, x_BSK: jax.Array) -> jax.Array:
    """Sums a per-key quantity over the keys each query sees.

    Args:
      x_BSK: a per-key quantity, for example key norms, shape [B, S, K]
        (or [B, S, N]: already per query head).

    Returns:
      [B, T, N], at least float32: out[b, i, n] = sum over keys j visible to query i of
      head n of x[b, j, kv_head(n)].
    """
    x_BSN = self._to_query_heads(upcast(x_BSK))
    T, S = self.q_len, self.kv_len
    mask = self.mask_BNTS
    if mask is not None and mask.shape[2] != 1:
      # A custom per-query pattern: the caller's mask is T x S already.
      if self.is_causal:
        mask = mask & jnp.tril(jnp.ones((T, S), bool))[None, None]
      mask_BNTS = jnp.broadcast_to(mask, (x_BSN.shape[0], self.num_heads, T, S))
      return jnp.einsum("bnts,bsn->btn", mask_BNTS.astype(x_BSN.dtype), x_BSN)
    if mask is not None:
      # A key (padding) mask [B|1, N|1, 1, S]: zero the invisible keys first.
      x_BSN = x_BSN * jnp.swapaxes(mask[:, :, 0, :], 1, 2)
    if not self.is_causal:
      return jnp.broadcast_to(x_BSN.sum(axis=1, keepdims=True),
                              (x_BSN.shape[0], T, self.num_heads))
    # Causal: query i sees keys 0..i, a prefix sum. Queries past the last key
    # (T > S) see all S keys.
    prefix_BSN = jnp.cumsum(x_BSN, axis=1)
    last_T = jnp.minimum(jnp.arange(T), S - 1)
    return prefix_BSN[:, last_T, :]

  def count(self) -> jax.Array:
    """n_i: the number of keys each query sees, [B|1, T, N] float32."""
    if self.mask_BNTS is None:
      if not self.is_causal:
        return jnp.full((1, self.q_len, self.num_heads), float(self.kv_len))
      n_T = jnp.minimum(jnp.arange(1, self.q_len + 1), self.kv_len)
      return jnp.broadcast_to(n_T.astype(jnp.float32)[None, :, None],
                              (1, self.q_len, self.num_heads))
    batch = self.mask_BNTS.shape[0]
    return self.sum(jnp.ones((batch, self.kv_len, self.num_heads)))

  def _to_query_heads(self, x_BSK: jax.Array) -> jax.Array:
    # jax.nn.dot_product_attention groups query heads as n = k * G + g, so
    # query head n reads key/value head n // G.
    if x_BSK.shape[-1] == self.num_heads:
      return x_BSK
    return jnp.repeat(x_BSK, self.num_heads // self.num_kv_heads, axis=-1)
