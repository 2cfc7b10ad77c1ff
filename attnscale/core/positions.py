"""Position information: learned absolute embeddings, rotary embeddings, or none.

`model.positions` picks one:

* "learned" (nanoGPT, BERT): a trained vector per position added to the token
  embedding. It cannot run past `model.block_size`, the table's length.
* "rope": rotary position embeddings (Su et al. 2021, "RoFormer", arXiv
  2104.09864) rotate q and k by angles proportional to their positions, so
  q_i . k_j depends on i - j only. Applied before the scaling sees q and k, so
  every scaling (key norms, cosine, log n) sees the vectors the logits use; the
  rotation keeps norms, so a norm-based scaling is unchanged by it.
* "none" (NoPE; Haviv et al. 2022, "Transformer Language Models without
  Positional Encodings Still Learn Positional Information", arXiv 2203.16634;
  Kazemnejad et al. 2023, arXiv 2305.19466): a causal model infers positions
  from its mask. A bidirectional encoder cannot, so BERT refuses it.

Dimension legend: B batch, T sequence, N heads, H head dim (even for rope).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnscale.core.visibility import upcast

POSITIONS = ("learned", "rope", "none")


def rope_frequencies(head_dim: int, base: float = 10000.0) -> jax.Array:
  """theta_m = base^(-2m/H) for m = 0 .. H/2 - 1, float32 [H/2]."""
  return base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def rope(x_BTNH: jax.Array, positions_T: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotary embedding of x at integer positions, in x's dtype (the math in float32).

  The head dim is split in halves (x1, x2) (GPT-NeoX / LLaMA layout); pair m of
  the vector at position t is rotated by the angle t * theta_m:

      (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin),   theta_m = base^(-2m/H).

  Rotations by t_i and t_j give R(t_i)q . R(t_j)k = q . R(t_j - t_i)k: a
  function of the offset, so adding one offset to every position leaves the
  logits unchanged (tests/test_positions.py checks it).

  Args:
    x_BTNH: queries or keys [B, T, N, H], H even.
    positions_T: integer positions [T] (or [B, T]) of the T rows.
    base: the frequency base (10000 in RoFormer and LLaMA 1/2).
  """
  H = x_BTNH.shape[-1]
  if H % 2:
    raise ValueError(f"rope needs an even head dim, got {H}")
  angle_XTM = upcast(positions_T)[..., None] * rope_frequencies(H, base)
  if angle_XTM.ndim == 2:  # [T, H/2] -> [1, T, 1, H/2]
    angle_XTM = angle_XTM[None]
  cos_BT1M, sin_BT1M = jnp.cos(angle_XTM)[:, :, None], jnp.sin(angle_XTM)[:, :, None]
  x = upcast(x_BTNH)
  x1, x2 = x[..., : H // 2], x[..., H // 2:]
  out = jnp.concatenate([x1 * cos_BT1M - x2 * sin_BT1M, x2 * cos_BT1M + x1 * sin_BT1M], -1)
  return out.astype(x_BTNH.dtype)
