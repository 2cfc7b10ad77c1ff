"""A GPT- or BERT-style transformer (Flax NNX) whose attention goes through `attnscale.attention`.

nanoGPT's architecture: pre-LN blocks, learned positions, tied input/output
embeddings, GELU MLP, no biases, init N(0, 0.02) with the residual projections at
0.02 / sqrt(2 L). The attention's scaling is a config value (`scaling`), plus the
model-level options compared against the same baselines: QK-LayerNorm before any
scaling, a shared key/value projection (W_K = W_V), and the sigmoid alternative
to softmax.

The BERT encoder (Devlin et al. 2019) is the same model with `causal=False`, a
padding mask, `ln_position="post"` (the original x = LN(x + f(x)) blocks after
an embedding LayerNorm; "pre" is the pre-LN encoder) and `head="mlm"` (BERT's
masked-LM head: dense + GELU + LayerNorm, then the tied embedding and an output
bias). Unlike BERT, the body has no biases, no segment embeddings and no pooler
(no next-sentence task, as RoBERTa).

Dimension legend: B batch, T sequence, D width, N heads, K key/value heads,
H head dim, F MLP hidden, V vocabulary, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attnscale import layers, scalings
# The module's name is shadowed by the function in attnscale/__init__.py.
from attnscale.attention import IMPLEMENTATIONS, NORMALIZERS, attention

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of `Transformer` (mirrors `config.model`)."""

  vocab_size: int = 65
  block_size: int = 256  # maximum sequence length (learned positions)
  num_layers: int = 6
  num_heads: int = 6
  num_kv_heads: int | None = None  # None = num_heads; fewer = grouped-query
  width: int = 384
  mlp_ratio: int = 4
  dropout: float = 0.0  # embeddings and residual branches; none on attention weights
  scaling: str = "standard"  # a name from attnscale.scalings.names()
  scaling_params: Any = None  # extra params for the scaling, e.g. {"p": 2.0}
  qk_layernorm: bool = False  # learned LayerNorm on q and k before the scaling
  shared_kv: bool = False  # one projection for keys and values (W_K = W_V)
  normalizer: str = "softmax"  # or "sigmoid" (reference path only)
  attention_impl: str | None = None  # None/"xla"/"cudnn" fused, or "reference"
  causal: bool = True  # False: bidirectional (an encoder); padding goes in `mask`
  ln_position: str = "pre"  # pre: x + f(LN(x)) (GPT-2) | post: LN(x + f(x)) (BERT)
  head: str = "lm"  # lm: tied embedding | mlm: BERT's dense+GELU+LN, tied embedding, bias
  dtype: str = "float32"  # compute dtype ("bfloat16": mixed precision); params stay float32
  init_std: float = 0.02
  # The unit-scaled, residual-weighted variant (attnscale/unit_model.py).
  variant: str = "standard"  # standard | unit_scaled
  residual_mult: float = 1.0  # u-muP: branches' total weight against the embedding
  residual_attn_ratio: float = 1.0  # u-muP: attention / MLP branch weight ratio
  residual_rule: str = "umup"  # umup: (tau f + x)/sqrt(1+tau^2) | 2023: sqrt(1-tau) x + sqrt(tau) f
  attn_residual: str = "rule"  # rule (depth rule only) | relative (x sqrt(e/n): Graphcore's fix)

  def __post_init__(self):
    if self.scaling not in scalings.names():
      raise ValueError(f"model.scaling must be one of {scalings.names()}, got {self.scaling!r}")
    scalings.get(self.scaling, **dict(self.scaling_params or {}))  # bad params fail now
    if self.width % self.num_heads:
      raise ValueError(f"model.num_heads ({self.num_heads}) must divide model.width "
                       f"({self.width})")
    if self.num_heads % self.kv_heads:
      raise ValueError(f"model.num_kv_heads ({self.kv_heads}) must divide model.num_heads "
                       f"({self.num_heads})")
    if self.qk_layernorm and self.scaling in ("qk_layernorm", "cosine"):
      raise ValueError(f"model.qk_layernorm=True with scaling={self.scaling!r} would "
                       "normalise q and k twice: use one of them")
    if self.normalizer not in NORMALIZERS:
      raise ValueError(f"model.normalizer must be one of {NORMALIZERS}, "
                       f"got {self.normalizer!r}")
    if self.attention_impl not in IMPLEMENTATIONS:
      raise ValueError(f"model.attention_impl must be one of "
                       f"{IMPLEMENTATIONS}, got {self.attention_impl!r}")
    if self.variant not in VARIANTS:
      raise ValueError(f"model.variant must be one of {VARIANTS}, got {self.variant!r}")
    if self.variant == "unit_scaled":
      if self.scaling in ("cosine", "qk_layernorm") or self.qk_layernorm:
        raise ValueError(f"model.variant='unit_scaled' takes a scaling without learned "
                         f"q/k parameters (e.g. fully_scaled, unit_scaled), got "
                         f"scaling={self.scaling!r}, qk_layernorm={self.qk_layernorm}")
      if self.residual_rule not in ("umup", "2023"):
        raise ValueError(f"model.residual_rule must be one of ['umup', '2023'], "
                         f"got {self.residual_rule!r}")
      if self.attn_residual not in ("rule", "relative"):
        raise ValueError(f"model.attn_residual must be one of ['rule', 'relative'], "
                         f"got {self.attn_residual!r}")
    if self.ln_position not in LN_POSITIONS:
      raise ValueError(f"model.ln_position must be one of {list(LN_POSITIONS)}, "
                       f"got {self.ln_position!r}")
    if self.head not in HEADS:
      raise ValueError(f"model.head must be one of {list(HEADS)}, got {self.head!r}")
    if self.variant == "unit_scaled" and (self.ln_position, self.head) != ("pre", "lm"):
      raise ValueError(f"model.variant='unit_scaled' is pre-LN with a tied readout: it needs "
                       f"model.ln_position='pre' and model.head='lm', got "
                       f"{self.ln_position!r} and {self.head!r}")
    if self.dtype not in DTYPES:
      raise ValueError(f"model.dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
    if not 0 <= self.dropout < 1:
      raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads


VARIANTS = ("standard", "unit_scaled")
# bfloat16: products and activations in bf16; params, residual stream, LayerNorm
# statistics, softmax, logits and loss in float32. (float16 would need loss scaling.)
DTYPES = ("float32", "bfloat16")
LN_POSITIONS = ("pre", "post")
HEADS = ("lm", "mlm")


def gather_positions(x_BTD: Array, positions_BP: Array | None) -> Array:
  """x at the given positions per row, [B, P, D] (all of x when positions is None)."""
  if positions_BP is None:
    return x_BTD
  return jnp.take_along_axis(x_BTD, positions_BP[..., None].astype(jnp.int32), axis=1)


def scale_fn_for(cfg: ModelConfig, layer) -> scalings.ScaleFn:
  """The configured scaling, holding `layer`'s learned parameters (if any)."""
  params = dict(cfg.scaling_params or {})
  if cfg.scaling == "cosine":
    params["temperature"] = layer.temperature[...]
  if cfg.scaling == "qk_layernorm":
    params.update(q_scale=layer.q_norm_scale[...], k_scale=layer.k_norm_scale[...])
  return scalings.get(cfg.scaling, **params)


def residual_stream(model, tokens_BT, mask=None, dropout_key=None):
  """Embeddings then every block: the final residual stream [B, T, D].

  Shared by `Transformer` and the unit-scaled variant; each layer gets its own
  dropout key (split from `dropout_key`; None = no dropout).
  """
  cfg = model.cfg
  T = tokens_BT.shape[1]
  if T > cfg.block_size:
    raise ValueError(f"sequence length {T} exceeds model.block_size {cfg.block_size}")
  keys = (jax.random.split(dropout_key, cfg.num_layers + 1) if dropout_key is not None
          else [None] * (cfg.num_layers + 1))
  x_BTD = model.embed_tokens(tokens_BT, keys[0])
  for block, key in zip(model.blocks, keys[1:]):
    x_BTD = block(x_BTD, mask, key)
  return x_BTD


class AttentionCall(NamedTuple):
  """The exact inputs of one layer's attention call (what diagnostics inspect)."""

  q_BTNH: Array
  k_BSKH: Array
  v_BSKH: Array
  scale_fn: Any
  is_causal: bool
  normalizer: str


def attention_calls(model, tokens_BT, mask=None) -> list[AttentionCall]:
  """Every layer's attention inputs in a deterministic forward pass."""
  cfg = model.cfg
  x_BTD = model.embed_tokens(tokens_BT)
  calls = []
  for block in model.blocks:
    q, k, v = block.attn.qkv(block.attn_input(x_BTD))
    calls.append(AttentionCall(q, k, v, block.attn.scale_fn(), cfg.causal, cfg.normalizer))
    x_BTD = block(x_BTD, mask)
  return calls


def _dropout(x, rate, key):
  if key is None or rate == 0:
    return x
  keep = jax.random.bernoulli(key, 1 - rate, x.shape)
  return jnp.where(keep, x / (1 - rate), 0).astype(x.dtype)


def _normal(std):
  return nnx.initializers.normal(stddev=std)


class Attention(nnx.Module):
  """Multi-head self-attention with a configurable scaling."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    D, N, K, H = cfg.width, cfg.num_heads, cfg.kv_heads, cfg.head_dim
    dense = lambda out, std: layers.Dense(D, out, use_bias=False, kernel_init=_normal(std),
                                          dtype=cfg.dtype, rngs=rngs)
    self.q_proj = dense(N * H, cfg.init_std)
    self.k_proj = dense(K * H, cfg.init_std)
    self.v_proj = None if cfg.shared_kv else dense(K * H, cfg.init_std)
    self.out_proj = dense(D, cfg.init_std / math.sqrt(2 * cfg.num_layers))
    if cfg.qk_layernorm or cfg.scaling == "qk_layernorm":
      self.q_norm_scale = nnx.Param(jnp.ones((H,)))
      self.k_norm_scale = nnx.Param(jnp.ones((H,)))
    if cfg.scaling == "cosine":
      # Henry et al. 2020: a learned scalar per layer, g0 = log2(L^2 - L).
      self.temperature = nnx.Param(jnp.array(scalings.cosine_temperature_init(cfg.block_size)))

  def scale_fn(self) -> scalings.ScaleFn:
    """The configured scaling, holding this layer's learned parameters."""
    return scale_fn_for(self.cfg, self)

  def qkv(self, x_BTD: Array) -> tuple[Array, Array, Array]:
    """Projected q [B, T, N, H], k, v [B, T, K, H] (after the optional QK-LayerNorm)."""
    cfg = self.cfg
    B, T, _ = x_BTD.shape
    q_BTNH = self.q_proj(x_BTD).reshape(B, T, cfg.num_heads, cfg.head_dim)
    k_BTKH = self.k_proj(x_BTD).reshape(B, T, cfg.kv_heads, cfg.head_dim)
    v_BTKH = k_BTKH if cfg.shared_kv else self.v_proj(x_BTD).reshape(k_BTKH.shape)
    if cfg.qk_layernorm:
      ln = scalings.QKLayerNorm(self.q_norm_scale[...], self.k_norm_scale[...])
      normed = ln(q_BTNH, k_BTKH, None)
      q_BTNH, k_BTKH = normed.q.astype(q_BTNH.dtype), normed.k.astype(k_BTKH.dtype)
    return q_BTNH, k_BTKH, v_BTKH

  def __call__(self, x_BTD: Array, mask: Array | None = None) -> Array:
    B, T, D = x_BTD.shape
    q_BTNH, k_BTKH, v_BTKH = self.qkv(x_BTD)
    z_BTNH = attention(q_BTNH, k_BTKH, v_BTKH, scale_fn=self.scale_fn(),
                                     mask=mask, is_causal=self.cfg.causal,
                                     implementation=self.cfg.attention_impl,
                                     normalizer=self.cfg.normalizer)
    return self.out_proj(z_BTNH.reshape(B, T, D))


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    D, F = cfg.width, cfg.mlp_ratio * cfg.width
    self.up = layers.Dense(D, F, use_bias=False, kernel_init=_normal(cfg.init_std),
                           dtype=cfg.dtype, rngs=rngs)
    self.down = layers.Dense(F, D, use_bias=False,
                             kernel_init=_normal(cfg.init_std / math.sqrt(2 * cfg.num_layers)),
                             dtype=cfg.dtype, rngs=rngs)

  def __call__(self, x_BTD):
    return self.down(jax.nn.gelu(self.up(x_BTD)))


class Block(nnx.Module):
  """Pre-LN: x + Attn(LN(x)), then x + MLP(LN(x)); post-LN: LN(x + Attn(x)), LN(x + MLP(x))."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    ln = lambda: nnx.LayerNorm(cfg.width, use_bias=False, dtype=cfg.dtype, rngs=rngs)
    self.ln1, self.attn, self.ln2, self.mlp = ln(), Attention(cfg, rngs=rngs), ln(), MLP(cfg, rngs=rngs)

  def attn_input(self, x_BTD):
    """What the attention sees: LN(x) pre-LN, x itself post-LN."""
    return x_BTD if self.cfg.ln_position == "post" else self.ln1(x_BTD)

  def __call__(self, x_BTD, mask=None, dropout_key=None):
    k1, k2 = jax.random.split(dropout_key) if dropout_key is not None else (None, None)
    if self.cfg.ln_position == "post":
      x_BTD = self.ln1(x_BTD + _dropout(self.attn(x_BTD, mask), self.cfg.dropout, k1))
      return self.ln2(x_BTD + _dropout(self.mlp(x_BTD), self.cfg.dropout, k2))
    x_BTD = x_BTD + _dropout(self.attn(self.ln1(x_BTD), mask), self.cfg.dropout, k1)
    return x_BTD + _dropout(self.mlp(self.ln2(x_BTD)), self.cfg.dropout, k2)


def readout(x_BPD: Array, embed: nnx.Embed) -> Array:
  """Tied output layer x @ E^T: in the compute dtype, accumulated and returned in
  float32 (logits for a stable softmax cross-entropy)."""
  return layers.matmul(x_BPD, embed.embedding[...].T.astype(x_BPD.dtype),
                       preferred_element_type=jnp.promote_types(x_BPD.dtype, jnp.float32))


class MLMHead(nnx.Module):
  """BERT's masked-LM head: LN(GELU(dense(x))) @ E^T + b, E the tied token embedding."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.dense = layers.Dense(cfg.width, cfg.width, kernel_init=_normal(cfg.init_std),
                              dtype=cfg.dtype, rngs=rngs)
    self.ln = nnx.LayerNorm(cfg.width, dtype=cfg.dtype, rngs=rngs)
    self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,)))

  def __call__(self, x_BPD, embed: nnx.Embed):
    h_BPD = self.ln(jax.nn.gelu(self.dense(x_BPD)))
    return readout(h_BPD, embed) + self.bias[...]


class Transformer(nnx.Module):
  """Token + position embeddings, L blocks, final LN (pre-LN), tied output embedding."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.width, embedding_init=_normal(cfg.init_std),
                           rngs=rngs)
    self.pos_embed = nnx.Param(_normal(cfg.init_std)(rngs.params(), (cfg.block_size, cfg.width)))
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    # Pre-LN normalises the final stream; post-LN (BERT) the embeddings instead,
    # every block's output being normalised already. The GPT's parameters (and
    # their random init) stay exactly as they were.
    if cfg.ln_position == "pre":
      self.ln_f = nnx.LayerNorm(cfg.width, use_bias=False, dtype=cfg.dtype, rngs=rngs)
    else:
      self.ln_embed = nnx.LayerNorm(cfg.width, use_bias=False, dtype=cfg.dtype, rngs=rngs)
    if cfg.head == "mlm":
      self.mlm_head = MLMHead(cfg, rngs=rngs)

  def embed_tokens(self, tokens_BT, dropout_key=None):
    T = tokens_BT.shape[1]
    x_BTD = self.embed(tokens_BT) + self.pos_embed[:T]
    if self.cfg.ln_position == "post":
      x_BTD = self.ln_embed(x_BTD)
    # The residual stream stays float32 under a bfloat16 `dtype` (as torch.autocast's):
    # products and LayerNorm outputs take `dtype`, the sums of branches do not.
    return _dropout(x_BTD, self.cfg.dropout, dropout_key)

  def attention_calls(self, tokens_BT, *, mask=None) -> list[AttentionCall]:
    return attention_calls(self, tokens_BT, mask)

  def __call__(self, tokens_BT: Array, *, mask: Array | None = None,
               dropout_key: Array | None = None, positions: Array | None = None) -> Array:
    """Logits [B, T, V] (or [B, P, V]) in float32. Dropout is on iff `dropout_key` is given.

    Args:
      tokens_BT: int token ids.
      mask: optional boolean attention mask broadcastable to [B, N, T, T]
        (e.g. padding [B, 1, 1, T]), combined with causality when causal.
      dropout_key: PRNG key for dropout; None = deterministic (evaluation).
      positions: optional int [B, P]: logits only at these positions (the
        masked-LM targets; BERT's gather before the output layer).
    """
    x_BTD = residual_stream(self, tokens_BT, mask, dropout_key)
    if self.cfg.ln_position == "pre":
      x_BTD = self.ln_f(x_BTD)
    x_BPD = gather_positions(x_BTD, positions)
    if self.cfg.head == "mlm":
      return self.mlm_head(x_BPD, self.embed)
    return readout(x_BPD, self.embed)
