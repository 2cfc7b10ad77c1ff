"""Auxiliary losses on the output logits, beside `base.cross_entropy`.

z-loss (Chowdhery et al. 2022, "PaLM", arXiv 2204.02311, section 5: coefficient
1e-4): log Z_t = logsumexp_v(logits_tv) pushed towards 0, so the softmax's
normaliser stays near 1 and the output logits cannot drift (Wortsman et al. 2023,
"Small-scale proxies for large-scale Transformer training instabilities", arXiv
2309.14322: output logit divergence, the second instability they reproduce small).

    L_z = coef * mean_t (log Z_t)^2,   log Z_t = log sum_v exp(logits_tv)

Pure functions; the training step adds coef * sum / count to the loss and logs
`output_logit_stats`.

Dimension legend: B batch, T sequence, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def z_loss(logits_BTV: Array, weights_BT: Array | None = None) -> tuple[Array, Array]:
  """(sum_t w_t (log Z_t)^2, sum_t w_t), float32, as `cross_entropy`'s pair.

  The mean over batches is the ratio of the summed sums, whatever the padding;
  multiply it by the coefficient (PaLM's 1e-4).
  """
  log_z_BT = jax.nn.logsumexp(logits_BTV.astype(jnp.float32), axis=-1)
  if weights_BT is None:
    weights_BT = jnp.ones_like(log_z_BT)
  weights_BT = weights_BT.astype(jnp.float32)
  return jnp.sum(jnp.square(log_z_BT) * weights_BT), jnp.sum(weights_BT)


def output_logit_stats(logits_BTV: Array, weights_BT: Array | None = None) -> dict[str, Array]:
  """The output logits' health, no gradient: `max_logit` (the largest output logit
  over the weighted tokens) and `log_z` (the weighted mean of log Z_t), float32."""
  logits_BTV = jax.lax.stop_gradient(logits_BTV).astype(jnp.float32)
  log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  if weights_BT is None:
    weights_BT = jnp.ones_like(log_z_BT)
  weights_BT = weights_BT.astype(jnp.float32)
  max_BT = jnp.where(weights_BT > 0, jnp.max(logits_BTV, axis=-1), -jnp.inf)
  return {"max_logit": jnp.max(max_BT),
          "log_z": jnp.sum(log_z_BT * weights_BT) / jnp.maximum(jnp.sum(weights_BT), 1.0)}
