"""Per-layer statistics of a model's attention and residual stream, in one forward pass.

The definitions eval.py's diagnostics (`attnscale.evaluation.diagnostics`) and the
training log's sink metrics (`config.sink_metrics_rows`, `attnscale.runtime.steps`)
share, so the two report the same numbers: per layer, of its attention call the
output std, the weights' entropy, the largest logit, the first key's weight (sink
rate) and Gu et al.'s share of sink heads; of the residual stream its block writes,
the largest activation against the median and the kurtosis. Padded keys and
queries count nowhere.

Dimension legend: B batch, T queries, S keys, N heads, K key/value heads, H head dim, D width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnscale.core.attention import attention, attention_weights

# Gu et al. 2025, "When Attention Sink Emerges in Language Models: An Empirical View"
# (ICLR 2025, arXiv 2410.10781): a head is a sink head when its mean weight on the
# first token exceeds epsilon = 0.3.
SINK_THRESHOLD = 0.3


def _key_weights(probs_BNTS, counted_B1T):
  """(first key's weight [N], heaviest key's weight [N], row mass [N]) over the
  counted queries.

  sink: mean over [B, T'] of p_i0. top key: each key's mean weight over its row's
  counted queries, the heaviest per row (padded keys have weight 0, so never),
  averaged over the rows that have counted queries. mass: mean of sum_j p_ij (1
  for softmax; a normaliser that need not sum to 1 can output nothing with no sink).
  """
  denom = jnp.maximum(jnp.sum(counted_B1T), 1.0)
  sink_N = jnp.sum(probs_BNTS[..., 0] * counted_B1T, axis=(0, 2)) / denom
  mass_N = jnp.sum(jnp.sum(probs_BNTS, -1) * counted_B1T, axis=(0, 2)) / denom
  count_B11 = jnp.sum(counted_B1T, axis=-1, keepdims=True)
  key_mean_BNS = (jnp.sum(probs_BNTS * counted_B1T[..., None], axis=2)
                  / jnp.maximum(count_B11, 1.0))
  rows_B1 = (count_B11[..., 0] > 0).astype(jnp.float32)
  top_key_N = (jnp.sum(jnp.max(key_mean_BNS, axis=-1) * rows_B1, axis=0)
               / jnp.maximum(jnp.sum(rows_B1), 1.0))
  return sink_N, top_key_N, mass_N


def attention_stats(q_BTNH, k_BSKH, v_BSKH, *, scale_fn=None, mask=None,
                    is_causal=False, normalizer="softmax", query_mask_BT=None,
                    query_groups=None, **options) -> dict[str, jax.Array]:
  """Output std, entropy, max logit and sink rate of one attention call, per layer and head.

  Layer values: output_std = std(z) over [B, T, N, H]; entropy = mean over
  [B, N, T] of -sum_s p_s log p_s (nats); max_logit = max over [B, N, T, S] of
  the scaled logits; sink_rate = mean over [B, N, T'] of p_i0, the weight on
  the first key, over the queries T' that see more than one key (under
  causality query 0 sees only key 0, which says nothing); top_key_weight = the
  same for the heaviest key of each row, wherever it sits: max over s of the mean
  over those queries of p_is, then the mean over rows (a sink on a BERT's [SEP]
  or a delimiter, not only on the first token; uniform attention gives 1/T over
  T real keys, Gu et al.'s sink threshold is 0.3). "heads" holds the last four per
  head ([N] each), what tells a head that sinks its attention into one token from
  one that spreads it.

  Entropy, logits and weights come from the reference path (the T x S
  weights); the output is the fused path's, what the model computes.
  `query_mask_BT` (bool, True = a real token) restricts everything to the real
  queries. `options` are further `attention` arguments (a soft-cap, a sink).

  What a sink needs beside its weight: row_mass = the mean of sum_j p_ij (1 for
  softmax; ReLU/L, sigmoid or a gate-free zero can output nothing by weighing
  nothing, with no sink); uniform_sink_rate = the mean over the same
  queries of 1/n_i (n_i the keys query i sees: what the first key gets from
  attention that averages), the yardstick of sink_rate; first_value_norm = the
  mean over rows of |v_0| (the value at the sink position, per query head's value
  head) and first_value_ratio = that over the mean |v_j| of the real keys: a sink
  whose value is near 0 adds nothing to the output: the "no-op" a softmax head
  makes by parking its weight there, which the measure tells from a sink that
  carries information. `query_groups`
  {name: bool [B, T]}: the sink measures again on each group of queries alone
  (within the real ones): sink_rate_<name>, top_key_weight_<name>, row_mass_<name>
  and uniform_sink_rate_<name>, per head as well (but the uniform rate) (the trigger task's trigger and
  no-trigger rows, `Task.query_groups`).
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
  sink_N, top_key_N, mass_N = _key_weights(probs_BNTS, several_B1T)
  S = k_BSKH.shape[1]
  visible_BTS = jnp.ones((B, T, S), bool)
  if is_causal:
    visible_BTS = visible_BTS & (jnp.arange(S)[None, :] <= jnp.arange(T)[:, None])[None]
  if mask is not None:
    visible_BTS = visible_BTS & jnp.broadcast_to(mask, (B, 1, T, S))[:, 0]
  inverse_n_B1T = (1.0 / jnp.maximum(jnp.sum(visible_BTS, -1), 1))[:, None, :]
  uniform = lambda counted_B1T: (jnp.sum(inverse_n_B1T * counted_B1T)
                                 / jnp.maximum(jnp.sum(counted_B1T), 1.0))
  # The value at the sink position against the real keys' (per query head's value head).
  vnorm_BSN = jnp.repeat(jnp.linalg.norm(v_BSKH.astype(jnp.float32), axis=-1),
                         N // v_BSKH.shape[2], axis=2)
  real_keys_BS = visible_BTS.any(axis=1).astype(jnp.float32)
  first_value_N = jnp.mean(vnorm_BSN[:, 0], axis=0)
  mean_value_N = (jnp.sum(vnorm_BSN * real_keys_BS[..., None], axis=(0, 1))
                  / jnp.maximum(jnp.sum(real_keys_BS), 1.0))
  out = {
      "output_std": jnp.sqrt(var),
      "entropy": jnp.mean(entropy_N),
      "max_logit": jnp.max(max_logit_N),
      "sink_rate": jnp.mean(sink_N),
      "sink_heads": jnp.mean(sink_N > SINK_THRESHOLD),
      "top_key_weight": jnp.mean(top_key_N),
      "uniform_sink_rate": uniform(several_B1T),
      "row_mass": jnp.mean(mass_N),
      "first_value_norm": jnp.mean(first_value_N),
      "first_value_ratio": jnp.mean(first_value_N / jnp.maximum(mean_value_N, 1e-30)),
      "heads": {"entropy": entropy_N, "max_logit": max_logit_N, "sink_rate": sink_N,
                "top_key_weight": top_key_N, "row_mass": mass_N,
                "first_value_norm": first_value_N,
                "first_value_ratio": first_value_N / jnp.maximum(mean_value_N, 1e-30)},
  }
  for name, in_BT in (query_groups or {}).items():
    counted_B1T = several_B1T * jnp.broadcast_to(in_BT, (B, T)).astype(jnp.float32)[:, None]
    g_sink_N, g_top_N, g_mass_N = _key_weights(probs_BNTS, counted_B1T)
    out[f"sink_rate_{name}"] = jnp.mean(g_sink_N)
    out[f"top_key_weight_{name}"] = jnp.mean(g_top_N)
    out[f"uniform_sink_rate_{name}"] = uniform(counted_B1T)
    out[f"row_mass_{name}"] = jnp.mean(g_mass_N)
    out["heads"][f"sink_rate_{name}"] = g_sink_N
    out["heads"][f"top_key_weight_{name}"] = g_top_N
    out["heads"][f"row_mass_{name}"] = g_mass_N
  return out


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


def layer_stats(model, tokens_BT, mask=None, query_mask_BT=None,
                query_groups=None) -> list[dict[str, jax.Array]]:
  """Per layer, `attention_stats` of its attention call, as the model makes it, and
  `hidden_state_stats` of its block's output, as arrays (traceable: jit or vmap it).

  Reads each layer's exact inputs and the residual stream its block writes from
  `model.layer_trace` (the `attnscale.models.Model` contract: q, k, v, scaling,
  causality, normalizer), one forward pass, so every model variant is served
  without knowing its attributes. Arguments as `model_attention_stats`';
  `query_groups` as `attention_stats`'.
  """
  return [attention_stats(call.q_BTNH, call.k_BSKH, call.v_BSKH, mask=mask,
                          query_mask_BT=query_mask_BT, query_groups=query_groups,
                          **call.options())
          | hidden_state_stats(x_BTD, query_mask_BT)
          for call, x_BTD in model.layer_trace(tokens_BT, mask=mask)]
