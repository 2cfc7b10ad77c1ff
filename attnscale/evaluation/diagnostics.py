"""Per-layer attention diagnostics of a trained model: is attention well scaled?

For each layer, on a batch of real data: the std of the attention output (the
quantity Graphcore's fully scaled attention sets to about 1), the entropy of the
attention weights (0 = one key, log n = uniform; a collapsing or saturating
scale shows here first), the largest logit (how far from a softmax
temperature of 1 the scaling sits) and the sink rate (the weight on the first
key: heads that park attention on token 0, Xiao et al. 2023), per layer and
per head; Gu et al.'s sink rate (the share of heads whose mean weight on the
first key exceeds 0.3); and, of the residual stream each block writes, the
largest activation against the median (massive activations) and the kurtosis.
With padding, only the real (non-padded) queries count, and the padding mask
keeps padded keys out of everything.

`task_attention_stats(model, task, batch)` is the one entry point of
evaluation and studies: the task decides the batch's masks.

Dimension legend: B batch, T queries, S keys, N heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnscale.core.attention import attention, attention_weights

# Gu et al. 2025, "When Attention Sink Emerges in Language Models: An Empirical View"
# (ICLR 2025, arXiv 2410.10781): a head is a sink head when its mean weight on the
# first token exceeds epsilon = 0.3.
SINK_THRESHOLD = 0.3


def attention_stats(q_BTNH, k_BSKH, v_BSKH, *, scale_fn=None, mask=None,
                    is_causal=False, normalizer="softmax", query_mask_BT=None,
                    **options) -> dict[str, jax.Array]:
  """Output std, entropy, max logit and sink rate of one attention call, per layer and head.

  Layer values: output_std = std(z) over [B, T, N, H]; entropy = mean over
  [B, N, T] of -sum_s p_s log p_s (nats); max_logit = max over [B, N, T, S] of
  the scaled logits; sink_rate = mean over [B, N, T'] of p_i0, the weight on
  the first key, over the queries T' that see more than one key (under
  causality query 0 sees only key 0, which says nothing). "heads" holds the
  last three per head ([N] each), what tells a head that sinks its attention
  into the first token from one that spreads it.

  Entropy, logits and weights come from the reference path (the T x S
  weights); the output is the fused path's, what the model computes.
  `query_mask_BT` (bool, True = a real token) restricts everything to the real
  queries. `options` are further `attention` arguments (a soft-cap, a sink).
  """
  logits_BNTS, probs_BNTS = attention_weights(q_BTNH, k_BSKH, scale_fn=scale_fn, mask=mask,
                                              is_causal=is_causal, normalizer=normalizer,
                                              **options)
  plogp_BNTS = jnp.where(probs_BNTS > 0, probs_BNTS * jnp.log(jnp.maximum(probs_BNTS, 1e-30)), 0)
  z_BTNH = attention(q_BTNH, k_BSKH, v_BSKH, scale_fn=scale_fn, mask=mask,
                     is_causal=is_causal, normalizer=normalizer, **options).astype(jnp.float32)
  logits_BNTS = jnp.where(jnp.isfinite(logits_BNTS), logits_BNTS, -jnp.inf)
  B, T, N, H = z_BTNH.shape
  w_BT = (jnp.ones((B, T)) if query_mask_BT is None
          else jnp.broadcast_to(query_mask_BT, (B, T)).astype(jnp.float32))
  count = jnp.maximum(jnp.sum(w_BT), 1.0)
  mean = jnp.sum(z_BTNH * w_BT[:, :, None, None]) / (count * N * H)
  var = jnp.sum(jnp.square(z_BTNH - mean) * w_BT[:, :, None, None]) / (count * N * H)

  w_B1T = w_BT[:, None, :]
  entropy_N = jnp.sum(-plogp_BNTS.sum(-1) * w_B1T, axis=(0, 2)) / count
  real_B1T1 = w_B1T[..., None] > 0
  max_logit_N = jnp.max(jnp.where(real_B1T1, logits_BNTS, -jnp.inf), axis=(0, 2, 3))
  # The first key's weight, over the queries that see more than one key (under
  # causality query 0 sees key 0 alone).
  several_B1T = w_B1T * (jnp.arange(T) > 0)[None, None, :] if is_causal else w_B1T
  sink_N = (jnp.sum(probs_BNTS[..., 0] * several_B1T, axis=(0, 2))
            / jnp.maximum(jnp.sum(several_B1T), 1.0))
  return {
      "output_std": jnp.sqrt(var),
      "entropy": jnp.mean(entropy_N),
      "max_logit": jnp.max(max_logit_N),
      "sink_rate": jnp.mean(sink_N),
      "sink_heads": jnp.mean(sink_N > SINK_THRESHOLD),
      "heads": {"entropy": entropy_N, "max_logit": max_logit_N, "sink_rate": sink_N},
  }


def hidden_state_stats(x_BTD, query_mask_BT=None) -> dict[str, jax.Array]:
  """Massive activations and outliers in a residual stream x [B, T, D], real tokens only.

    max_act    = max |x|,  median_act = median |x|,  act_ratio = max_act / median_act
    kurtosis   = mean over tokens t of  mean_d (x_td - m_t)^4 / (mean_d (x_td - m_t)^2)^2

  act_ratio is Sun et al.'s measure (2024, "Massive Activations in Large Language
  Models", arXiv 2402.17762: activations about 10^3-10^4 times the median, in a few
  fixed dimensions, which act as biases that attention sinks lean on). The kurtosis
  over the hidden dimension, averaged over tokens, is Bondarenko et al.'s outlier
  measure (2023, "Quantizable Transformers: Removing Outliers by Helping Attention
  Heads Do Nothing", arXiv 2306.12929): 3 for a Gaussian, large when a few
  dimensions carry outliers. Padded tokens (`query_mask_BT` False) count nowhere.
  """
  x_BTD = x_BTD.astype(jnp.float32)
  B, T, D = x_BTD.shape
  real_BT = (jnp.ones((B, T), bool) if query_mask_BT is None
             else jnp.broadcast_to(query_mask_BT, (B, T)).astype(bool))
  abs_BTD = jnp.abs(x_BTD)
  max_act = jnp.max(jnp.where(real_BT[..., None], abs_BTD, 0.0))
  # The median of the real entries: padded ones sorted past the end, the middle taken.
  count = jnp.sum(real_BT) * D
  sorted_abs = jnp.sort(jnp.where(real_BT[..., None], abs_BTD, jnp.inf).ravel())
  median_act = 0.5 * (sorted_abs[jnp.maximum(count - 1, 0) // 2] + sorted_abs[count // 2])
  centred_BTD = x_BTD - jnp.mean(x_BTD, axis=-1, keepdims=True)
  m2_BT = jnp.mean(centred_BTD**2, axis=-1)
  kurtosis_BT = jnp.mean(centred_BTD**4, axis=-1) / jnp.maximum(m2_BT**2, 1e-30)
  kurtosis = jnp.sum(jnp.where(real_BT, kurtosis_BT, 0.0)) / jnp.maximum(jnp.sum(real_BT), 1)
  return {"max_act": max_act, "median_act": median_act,
          "act_ratio": max_act / jnp.maximum(median_act, 1e-30), "kurtosis": kurtosis}


def layer_stats(model, tokens_BT, mask=None, query_mask_BT=None) -> list[dict[str, jax.Array]]:
  """Per layer, `attention_stats` of its attention call, as the model makes it, and
  `hidden_state_stats` of its block's output, as arrays (traceable: jit or vmap it).

  Reads each layer's exact inputs and the residual stream its block writes from
  `model.layer_trace` (the `attnscale.models.Model` contract: q, k, v, scaling,
  causality, normalizer), one forward pass, so every model variant is served
  without knowing its attributes. Arguments as `model_attention_stats`'.
  """
  return [attention_stats(call.q_BTNH, call.k_BSKH, call.v_BSKH, mask=mask,
                          query_mask_BT=query_mask_BT, **call.options())
          | hidden_state_stats(x_BTD, query_mask_BT)
          for call, x_BTD in model.layer_trace(tokens_BT, mask=mask)]


def as_floats(stats) -> list[dict]:
  """`layer_stats`' arrays (read to the host) as Python floats, "heads" as lists."""
  return [{**{k: float(v) for k, v in layer.items() if k != "heads"},
           "heads": {k: [float(x) for x in v] for k, v in layer["heads"].items()}}
          for layer in stats]


def model_attention_stats(model, tokens_BT, mask=None,
                          query_mask_BT=None) -> list[dict[str, float]]:
  """`layer_stats` (per layer: `attention_stats` | `hidden_state_stats`), as floats.

  Args:
    model: an `attnscale.models.Model`.
    tokens_BT: a batch of real data.
    mask: the attention mask the model is run with (e.g. padding [B, 1, 1, T]).
    query_mask_BT: which queries to count (e.g. the non-padded tokens).
  """
  run = jax.jit(lambda *args: layer_stats(model, *args))
  return as_floats(jax.device_get(run(tokens_BT, mask, query_mask_BT)))


def task_attention_stats(model, task, batch=None) -> list[dict[str, float]]:
  """Per-layer attention statistics of `model` on `task`'s data: THE entry point.

  eval.py (`eval_lib.evaluate_run`, eval.json's "attention") and the trained
  study (`studies trained --recompute`) both call this, so they agree: the
  batch is the task's first evaluation batch unless given, and the masks are
  the task's (`task.attention_masks`: the masked LM's padding, none for the
  char LM).

  Args:
    model: an `attnscale.models.Model`.
    task: an `attnscale.tasks.Task` (its data loaded).
    batch: a batch of the task's; None = `next(task.eval_batches())`.

  Returns:
    Per layer, {"output_std", "entropy", "max_logit", "sink_rate", "sink_heads",
    "max_act", "median_act", "act_ratio", "kurtosis"} as floats (the last four of
    the residual stream the layer's block writes) and "heads": {"entropy",
    "max_logit", "sink_rate"}, a list per head.
  """
  if batch is None:
    batch = next(iter(task.eval_batches()))
  mask, query_mask_BT = task.attention_masks(batch)
  return model_attention_stats(model, jnp.asarray(batch["inputs"]), mask=mask,
                               query_mask_BT=query_mask_BT)


def _pearson_over_keys(a_BNTS, b_BNTS, visible_BNTS):
  """Per query, the Pearson correlation over its visible keys of a and b ([B, N, T])."""
  n_BNT = jnp.maximum(jnp.sum(visible_BNTS, -1), 1.0)
  mean = lambda x: jnp.sum(x * visible_BNTS, -1) / n_BNT
  da_BNTS = (a_BNTS - mean(a_BNTS)[..., None]) * visible_BNTS
  db_BNTS = (b_BNTS - mean(b_BNTS)[..., None]) * visible_BNTS
  cov_BNT = jnp.sum(da_BNTS * db_BNTS, -1)
  norm_BNT = jnp.sqrt(jnp.sum(da_BNTS**2, -1) * jnp.sum(db_BNTS**2, -1))
  return cov_BNT / jnp.maximum(norm_BNT, 1e-30)


def value_alignment(q_BTNH, k_BSKH, v_BSKH, *, scale_fn=None, mask=None, is_causal=False,
                    normalizer="softmax", query_mask_BT=None, min_keys: int = 4,
                    **options) -> dict[str, jax.Array]:
  """How attention relates to the values: the measures of shared keys and values.

  With W_K = W_V a query scores each token by its similarity to that token's
  value. Per head, over the real queries that see at least `min_keys` keys:

    self_weight = mean_i p_ii                  (the weight on its own position)
    corr_qv     = mean_i corr_j(p_ij, cos(q_i, v_j))
    corr_vv     = mean_i corr_j(p_ij, cos(v_i, v_j))

  corr_j is Pearson's correlation over the keys j query i sees. corr_qv asks
  whether queries pick keys by their values (by construction high with shared
  K/V and no normalisation between them); corr_vv whether a query attends to
  tokens whose values resemble its own (self-attention: T = S). Weights come from
  the reference path, as `attention_stats`.

  Returns {"self_weight", "corr_qv", "corr_vv"} (means over heads) and "heads":
  the same per head ([N] each).
  """
  _, probs_BNTS = attention_weights(q_BTNH, k_BSKH, scale_fn=scale_fn, mask=mask,
                                    is_causal=is_causal, normalizer=normalizer, **options)
  B, T, N, H = q_BTNH.shape
  S, K = v_BSKH.shape[1], v_BSKH.shape[2]
  unit = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-30)
  # Each query head reads its key/value head (grouped-query: N // K heads per group).
  vn_BSNH = jnp.repeat(unit(v_BSKH.astype(jnp.float32)), N // K, axis=2)
  cos_qv_BNTS = jnp.einsum("btnh,bsnh->bnts", unit(q_BTNH.astype(jnp.float32)), vn_BSNH)
  cos_vv_BNTS = jnp.einsum("btnh,bsnh->bnts", vn_BSNH[:, :T], vn_BSNH)
  visible_BNTS = jnp.ones((B, N, T, S))
  if is_causal:
    visible_BNTS = visible_BNTS * (jnp.arange(S)[None, :] <= jnp.arange(T)[:, None])
  if mask is not None:
    visible_BNTS = visible_BNTS * jnp.broadcast_to(mask, (B, N, T, S))
  w_BT = (jnp.ones((B, T)) if query_mask_BT is None
          else jnp.broadcast_to(query_mask_BT, (B, T)).astype(jnp.float32))
  w_BNT = w_BT[:, None, :] * (jnp.sum(visible_BNTS, -1) >= min_keys)
  count = jnp.maximum(jnp.sum(w_BNT, axis=(0, 2)), 1.0)
  per_head = lambda x_BNT: jnp.sum(x_BNT * w_BNT, axis=(0, 2)) / count
  heads = {"self_weight": per_head(jnp.diagonal(probs_BNTS[..., :T, :T], axis1=2, axis2=3)),
           "corr_qv": per_head(_pearson_over_keys(probs_BNTS, cos_qv_BNTS, visible_BNTS)),
           "corr_vv": per_head(_pearson_over_keys(probs_BNTS, cos_vv_BNTS, visible_BNTS))}
  return {**{k: jnp.mean(v) for k, v in heads.items()}, "heads": heads}


def task_value_alignment(model, task, batch=None) -> list[dict]:
  """`value_alignment` of every layer of `model` on `task`'s first evaluation
  batch with the task's masks (as `task_attention_stats`)."""
  if batch is None:
    batch = next(iter(task.eval_batches()))
  mask, query_mask_BT = task.attention_masks(batch)

  @jax.jit
  def run(tokens_BT):
    return [value_alignment(call.q_BTNH, call.k_BSKH, call.v_BSKH, mask=mask,
                            query_mask_BT=query_mask_BT, **call.options())
            for call in model.attention_calls(tokens_BT, mask=mask)]

  stats = jax.device_get(run(jnp.asarray(batch["inputs"])))
  return [{**{k: float(v) for k, v in layer.items() if k != "heads"},
           "heads": {k: [float(x) for x in v] for k, v in layer["heads"].items()}}
          for layer in stats]
