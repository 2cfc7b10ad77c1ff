"""The unit-scaled, residual-weighted transformer (`model.variant = "unit"`).

Graphcore's fix for fully scaled attention: "almost-scaled dot-product attention"
(Graphcore Research, 2023) found that making attention's output unit-scale
(times sqrt(n/e)) trains worse than the under-scaled standard attention, and that
weighting each residual branch against the skip path restores the baseline's
dynamics. This model is that experiment built from unit scaling (Blake et al.
2023, arXiv 2303.11257) and u-muP (Blake et al. 2024, arXiv 2407.17465):

* every op is unit-scaled (`attnscale.unit_scaling`): N(0, 1) weights, linear
  layers scaled by 1/sqrt(fan_in), unit-scaled embeddings and norms, so at
  initialisation every activation and gradient has std about 1;
* attention uses the configured scaling, `fully_scaled` or `umup`, so its
  output is unit-scale too (per query, from the keys it sees: causal-safe);
* branch i (0-based, even = attention, odd = MLP) is added as
  y = (tau_i f(x) + x) / sqrt(1 + tau_i^2) (u-muP) or sqrt(1 - tau) x +
  sqrt(tau) f(x) (`residual_rule="2023"`), tau_i from u-muP's depth rule
  (1/sqrt(L + i) at residual_mult = residual_attn_ratio = 1; docs/science.md,
  "Unit scaling and the residual rule");
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

It implements the `attnscale.models.base.Model` contract, as the standard
transformer does, so training, evaluation and diagnostics serve both. Its fields
are `config.model.unit` (`UnitConfig`).

Dimension legend: B batch, T sequence, D width, N heads, K kv heads, H head dim,
F MLP hidden, V vocabulary, L layers.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from attnscale.core import scalings, sharding
from attnscale.models import base
from attnscale.models.config import ModelConfig
from attnscale.numerics import precision
from attnscale.numerics import unit_scaling as us

Array = jax.Array
RESIDUAL_RULES = ("umup", "2023")
ATTN_RESIDUALS = ("rule", "relative")


def branch_taus(cfg: ModelConfig) -> list[float]:
  """tau for each of the 2L residual branches (even = attention, odd = MLP)."""
  unit = cfg.unit
  rule = us.transformer_residual_scaling_rule(unit.residual_mult, unit.residual_attn_ratio)
  num = 2 * cfg.num_layers
  taus = [rule(i, num) for i in range(num)]
  if unit.attn_residual == "relative":
    r = us.attention_residual_weight(cfg.block_size, is_causal=cfg.causal)
    taus = [t * r if i % 2 == 0 else t for i, t in enumerate(taus)]
  if unit.residual_rule == "2023":  # sqrt(tau/(1 - tau)) = the u-muP branch/skip ratio
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
  mult / sqrt(d) for u-muP's 1/d logits. s is the scaling's `init_logit_scale`;
  a scaling without a constant s is treated as 1/sqrt(d).
  """
  scale_fn = scalings.get(cfg.scaling, **dict(cfg.scaling_params or {}))
  init_logit_scale = getattr(scale_fn, "init_logit_scale", None)
  if init_logit_scale is None:
    return 1.0
  return float(init_logit_scale(cfg.head_dim)) * math.sqrt(cfg.head_dim)


class UnitAttention(base.AttentionLayer):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    super().__init__(cfg)
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

  def qkv(self, x_BTD):
    cfg = self.cfg
    B, T, _ = x_BTD.shape
    dtype = precision.compute_dtype(cfg.dtype)
    linear = functools.partial(us.linear, fp8=precision.fp8_of(cfg))  # None unless fp8
    x_BTD = us.scale_bwd(x_BTD.astype(dtype), 1.0 / self.entry_grad_scale)
    w = lambda p: p[...].astype(dtype)  # compute dtype; params stay float32
    # q and k: gradients scaled to unit after the projection and back before
    # it, so w_q, w_k get unit gradients and the input's gradient is exact.
    x_qk_BTD = us.scale_bwd(x_BTD, self.qk_grad)
    to_qk = lambda y: us.scale_bwd(y, 1.0 / self.qk_grad)
    q_BTNH = to_qk(linear(x_qk_BTD, w(self.w_q))).reshape(B, T, cfg.num_heads,
                                                           cfg.head_dim)
    if cfg.shared_kv:
      # k and v share a projection: rescaling only k's gradient would change
      # the gradient's direction, so w_k keeps plain scaling (dv dominates it).
      kv_BTKH = linear(x_BTD, w(self.w_k)).reshape(B, T, cfg.kv_heads, cfg.head_dim)
      return q_BTNH, kv_BTKH, kv_BTKH
    k_BTKH = to_qk(linear(x_qk_BTD, w(self.w_k))).reshape(B, T, cfg.kv_heads,
                                                           cfg.head_dim)
    v_BTKH = linear(x_BTD, w(self.w_v)).reshape(k_BTKH.shape)
    return q_BTNH, k_BTKH, v_BTKH

  def qk_weights(self):
    return self.w_q, self.w_k  # q, k = linear(x, w) / sqrt(D): linear in w

  def project_out(self, z_BTD):
    return us.linear(z_BTD, self.w_o[...].astype(z_BTD.dtype), fp8=precision.fp8_of(self.cfg))


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
    self.dtype, self.fp8 = precision.compute_dtype(cfg.dtype), precision.fp8_of(cfg)
    self.w_up = _unit_normal(rngs, (D, F))
    self.w_down = _unit_normal(rngs, (F, D))
    out_std, grad_rms = us.gelu_scales()
    self.entry_grad_scale = grad_rms * _GELU_STD_OVER_RMS / out_std

  def __call__(self, x_BTD):
    w = lambda p: p[...].astype(self.dtype)  # compute dtype; params stay float32
    u_BTF = us.linear(x_BTD.astype(self.dtype), w(self.w_up), constraint=None, fp8=self.fp8)
    h_BTF = us.scale_fwd(us.gelu(u_BTF, constraint=None), _GELU_STD_OVER_RMS)
    return us.linear(h_BTF, w(self.w_down), constraint=None, fp8=self.fp8)


class UnitBlock(base.Block):
  """x <- residual(attn(LN x), tau_attn); x <- residual(mlp(LN x), tau_mlp)."""

  def __init__(self, cfg: ModelConfig, tau_attn: float, tau_mlp: float, *, rngs: nnx.Rngs):
    self.cfg, self.tau_attn, self.tau_mlp = cfg, tau_attn, tau_mlp
    self.ln1, self.attn = _LayerNorm(cfg.width), UnitAttention(cfg, rngs=rngs)
    self.ln2, self.mlp = _LayerNorm(cfg.width), UnitMLP(cfg, rngs=rngs)

  def attn_input(self, x_BTD):
    """What the attention sees (for diagnostics)."""
    return self.ln1(x_BTD)

  def __call__(self, x_BTD, mask=None, dropout_key=None):
    k1, k2 = base.split_key(dropout_key, 2)
    rule, rate = self.cfg.unit.residual_rule, self.cfg.dropout
    # Each branch's entry multiplies its gradient back to plain autodiff (the
    # ops inside scale theirs to unit): see the module docstring.
    attn_in = lambda h: self.ln1(us.scale_bwd(h, self.attn.entry_grad_scale))
    mlp_in = lambda h: self.ln2(us.scale_bwd(h, self.mlp.entry_grad_scale))
    x_BTD = us.residual_apply(lambda h: base.dropout(self.attn(attn_in(h), mask), rate, k1),
                              x_BTD, self.tau_attn, rule)
    return us.residual_apply(lambda h: base.dropout(self.mlp(mlp_in(h)), rate, k2),
                             x_BTD, self.tau_mlp, rule)


class UnitScaledTransformer(base.Model):
  """Unit-scaled GPT: (token + position embedding)/sqrt(2) (the token embedding alone with
  rope or no positions), L weighted blocks, LN, tied readout."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _unit_normal(rngs, (cfg.vocab_size, cfg.width))
    self.pos_embed = (_unit_normal(rngs, (cfg.block_size, cfg.width))
                      if cfg.positions == "learned" else None)
    taus = branch_taus(cfg)
    self.blocks = nnx.List([UnitBlock(cfg, taus[2 * l], taus[2 * l + 1], rngs=rngs)
                            for l in range(cfg.num_layers)])
    self.ln_f = _LayerNorm(cfg.width)
    # u-muP's readout is its own "output" parameter (its LR rule differs from the
    # embedding's: attnscale/models/mup.py), so model.parameterization=umup unties it.
    self.readout = (_unit_normal(rngs, (cfg.width, cfg.vocab_size))
                    if cfg.parameterization == "umup" else None)

  def embed_tokens(self, tokens_BT, dropout_key=None):
    T = tokens_BT.shape[1]
    # Looked up in the whole table (FSDP gathers the weight, attnscale/core/sharding.py).
    x_BTD = us.embedding(tokens_BT, sharding.gathered(self.embed[...]))
    if self.pos_embed is not None:
      x_BTD = x_BTD + us.embedding(jnp.arange(T), sharding.gathered(self.pos_embed[...]))[None]
      # The sum of two unit embeddings has std sqrt(2): rescale the forward only.
      x_BTD = us.scale_fwd(x_BTD, 1 / math.sqrt(2))
    return base.dropout(x_BTD, self.cfg.dropout, dropout_key)

  def logits(self, x_BPD):
    """Tied readout, unit-scaled: logits = LN(x) @ E^T / sqrt(D), unit-scale at init.

    `us.linear` (1/sqrt(fan_in)), not u-muP's `us.linear_readout` (1/fan_in):
    this model's criterion is unit scale at init, and u-muP's readout would
    start the logits at std 1/sqrt(D) (it is muP's rule for transferring
    learning rates across widths). Under model.parameterization=umup, which claims
    that transfer, the readout is u-muP's: untied and `us.linear_readout`. In the
    compute dtype, accumulated in float32 (at least) as the standard model's.
    """
    h_BPD = self.ln_f(x_BPD).astype(precision.compute_dtype(self.cfg.dtype))
    accumulate = jnp.promote_types(h_BPD.dtype, jnp.float32)
    if self.readout is not None:  # u-muP: untied, logits = LN(x) @ W_out / D
      logits_BPV = us.linear_readout(h_BPD, self.readout[...].astype(h_BPD.dtype),
                                     preferred_element_type=accumulate,
                                     fp8=precision.fp8_of(self.cfg))
    else:
      logits_BPV = us.linear(h_BPD, sharding.gathered(self.embed[...]).T.astype(h_BPD.dtype),
                             preferred_element_type=accumulate, fp8=precision.fp8_of(self.cfg))
    # The backward starts at unit scale (see `loss_grad_scale`).
    return us.scale_bwd(logits_BPV, self.loss_grad_scale(math.prod(logits_BPV.shape[:-1])))

  def loss_grad_scale(self, num_targets: int) -> float:
    """N V / sqrt(V - 1) for N = `num_targets` (1 with model.unit.scaled_loss=False).

    The tasks' loss is the mean over N logit rows of -log softmax(logits)[y],
    whose gradient at the logits is (p - onehot(y)) / N: for a near-uniform p,
    RMS sqrt(V - 1) / (V N) (`us.softmax_cross_entropy`'s derivation), 2^-13 at
    N = 1024, V = 65 (graphcore_cpu): at the bottom of float16's normal range
    (2^-14) and e5m2's (2^-14), and the gradients behind it fall further. unit_scaling's `cross_entropy` takes the mean in the
    forward pass only and scales the logits' gradient by V / sqrt(V - 1); scaling
    the gradient entering the logits by this factor does the same, so every
    gradient behind it starts at unit scale while the loss's value stays the
    tasks' plain mean. The train step divides the parameters' gradients by it
    (float32), so the optimizer, clipping and the float32 run are unchanged. Where
    the loss averages over fewer than N rows (weights, padding) the gradient sits
    N / count times above unit.
    """
    if not self.cfg.unit.scaled_loss:
      return 1.0
    vocab_size = self.cfg.vocab_size
    return num_targets * vocab_size / math.sqrt(vocab_size - 1)

  @classmethod
  def validate_config(cls, cfg: ModelConfig) -> None:
    if cfg.qk_norm != "none" or scalings.entry(cfg.scaling).normalizes_qk:
      raise ValueError(f"model.variant='unit' takes a scaling that leaves q and k as they "
                       f"are (e.g. fully_scaled, umup), got scaling={cfg.scaling!r}, "
                       f"qk_norm={cfg.qk_norm!r}")
    if cfg.attn_gate != "none":
      raise ValueError(f"model.attn_gate={cfg.attn_gate!r} is not available in "
                       "model.variant='unit' (a sigmoid gate halves the unit-scale output "
                       "and has no unit-scaling rule here yet): use model.attn_gate='none'")
    if cfg.head_norm != "none":
      raise ValueError(f"model.head_norm={cfg.head_norm!r} is not available in "
                       "model.variant='unit' (its gain has no unit-scaling rule here yet): "
                       "use model.head_norm='none'")
    if cfg.forget_gate:
      raise ValueError("model.forget_gate=True is not available in model.variant='unit' "
                       "(its decay shrinks the unit-scale output and has no unit-scaling "
                       "rule here yet): use model.variant='standard'")
    if cfg.differential:
      raise ValueError("model.differential=True is not available in model.variant='unit' "
                       "(its RMSNorm and (1 - lambda_init) factor have no unit-scaling rule "
                       "here yet): use model.variant='standard'")
    if cfg.unit.residual_rule not in RESIDUAL_RULES:
      raise ValueError(f"model.unit.residual_rule must be one of {list(RESIDUAL_RULES)}, "
                       f"got {cfg.unit.residual_rule!r}")
    if cfg.unit.attn_residual not in ATTN_RESIDUALS:
      raise ValueError(f"model.unit.attn_residual must be one of {list(ATTN_RESIDUALS)}, "
                       f"got {cfg.unit.attn_residual!r}")
    if (cfg.ln_position, cfg.head) != ("pre", "lm"):
      raise ValueError(f"model.variant='unit' is pre-LN with a tied readout: it needs "
                       f"model.ln_position='pre' and model.head='lm', got "
                       f"{cfg.ln_position!r} and {cfg.head!r}")
