"""The unit-scaled, residual-weighted transformer (`model.variant = "unit_scaled"`).

Graphcore's fix for fully scaled attention: "almost-scaled dot-product attention"
(Graphcore Research, 2023) found that making attention's output unit-scale
(times sqrt(n/e)) trains worse than the under-scaled standard attention, and that
weighting each residual branch against the skip path restores the baseline's
dynamics. This model is that experiment built from unit scaling (Blake et al.
2023, arXiv 2303.11257) and u-muP (Blake et al. 2024, arXiv 2407.17465):

* every op is unit-scaled (`attnscale.unit_scaling`): N(0, 1) weights, linear
  layers scaled by 1/sqrt(fan_in), unit-scaled embeddings and norms, so at
  initialisation every activation and gradient has std about 1;
* attention uses the configured scaling, `fully_scaled` or `unit_scaled`, so its
  output is unit-scale too (per query, from the keys it sees: causal-safe);
* branch i (0-based, even = attention, odd = MLP) is added as
  y = (tau_i f(x) + x) / sqrt(1 + tau_i^2) (u-muP) or sqrt(1 - tau) x +
  sqrt(tau) f(x) (`residual_rule="2023"`), tau_i from u-muP's depth rule
  (1/sqrt(L + i) at residual_mult = residual_attn_ratio = 1);
* `attn_residual="relative"` multiplies the attention branches' tau by
  r = sqrt(e/n_eff) (`unit_scaling.attention_residual_weight`), so the unit-scale
  attention enters the stream at about sqrt(e/n) of the skip, as the standard
  model's attention does: Graphcore's "relative weight" fix.

Gradients. Inside a residual branch every op's backward is unit-scaled on its
own (the MLP's linears and GELU with separate forward/backward scales, the
attention input's fan-out to q, k and v normalised, q/k gradients rescaled by
the attention's logit scale), and one `scale_bwd` at the branch's entry
multiplies back the product of (backward / forward) ratios along the branch.
A branch is a chain between two cut edges (`residual_split`'s output and
`residual_add`'s input) and every path through it carries the same ratio, so
this restores dL/dx of the residual stream to plain autodiff *exactly* (tested),
while every weight gradient and every gradient inside the branch has std about 1
at initialisation (Blake et al. 2023, section 5.2: scales may differ forward and
backward except where that would change the gradient's direction).

The interface matches `attnscale.model.Transformer` (blocks with `ln1`, `attn.qkv`,
`attn.scale_fn`), so training, evaluation and diagnostics serve both.

Dimension legend: B batch, T sequence, D width, N heads, K kv heads, H head dim,
F MLP hidden, V vocabulary, L layers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from attnscale import unit_scaling as us
from attnscale.attention import attention
from attnscale.model import ModelConfig, _dropout, gather_positions, residual_stream
from attnscale.model import AttentionCall, attention_calls, scale_fn_for

Array = jax.Array


def branch_taus(cfg: ModelConfig) -> list[float]:
  """tau for each of the 2L residual branches (even = attention, odd = MLP)."""
  rule = us.transformer_residual_scaling_rule(cfg.residual_mult, cfg.residual_attn_ratio)
  num = 2 * cfg.num_layers
  taus = [rule(i, num) for i in range(num)]
  if cfg.attn_residual == "relative":
    r = us.attention_residual_weight(cfg.block_size, is_causal=cfg.causal)
    taus = [t * r if i % 2 == 0 else t for i, t in enumerate(taus)]
  if cfg.residual_rule == "2023":  # sqrt(tau/(1 - tau)) = the u-muP branch/skip ratio
    taus = [t**2 / (1 + t**2) for t in taus]
  return taus


class _LayerNorm(nnx.Module):

  def __init__(self, width: int):
    self.scale = nnx.Param(jnp.ones((width,)))

  def __call__(self, x):
    return us.layer_norm(x, self.scale[...])


def _unit_normal(rngs, shape):
  return nnx.Param(jax.random.normal(rngs.params(), shape))


def qk_grad_std(cfg: ModelConfig) -> float:
  """Std of dL/dq (and dL/dk) at init for a unit cotangent on a unit-scale output.

  dq_i = s sum_j dlogit_ij k_j with dlogit_ij ~ p_ij c (g_i . v_j): about
  s sqrt(d) c sqrt(sum_j p_ij^2) = s sqrt(d) when the output is unit scale
  (c^2 sum_j p_ij^2 = 1). So 1 for fully scaled attention (s = 1/sqrt(d)) and
  mult / sqrt(d) for u-muP's 1/d logits; other scalings are treated as 1.
  """
  if cfg.scaling == "unit_scaled":
    return float((cfg.scaling_params or {}).get("mult", 1.0)) / math.sqrt(cfg.head_dim)
  return 1.0


class UnitAttention(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, N, K, H = cfg.width, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    self.w_q = _unit_normal(rngs, (D, N * H))
    self.w_k = _unit_normal(rngs, (D, K * H))
    self.w_v = None if cfg.shared_kv else _unit_normal(rngs, (D, K * H))
    self.w_o = _unit_normal(rngs, (N * H, D))
    # The input feeds q, k and v: its gradient sums three terms of std
    # qk, qk and 1. Dividing each by their total keeps it unit; the block
    # multiplies the total back at the branch's entry (`entry_grad_scale`).
    self.qk_grad = qk_grad_std(cfg)
    self.entry_grad_scale = math.sqrt(1.0 + 2.0 * self.qk_grad**2)

  def scale_fn(self):
    return scale_fn_for(self.cfg, self)

  def qkv(self, x_BTD):
    cfg = self.cfg
    B, T, _ = x_BTD.shape
    x_BTD = us.scale_bwd(x_BTD.astype(cfg.dtype), 1.0 / self.entry_grad_scale)
    w = lambda p: p[...].astype(cfg.dtype)  # compute dtype; params stay float32
    # q and k: gradients scaled to unit after the projection and back before
    # it, so w_q, w_k get unit gradients and the input's gradient is exact.
    x_qk_BTD = us.scale_bwd(x_BTD, self.qk_grad)
    to_qk = lambda y: us.scale_bwd(y, 1.0 / self.qk_grad)
    q_BTNH = to_qk(us.linear(x_qk_BTD, w(self.w_q))).reshape(B, T, cfg.num_heads,
                                                              cfg.head_dim)
    if cfg.shared_kv:
      # k and v share a projection: rescaling only k's gradient would change
      # the gradient's direction, so w_k keeps plain scaling (dv dominates it).
      kv_BTKH = us.linear(x_BTD, w(self.w_k)).reshape(B, T, cfg.kv_heads, cfg.head_dim)
      return q_BTNH, kv_BTKH, kv_BTKH
    k_BTKH = to_qk(us.linear(x_qk_BTD, w(self.w_k))).reshape(B, T, cfg.kv_heads,
                                                              cfg.head_dim)
    v_BTKH = us.linear(x_BTD, w(self.w_v)).reshape(k_BTKH.shape)
    return q_BTNH, k_BTKH, v_BTKH

  def __call__(self, x_BTD, mask=None):
    B, T, D = x_BTD.shape
    q, k, v = self.qkv(x_BTD)
    z_BTNH = attention(q, k, v, scale_fn=self.scale_fn(), mask=mask, is_causal=self.cfg.causal,
                       implementation=self.cfg.attention_impl, normalizer=self.cfg.normalizer)
    return us.linear(z_BTNH.reshape(B, T, D), self.w_o[...].astype(z_BTNH.dtype))


# us.gelu has unit *std*, but its output has mean 1/(2 sqrt(pi)) (at N(0, 1)
# input), and the next linear layer sees the second moment: rescale to unit RMS.
_GELU_STD_OVER_RMS = 1 / math.sqrt(1 + 1 / (4 * math.pi * us.gelu_scales()[0]**2))


class UnitMLP(nnx.Module):
  """down(gelu(up(x))), each op unit-scaled forward and backward separately.

  Backward/forward ratios: up sqrt(D/F), GELU std/grad_rms, the RMS rescale
  1/_GELU_STD_OVER_RMS, down sqrt(F/D); their product is rms/grad_rms of the
  GELU output, and `entry_grad_scale` (its inverse) restores the true gradient
  at the branch's entry.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    D, F = cfg.width, cfg.mlp_ratio * cfg.width
    self.dtype = cfg.dtype
    self.w_up = _unit_normal(rngs, (D, F))
    self.w_down = _unit_normal(rngs, (F, D))
    out_std, grad_rms = us.gelu_scales()
    self.entry_grad_scale = grad_rms * _GELU_STD_OVER_RMS / out_std

  def __call__(self, x_BTD):
    w = lambda p: p[...].astype(self.dtype)  # compute dtype; params stay float32
    u_BTF = us.linear(x_BTD.astype(self.dtype), w(self.w_up), constraint=None)
    h_BTF = us.scale_fwd(us.gelu(u_BTF, constraint=None), _GELU_STD_OVER_RMS)
    return us.linear(h_BTF, w(self.w_down), constraint=None)


class UnitBlock(nnx.Module):
  """x <- residual(attn(LN x), tau_attn); x <- residual(mlp(LN x), tau_mlp)."""

  def __init__(self, cfg: ModelConfig, tau_attn: float, tau_mlp: float, *, rngs: nnx.Rngs):
    self.cfg, self.tau_attn, self.tau_mlp = cfg, tau_attn, tau_mlp
    self.ln1, self.attn = _LayerNorm(cfg.width), UnitAttention(cfg, rngs=rngs)
    self.ln2, self.mlp = _LayerNorm(cfg.width), UnitMLP(cfg, rngs=rngs)

  def attn_input(self, x_BTD):
    """What the attention sees (for diagnostics)."""
    return self.ln1(x_BTD)

  def __call__(self, x_BTD, mask=None, dropout_key=None):
    k1, k2 = jax.random.split(dropout_key) if dropout_key is not None else (None, None)
    rule, rate = self.cfg.residual_rule, self.cfg.dropout
    # Each branch's entry multiplies its gradient back to plain autodiff (the
    # ops inside scale theirs to unit): see the module docstring.
    attn_in = lambda h: self.ln1(us.scale_bwd(h, self.attn.entry_grad_scale))
    mlp_in = lambda h: self.ln2(us.scale_bwd(h, self.mlp.entry_grad_scale))
    x_BTD = us.residual_apply(lambda h: _dropout(self.attn(attn_in(h), mask), rate, k1),
                              x_BTD, self.tau_attn, rule)
    return us.residual_apply(lambda h: _dropout(self.mlp(mlp_in(h)), rate, k2),
                             x_BTD, self.tau_mlp, rule)


class UnitScaledTransformer(nnx.Module):
  """Unit-scaled GPT: (token + position embedding)/sqrt(2), L weighted blocks, LN, tied readout."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _unit_normal(rngs, (cfg.vocab_size, cfg.width))
    self.pos_embed = _unit_normal(rngs, (cfg.block_size, cfg.width))
    taus = branch_taus(cfg)
    self.blocks = nnx.List([UnitBlock(cfg, taus[2 * l], taus[2 * l + 1], rngs=rngs)
                            for l in range(cfg.num_layers)])
    self.ln_f = _LayerNorm(cfg.width)

  def embed_tokens(self, tokens_BT, dropout_key=None):
    T = tokens_BT.shape[1]
    x_BTD = us.embedding(tokens_BT, self.embed[...]) + us.embedding(
        jnp.arange(T), self.pos_embed[...])
    # The sum of two unit embeddings has std sqrt(2): rescale the forward only.
    return _dropout(us.scale_fwd(x_BTD, 1 / math.sqrt(2)), self.cfg.dropout, dropout_key)

  def attention_calls(self, tokens_BT, *, mask=None) -> list[AttentionCall]:
    return attention_calls(self, tokens_BT, mask)

  def __call__(self, tokens_BT, *, mask=None, dropout_key=None, positions=None):
    """Logits [B, T, V] (float32), unit-scale at init. Same contract as `Transformer`."""
    x_BTD = gather_positions(residual_stream(self, tokens_BT, mask, dropout_key), positions)
    # Tied readout, unit-scaled: logits = LN(x) @ E^T / sqrt(D).
    # In the compute dtype, accumulated in float32 (at least) as the standard model's.
    h_BTD = self.ln_f(x_BTD).astype(self.cfg.dtype)
    return us.linear(h_BTD, self.embed[...].T.astype(h_BTD.dtype),
                     preferred_element_type=jnp.promote_types(h_BTD.dtype, jnp.float32))
