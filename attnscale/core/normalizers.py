"""The row normalisers beyond softmax and sigmoid: the weights p_ij from one query's logits.

Each takes the logits l_ij of a block of query rows and the keys they may see
(`visible`; None = every key of the block) and returns p_ij, exactly 0 for an
invisible key, whose gradient never reaches an invisible key's logit (its logit
is replaced by 0 before any arithmetic, so a -inf or a lowest finite value in it
costs nothing). A row here is always complete: the XLA kernel's causal blocks cut
the queries, never the keys (`attnscale.core.xla_attention`), so the reference (the
whole T x S matrix) and the kernel (a block of rows) call the same functions on the
same rows. None of them ignores a shift of the logits as softmax does, so the
scaling in front of them matters (docs/science.md).

* "softpick" (Zuhri et al. 2025, "Softpick: No Attention Sink, No Massive
  Activations with Rectified Softmax", arXiv 2504.20966; their code,
  github.com/zaydzuhri/softpick-attention):

      p_ij = relu(e^l_ij - 1) / (sum_k |e^l_ik - 1| + eps)

  in its stable form, numerator and denominator divided by e^m,
  relu(e^(l_ij - m) - e^-m) / (sum_k |e^(l_ik - m) - e^-m| + eps), eps = 1e-8. Here
  m = max(0, max_k l_ik): the paper's row max, floored at 0 so that e^-m cannot
  overflow when every logit is below about -88 (the weights are then 0, as they
  should be); the value is the same (eps aside, which the paper keeps for the
  all-zero row only). m carries no gradient (as softmax's shift). A row sums to
  at most 1; a key with l_ij <= 0 gets exactly 0, so a query may attend nothing.

* "relu" (Wortsman et al. 2023, "Replacing softmax with ReLU in Vision
  Transformers", arXiv 2309.08586):

      p_ij = relu(l_ij) / L_i,   L_i the number of keys query i may see

  (causal-correct: L_i = i + 1 for a causal query, fewer under padding; the
  paper's sequence length L is this for a bidirectional query without padding).
  1/L_i is itself a length scaling: compare it with the key-norm sums.

* "stickbreaking" (Tan et al. 2025, "Scaling Stick-Breaking Attention: An
  Efficient Implementation and In-depth Study", ICLR 2025, arXiv 2410.17980):

      beta_ij = sigmoid(l_ij),   p_ij = beta_ij prod_{j < k <= i} (1 - beta_ik)

  over the visible keys, in log space: log p_ij = log sigmoid(l_ij) + sum_{k > j}
  log sigmoid(-l_ik), the sum a reverse cumulative sum along the keys (an
  invisible key neither takes weight nor breaks the stick). A query breaks the
  stick from its nearest key backwards, so the row sums to at most 1 and needs
  an order: causal only (`attention` refuses bidirectional calls). Tan et al.'s
  reference (github.com/shawntan/stickbreaking-attention) breaks over the keys
  j < i and leaves the diagonal out; attnscale's causal keys are j <= i (the
  visibility every kernel shares), which is flash-linear-attention's
  `attend_current=True` form of the same attention. The remainder 1 - sum_j p_ij is
  not added back (the model may add it times v_i, as Tan et al.'s model does).

Dimension legend: X any leading dimensions (batch, heads, query rows), S keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

ROW_NORMALIZERS = ("softpick", "relu", "stickbreaking")
SOFTPICK_EPS = 1e-8  # the paper's code's eps (it matters only for an all-zero row)
CAUSAL_ONLY = ("stickbreaking",)


def weights(normalizer: str, logits_XS: Array, visible_XS: Array | None) -> Array:
  """p_ij of `normalizer` (one of ROW_NORMALIZERS) over the visible keys; logits' dtype."""
  if visible_XS is None:
    visible_XS = jnp.ones((1,) * logits_XS.ndim, bool)
  visible_XS = jnp.broadcast_to(visible_XS, logits_XS.shape)
  # Invisible logits become 0 before any arithmetic: no inf, no NaN, no gradient.
  l_XS = jnp.where(visible_XS, logits_XS, 0.0)
  if normalizer == "softpick":
    p_XS = _softpick(l_XS, visible_XS)
  elif normalizer == "relu":
    n_X1 = jnp.sum(visible_XS, axis=-1, keepdims=True, dtype=l_XS.dtype)
    p_XS = jax.nn.relu(l_XS) / jnp.maximum(n_X1, 1.0)
  elif normalizer == "stickbreaking":
    p_XS = jnp.exp(_stickbreaking_log_weights(l_XS, visible_XS))
  else:
    raise ValueError(f"normalizer must be one of {ROW_NORMALIZERS}, got {normalizer!r}")
  return jnp.where(visible_XS, p_XS, 0.0)


def _softpick(l_XS, visible_XS):
  """relu(e^(l - m) - e^-m) / (sum |e^(l - m) - e^-m| + eps), m = max(0, row max)."""
  lowest = jnp.finfo(l_XS.dtype).min
  max_X1 = jnp.max(jnp.where(visible_XS, l_XS, lowest), axis=-1, keepdims=True)
  m_X1 = jax.lax.stop_gradient(jnp.maximum(max_X1, 0.0))
  d_XS = jnp.where(visible_XS, jnp.exp(l_XS - m_X1) - jnp.exp(-m_X1), 0.0)
  return jax.nn.relu(d_XS) / (jnp.sum(jnp.abs(d_XS), axis=-1, keepdims=True) + SOFTPICK_EPS)


def _stickbreaking_log_weights(l_XS, visible_XS):
  """log p_ij = log sigmoid(l_ij) + sum_{k > j visible} log sigmoid(-l_ik)."""
  log_beta_XS = jax.nn.log_sigmoid(l_XS)
  log_rest_XS = jnp.where(visible_XS, jax.nn.log_sigmoid(-l_XS), 0.0)
  # Sum over k > j: the inclusive reverse cumsum shifted one key left (exact: no
  # total-minus-prefix subtraction to lose digits).
  after_XS = jax.lax.cumsum(log_rest_XS, axis=l_XS.ndim - 1, reverse=True)
  pad = [(0, 0)] * (l_XS.ndim - 1) + [(0, 1)]
  after_XS = jnp.pad(after_XS[..., 1:], pad)
  return log_beta_XS + after_XS


def row_stats(logits_XS: Array, p_XS: Array, visible_XS: Array | None) -> tuple[Array, Array]:
  """(max_j l_ij over the visible keys, -sum_j p_ij log p_ij), no gradient.

  The entropy of weights that need not sum to 1 (as sigmoid's): comparable
  between runs of one normaliser. A row that sees no key: the lowest value, 0.
  """
  l_XS = jax.lax.stop_gradient(logits_XS)
  p_XS = jax.lax.stop_gradient(p_XS)
  if visible_XS is not None:
    l_XS = jnp.where(visible_XS, l_XS, jnp.finfo(l_XS.dtype).min)
  plogp_XS = jnp.where(p_XS > 0, p_XS * jnp.log(jnp.maximum(p_XS, 1e-30)), 0.0)
  return jnp.max(l_XS, axis=-1), -jnp.sum(plogp_XS, axis=-1)


def forget_bias(log_forget_XT: Array, t0: int, t1: int, s1: int) -> Array:
  """FoX's logit bias D_ij = sum_{l = j+1}^{i} log f_l for rows [t0, t1), keys [0, s1).

  Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget
  Gate", ICLR 2025, arXiv 2503.02130 (their code, github.com/zhixuan-lin/forgetting-transformer,
  does the same): with c_i = sum_{l <= i} log f_l, D_ij = c_i - c_j, in float32 (or
  wider). log_forget_XT [..., T] (log f_t <= 0, per position and head);
  returns [..., t1 - t0, s1]. D_ij for j > i is not FoX's (it would be positive):
  causal only.
  """
  c_XT = jnp.cumsum(log_forget_XT.astype(jnp.promote_types(log_forget_XT.dtype, jnp.float32)),
                    axis=-1)
  return c_XT[..., t0:t1, None] - c_XT[..., None, :s1]
