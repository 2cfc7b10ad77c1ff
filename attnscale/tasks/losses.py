"""Auxiliary losses on the output logits, beside `base.cross_entropy`.

z-loss (Chowdhery et al. 2022, "PaLM", arXiv 2204.02311, section 5: coefficient
1e-4): log Z_t = logsumexp_v(logits_tv) pushed towards 0, so the softmax's
normaliser stays near 1 and the output logits cannot drift (Wortsman et al. 2023,
"Small-scale proxies for large-scale Transformer training instabilities", arXiv
2309.14322: output logit divergence, the second instability they reproduce small).

    L_z = coef * mean_t (log Z_t)^2,   log Z_t = log sum_v exp(logits_tv)

Pure functions. A task whose loss is a softmax over output logits adds
`output_sums` to its loss sums; the training step (`attnscale.runtime.steps`)
adds config.z_loss * z_sum / count to the loss and logs the output logits' health
(the largest logit, the mean log Z) on every run.

Dimension legend: B batch, T sequence, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# Entries of a task's loss sums that combine over batches (micro-batches,
# evaluation batches) by max, not by addition.
MAX_SUMS = ("max_logit",)


def _log_z(logits_BTV: Array, weights_BT: Array | None) -> tuple[Array, Array]:
  """(log Z_t [B, T], the weights w_t [B, T], all ones when None), float32."""
  log_z_BT = jax.nn.logsumexp(logits_BTV.astype(jnp.float32), axis=-1)
  if weights_BT is None:
    weights_BT = jnp.ones_like(log_z_BT)
  return log_z_BT, weights_BT.astype(jnp.float32)


def z_loss(logits_BTV: Array, weights_BT: Array | None = None) -> tuple[Array, Array]:
  """(sum_t w_t (log Z_t)^2, sum_t w_t), float32, as `cross_entropy`'s pair.

  The mean over batches is the ratio of the summed sums, whatever the padding;
  multiply it by the coefficient (PaLM's 1e-4).
  """
  log_z_BT, weights_BT = _log_z(logits_BTV, weights_BT)
  return jnp.sum(jnp.square(log_z_BT) * weights_BT), jnp.sum(weights_BT)


def output_logit_stats(logits_BTV: Array, weights_BT: Array | None = None) -> dict[str, Array]:
  """The output logits' health, no gradient: `max_logit` (the largest output logit
  over the weighted tokens) and `log_z` (the weighted mean of log Z_t), float32."""
  logits_BTV = jax.lax.stop_gradient(logits_BTV).astype(jnp.float32)
  log_z_BT, weights_BT = _log_z(logits_BTV, weights_BT)
  max_BT = jnp.where(weights_BT > 0, jnp.max(logits_BTV, axis=-1), -jnp.inf)
  return {"max_logit": jnp.max(max_BT),
          "log_z": jnp.sum(log_z_BT * weights_BT) / jnp.maximum(jnp.sum(weights_BT), 1.0)}


def output_sums(logits_BTV: Array, weights_BT: Array | None = None) -> dict[str, Array]:
  """What a loss over softmax(logits) adds to its loss sums, float32:

    z_sum     = sum_t w_t (log Z_t)^2   (`z_loss`; the z-loss term is coef * z_sum / count)
    log_z_sum = sum_t w_t log Z_t       (no gradient; / count: the mean log Z)
    max_logit = the largest logit of the weighted tokens (no gradient,
                `output_logit_stats`; combines over batches by max: `MAX_SUMS`)
  """
  z_sum, _ = z_loss(logits_BTV, weights_BT)
  log_z_BT, w_BT = _log_z(jax.lax.stop_gradient(logits_BTV), weights_BT)
  return {"z_sum": z_sum, "log_z_sum": jnp.sum(log_z_BT * w_BT),
          "max_logit": output_logit_stats(logits_BTV, weights_BT)["max_logit"]}


def add_sums(a: dict, b: dict) -> dict:
  """Two batches' loss sums combined: added, `MAX_SUMS` by max (host floats)."""
  return {k: max(a[k], b[k]) if k in MAX_SUMS else a[k] + b[k] for k in a}
