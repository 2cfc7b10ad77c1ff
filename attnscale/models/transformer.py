"""The standard variant: a GPT- or BERT-style transformer (`model.variant = "standard"`).

nanoGPT's architecture: pre-LN blocks, learned positions (or rotary, or none:
`model.positions`, attnscale/core/positions.py), tied input/output
embeddings, GELU MLP, no biases, init N(0, 0.02) with the residual projections at
0.02 / sqrt(2 L). The attention's scaling is a config value (`scaling`), plus the
model-level options compared against the same baselines: a QK norm (LayerNorm
or RMSNorm, `model.qk_norm`) before any scaling, a shared key/value projection
(W_K = W_V), the sigmoid alternative to softmax, and differential attention (`model.differential`, Ye et al. 2025: the
same projections read as N/2 heads of two maps each, `base.DifferentialHeads`).

The BERT encoder (Devlin et al. 2019) is the same model with `causal=False`, a
padding mask, `ln_position="post"` (the original x = LN(x + f(x)) blocks after
an embedding LayerNorm; "pre" is the pre-LN encoder) and `head="mlm"` (BERT's
masked-LM head: dense + GELU + LayerNorm, then the tied embedding and an output
bias). Unlike BERT, the body has no biases, no segment embeddings and no pooler
(no next-sentence task, as RoBERTa).

`model.parameterization="mup"` rescales the hidden matrices' init, the logits and
the attention's scale with the width, and `model.depth_alpha` the residual
branches with the depth (attnscale/models/mup.py); under "sp" and depth_alpha=0
none of those multiplications exists in the program.

Dimension legend: B batch, T sequence, P prediction slots, D width, N heads,
K key/value heads, H head dim, F MLP hidden, V vocabulary, L layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attnscale.core import scalings, sharding
from attnscale.models import base, mup
from attnscale.models.config import ModelConfig
from attnscale.numerics import layer_norm, layers, precision

Array = jax.Array
# model.qk_norm: q and k normalised over the head dim before the configured
# scaling (QK-LayerNorm: Dehghani et al. 2023; RMS: OLMo 2), with learned gains.
QK_NORMS = {"layernorm": scalings.layer_norm, "rmsnorm": scalings.rms_norm}


def _normal(std):
  return nnx.initializers.normal(stddev=std)


def _layer_norm(cfg: ModelConfig, **kwargs) -> layer_norm.LayerNorm:
  """flax's LayerNorm over the width (output in the compute dtype), on the kernel
  `model.layernorm_impl` names (attnscale/numerics/layer_norm.py)."""
  return layer_norm.LayerNorm(cfg.width, dtype=precision.compute_dtype(cfg.dtype),
                              implementation=cfg.layernorm_impl, **kwargs)


class QKNorm(nnx.Module):
  """`model.qk_norm`: LayerNorm or RMSNorm of q and k over the head dim, each with
  a learned gain [H] shared by the heads (init 1), no bias."""

  def __init__(self, cfg: ModelConfig):
    self.norm = QK_NORMS[cfg.qk_norm]
    self.q_scale = nnx.Param(jnp.ones((cfg.head_dim,), jnp.float32))
    self.k_scale = nnx.Param(jnp.ones((cfg.head_dim,), jnp.float32))

  def __call__(self, q_BTNH: Array, k_BTKH: Array) -> tuple[Array, Array]:
    return (self.norm(q_BTNH, self.q_scale[...]).astype(q_BTNH.dtype),
            self.norm(k_BTKH, self.k_scale[...]).astype(k_BTKH.dtype))


class Attention(base.AttentionLayer):
  """Multi-head self-attention: dense projections around the configured scaling.

  `layer` (1-based) sets differential attention's lambda_init (`model.differential`:
  the same four matrices, their columns read as `base.DifferentialHeads` says).
  """

  def __init__(self, cfg: ModelConfig, *, layer: int, rngs: nnx.Rngs):
    super().__init__(cfg)
    D, N, K, H = cfg.width, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    dense = lambda out, std: layers.Dense(D, out, use_bias=False, kernel_init=_normal(std),
                                          dtype=cfg.dtype, fp8=precision.fp8_of(cfg), rngs=rngs)
    std = mup.hidden_init_std(cfg)  # init_std under sp
    self.q_proj = dense(N * H, std)
    self.k_proj = dense(K * H, std)
    self.v_proj = None if cfg.shared_kv else dense(K * H, std)
    self.out_proj = dense(D, mup.residual_init_std(cfg))  # std / sqrt(2 L) under sp
    self.qk_norm = QKNorm(cfg) if cfg.qk_norm != "none" else None
    # The output gate's projection: one logit per head or per output element.
    gate_out = {"none": 0, "headwise": N, "elementwise": N * H}[cfg.attn_gate]
    self.gate_proj = dense(gate_out, std) if gate_out else None
    # FoX's forget gate: one logit per head, with a bias (at 0, as the authors' layer).
    self.forget_proj = (layers.Dense(D, N, use_bias=True, kernel_init=_normal(std),
                                     dtype=jnp.float32, rngs=rngs)
                        if cfg.forget_gate else None)
    # Differential attention's lambda vectors and norm gain: drawn last, so that
    # every other model's init is unchanged.
    if cfg.differential:
      self.differential = base.DifferentialHeads(cfg, layer, rngs=rngs)

  def qkv(self, x_BTD: Array) -> tuple[Array, Array, Array]:
    """Projected q [B, T, N, H], k, v [B, T, K, H] (after the optional QK-LayerNorm);
    differential: v [B, T, K/2, 2 H], the same columns as K/2 heads twice as wide."""
    cfg = self.cfg
    B, T, _ = x_BTD.shape
    q_BTNH = self.q_proj(x_BTD).reshape(B, T, cfg.num_heads, cfg.head_dim)
    k_BTKH = self.k_proj(x_BTD).reshape(B, T, cfg.kv_heads, cfg.head_dim)
    if cfg.differential:
      v_BTKH = self.v_proj(x_BTD).reshape(B, T, cfg.kv_heads // 2, 2 * cfg.head_dim)
    else:
      v_BTKH = k_BTKH if cfg.shared_kv else self.v_proj(x_BTD).reshape(k_BTKH.shape)
    if self.qk_norm is not None:
      q_BTNH, k_BTKH = self.qk_norm(q_BTNH, k_BTKH)
    return q_BTNH, k_BTKH, v_BTKH

  def project_out(self, z_BTD: Array) -> Array:
    return self.out_proj(z_BTD)

  def qk_weights(self):
    return self.q_proj.kernel, self.k_proj.kernel

  def gate_logits(self, x_BTD: Array) -> Array:
    B, T, _ = x_BTD.shape
    return self.gate_proj(x_BTD).reshape(B, T, self.cfg.num_heads, -1)

  def forget_logits(self, x_BTD: Array) -> Array:
    return self.forget_proj(x_BTD.astype(jnp.float32))  # [B, T, N]


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    D, F, std = cfg.width, cfg.mlp_ratio * cfg.width, mup.hidden_init_std(cfg)
    self.up = layers.Dense(D, F, use_bias=False, kernel_init=_normal(std),
                           dtype=cfg.dtype, fp8=precision.fp8_of(cfg), rngs=rngs)
    self.down = layers.Dense(F, D, use_bias=False, kernel_init=_normal(mup.residual_init_std(cfg)),
                             dtype=cfg.dtype, fp8=precision.fp8_of(cfg), rngs=rngs)

  def __call__(self, x_BTD):
    return self.down(jax.nn.gelu(self.up(x_BTD)))


class Block(base.Block):
  """Pre-LN: x + Attn(LN(x)), then x + MLP(LN(x)); post-LN: LN(x + Attn(x)), LN(x + MLP(x)).
  Under the depth rule (`model.depth_alpha`) each pre-LN branch is multiplied by
  (base_depth / L)^alpha (attnscale/models/mup.py)."""

  def __init__(self, cfg: ModelConfig, *, layer: int, rngs: nnx.Rngs):
    self.cfg = cfg
    self.branch_mult = mup.residual_mult(cfg)  # None: no multiplication (the default)
    ln = lambda: _layer_norm(cfg, use_bias=False, rngs=rngs)
    self.ln1, self.attn = ln(), Attention(cfg, layer=layer, rngs=rngs)
    self.ln2, self.mlp = ln(), MLP(cfg, rngs=rngs)

  def attn_input(self, x_BTD):
    """What the attention sees: LN(x) pre-LN, x itself post-LN."""
    return x_BTD if self.cfg.ln_position == "post" else self.ln1(x_BTD)

  def __call__(self, x_BTD, mask=None, dropout_key=None):
    k1, k2 = base.split_key(dropout_key, 2)
    rate = self.cfg.dropout
    if self.cfg.ln_position == "post":
      x_BTD = self.ln1(x_BTD + base.dropout(self.attn(x_BTD, mask), rate, k1))
      return self.ln2(x_BTD + base.dropout(self.mlp(x_BTD), rate, k2))
    x_BTD = x_BTD + self.residual_branch(base.dropout(self.attn(self.ln1(x_BTD), mask), rate, k1))
    return x_BTD + self.residual_branch(base.dropout(self.mlp(self.ln2(x_BTD)), rate, k2))

  def residual_branch(self, f_BTD):
    """A branch's contribution to the residual stream: f, times r^-alpha under the depth rule."""
    return f_BTD if self.branch_mult is None else f_BTD * self.branch_mult


def readout(x_BPD: Array, embed: nnx.Embed, fp8: precision.Fp8 | None = None) -> Array:
  """Tied output layer x @ E^T: in the compute dtype, accumulated and returned in
  float32 (logits for a stable softmax cross-entropy); fp8 as `layers.matmul`."""
  table_VD = sharding.gathered(embed.embedding[...])
  return layers.matmul(x_BPD, table_VD.T.astype(x_BPD.dtype), fp8=fp8,
                       preferred_element_type=jnp.promote_types(x_BPD.dtype, jnp.float32))


class MLMHead(nnx.Module):
  """BERT's masked-LM head: LN(GELU(dense(x))) @ E^T + b, E the tied token embedding."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.fp8 = precision.fp8_of(cfg)
    self.readout_mult = mup.readout_mult(cfg)
    self.dense = layers.Dense(cfg.width, cfg.width, kernel_init=_normal(mup.hidden_init_std(cfg)),
                              dtype=cfg.dtype, fp8=self.fp8, rngs=rngs)
    self.ln = _layer_norm(cfg, rngs=rngs)
    self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,)))

  def __call__(self, x_BPD, embed: nnx.Embed):
    h_BPD = self.ln(jax.nn.gelu(self.dense(x_BPD)))
    logits_BPV = readout(h_BPD, embed, self.fp8)
    if self.readout_mult is not None:  # mup: the bias is not multiplied (as MuReadout's)
      logits_BPV = logits_BPV * self.readout_mult
    return logits_BPV + self.bias[None, None, :]


class Transformer(base.Model):
  """Token + position embeddings, L blocks, final LN (pre-LN), tied output embedding."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.width, embedding_init=_normal(cfg.init_std),
                           rngs=rngs)
    # Learned positions only (rope acts on q and k in each layer, none has nothing):
    # the table is drawn first, so a learned-position model's init is unchanged.
    self.pos_embed = (nnx.Param(_normal(cfg.init_std)(rngs.params(), (cfg.block_size, cfg.width)))
                      if cfg.positions == "learned" else None)
    self.blocks = nnx.List([Block(cfg, layer=l + 1, rngs=rngs) for l in range(cfg.num_layers)])
    # Pre-LN normalises the final stream; post-LN (BERT) the embeddings instead,
    # every block's output being normalised already. The GPT's parameters (and
    # their random init) stay exactly as they were.
    if cfg.ln_position == "pre":
      self.ln_f = _layer_norm(cfg, use_bias=False, rngs=rngs)
    else:
      self.ln_embed = _layer_norm(cfg, use_bias=False, rngs=rngs)
    if cfg.head == "mlm":
      self.mlm_head = MLMHead(cfg, rngs=rngs)

  def embed_tokens(self, tokens_BT, dropout_key=None):
    T = tokens_BT.shape[1]
    # Looked up in the whole table (FSDP gathers the weight, attnscale/core/sharding.py).
    x_BTD = jnp.take(sharding.gathered(self.embed.embedding[...]), tokens_BT, axis=0)
    if self.pos_embed is not None:
      x_BTD = x_BTD + sharding.gathered(self.pos_embed[...])[None, :T]
    if self.cfg.ln_position == "post":
      x_BTD = self.ln_embed(x_BTD)
    # The residual stream stays float32 under a bfloat16 `dtype` (as torch.autocast's):
    # products and LayerNorm outputs take `dtype`, the sums of branches do not.
    return base.dropout(x_BTD, self.cfg.dropout, dropout_key)

  def logits(self, x_BPD):
    if self.cfg.ln_position == "pre":
      x_BPD = self.ln_f(x_BPD)  # per position: the same before or after the gather
    if self.cfg.head == "mlm":
      return self.mlm_head(x_BPD, self.embed)
    logits_BPV = readout(x_BPD, self.embed, precision.fp8_of(self.cfg))
    mult = mup.readout_mult(self.cfg)  # mup's output multiplier a_out/m; None under sp
    return logits_BPV if mult is None else logits_BPV * mult
