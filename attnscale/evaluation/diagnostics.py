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
evaluation and studies: the task decides the batch's masks. The per-layer
definitions live in `attnscale.models.layer_stats`, which the training log's sink
metrics read too.

Dimension legend: B batch, T queries, S keys, N heads, K key/value heads, H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnscale.core.attention import attention_weights
from attnscale.models.layer_stats import (  # noqa: F401 (the diagnostics' own definitions)
  SINK_THRESHOLD,
  attention_stats,
  hidden_state_stats,
  layer_stats,
)


def as_floats(stats) -> list[dict]:
  """`layer_stats`' arrays (read to the host) as Python floats, "heads" as lists."""
  return [{**{k: float(v) for k, v in layer.items() if k != "heads"},
           "heads": {k: [float(x) for x in v] for k, v in layer["heads"].items()}}
          for layer in stats]


def model_attention_stats(model, tokens_BT, mask=None, query_mask_BT=None,
                          query_groups=None) -> list[dict[str, float]]:
  """`layer_stats` (per layer: `attention_stats` | `hidden_state_stats`), as floats.

  Args:
    model: an `attnscale.models.Model`.
    tokens_BT: a batch of real data.
    mask: the attention mask the model is run with (e.g. padding [B, 1, 1, T]).
    query_mask_BT: which queries to count (e.g. the non-padded tokens).
    query_groups: {name: bool [B, T]}: groups of queries whose sink measures are
      reported apart too (`Task.query_groups`).
  """
  run = jax.jit(lambda *args: layer_stats(model, *args))
  return as_floats(jax.device_get(run(tokens_BT, mask, query_mask_BT, query_groups)))


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
    "top_key_weight", "uniform_sink_rate", "row_mass", "first_value_norm", "first_value_ratio",
    "max_act", "median_act", "act_ratio", "kurtosis"} as floats (the last four of
    the residual stream the layer's block writes), for each of the task's query
    groups g (`task.query_groups`) "sink_rate_<g>", "top_key_weight_<g>",
    "row_mass_<g>" and "uniform_sink_rate_<g>", and "heads": {"entropy", "max_logit",
    "sink_rate", "top_key_weight", "row_mass", "first_value_norm", "first_value_ratio",
    "sink_rate_<g>", "top_key_weight_<g>", "row_mass_<g>"}, a list per head.
  """
  if batch is None:
    batch = next(iter(task.eval_batches()))
  mask, query_mask_BT = task.attention_masks(batch)
  return model_attention_stats(model, jnp.asarray(batch["inputs"]), mask=mask,
                               query_mask_BT=query_mask_BT,
                               query_groups=_query_groups(task, batch))


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


def _query_groups(task, batch):
  """The task's query groups of `batch` (`Task.query_groups`), or None: none, or a
  stand-in task without the method."""
  groups = getattr(task, "query_groups", None)
  return (groups(batch) or None) if groups else None
