"""Per-layer attention diagnostics of a trained model: is attention well scaled?

For each layer, on a batch of real data: the std of the attention output (the
quantity Graphcore's fully scaled attention sets to about 1), the entropy of the
attention weights (0 = one key, log n = uniform; a collapsing or saturating
scale shows here first) and the largest logit (how far from a softmax
temperature of 1 the scaling sits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnscale.attention import attention, attention_weights


def attention_stats(q_BTNH, k_BSKH, v_BSKH, *, scale_fn=None, mask=None,
                    is_causal=False, normalizer="softmax") -> dict[str, jax.Array]:
  """Output std, mean entropy (nats) and max logit of one attention call.

  Entropy and logits come from the reference path (the T x S weights); the
  output is the fused path's, what the model computes.
  """
  logits_BNTS, probs_BNTS = attention_weights(q_BTNH, k_BSKH, scale_fn=scale_fn, mask=mask,
                                              is_causal=is_causal, normalizer=normalizer)
  plogp_BNTS = jnp.where(probs_BNTS > 0, probs_BNTS * jnp.log(jnp.maximum(probs_BNTS, 1e-30)), 0)
  z_BTNH = attention(q_BTNH, k_BSKH, v_BSKH, scale_fn=scale_fn, mask=mask,
                     is_causal=is_causal, normalizer=normalizer)
  return {
      "output_std": jnp.std(z_BTNH.astype(jnp.float32)),
      "entropy": jnp.mean(-plogp_BNTS.sum(-1)),
      "max_logit": jnp.max(jnp.where(jnp.isfinite(logits_BNTS), logits_BNTS, -jnp.inf)),
  }


def model_attention_stats(model, tokens_BT, mask=None) -> list[dict[str, float]]:
  """`attention_stats` for every layer of an `attnscale.model.Transformer`."""

  @jax.jit
  def run(tokens_BT):
    x_BTD = model.embed_tokens(tokens_BT)
    stats = []
    for block in model.blocks:
      attn = block.attn
      q, k, v = attn.qkv(block.ln1(x_BTD))
      stats.append(attention_stats(q, k, v, scale_fn=attn.scale_fn(), mask=mask,
                                   is_causal=attn.cfg.causal, normalizer=attn.cfg.normalizer))
      x_BTD = block(x_BTD, mask)
    return stats

  return [{k: float(v) for k, v in layer.items()} for layer in jax.device_get(run(tokens_BT))]
