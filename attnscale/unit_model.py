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
from attnscale.model import scale_fn_for

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


class UnitAttention(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, N, K, H = cfg.width, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    self.w_q = _unit_normal(rngs, (D, N * H))
    self.w_k = _unit_normal(rngs, (D, K * H))
    self.w_v = None if cfg.shared_kv else _unit_normal(rngs, (D, K * H))
    self.w_o = _unit_normal(rngs, (N * H, D))

  def scale_fn(self):
    return scale_fn_for(self.cfg, self)

  def qkv(self, x_BTD):
    cfg = self.cfg
    B, T, _ = x_BTD.shape
    q_BTNH = us.linear(x_BTD, self.w_q[...]).reshape(B, T, cfg.num_heads, cfg.head_dim)
    k_BTKH = us.linear(x_BTD, self.w_k[...]).reshape(B, T, cfg.kv_heads, cfg.head_dim)
    if cfg.shared_kv:
      return q_BTNH, k_BTKH, k_BTKH
    return q_BTNH, k_BTKH, us.linear(x_BTD, self.w_v[...]).reshape(k_BTKH.shape)

  def __call__(self, x_BTD, mask=None):
    B, T, D = x_BTD.shape
    q, k, v = self.qkv(x_BTD)
    z_BTNH = attention(q, k, v, scale_fn=self.scale_fn(), mask=mask, is_causal=self.cfg.causal,
                       implementation=self.cfg.attention_impl, normalizer=self.cfg.normalizer)
    return us.linear(z_BTNH.reshape(B, T, D), self.w_o[...])


# us.gelu has unit *std*, but its output has mean 1/(2 sqrt(pi)) (at N(0, 1)
# input), and the next linear layer sees the second moment: rescale to unit RMS.
_GELU_STD_OVER_RMS = 1 / math.sqrt(1 + 1 / (4 * math.pi * us.gelu_scales()[0]**2))


class UnitMLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    D, F = cfg.width, cfg.mlp_ratio * cfg.width
    self.w_up = _unit_normal(rngs, (D, F))
    self.w_down = _unit_normal(rngs, (F, D))

  def __call__(self, x_BTD):
    h_BTF = us.scale_fwd(us.gelu(us.linear(x_BTD, self.w_up[...])), _GELU_STD_OVER_RMS)
    return us.linear(h_BTF, self.w_down[...])


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
    x_BTD = us.residual_apply(lambda h: _dropout(self.attn(self.ln1(h), mask), rate, k1),
                              x_BTD, self.tau_attn, rule)
    return us.residual_apply(lambda h: _dropout(self.mlp(self.ln2(h)), rate, k2),
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

  def __call__(self, tokens_BT, *, mask=None, dropout_key=None, positions=None):
    """Logits [B, T, V] (float32), unit-scale at init. Same contract as `Transformer`."""
    x_BTD = gather_positions(residual_stream(self, tokens_BT, mask, dropout_key), positions)
    # Tied readout, unit-scaled: logits = LN(x) @ E^T / sqrt(D).
    return us.linear(self.ln_f(x_BTD), self.embed[...].T).astype(jnp.float32)
