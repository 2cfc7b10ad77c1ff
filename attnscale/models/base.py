"""The model contract, and what every variant shares.

A model variant is an `nnx.Module` subclass of `Model`, registered by name in
`attnscale.models.VARIANTS`. It provides an embedding, a list of blocks and a
readout; `Model` turns those into the forward pass (`__call__`) and into the
inspection that diagnostics, evaluation and studies use (`attention_calls`), so
nothing outside a variant guesses at its attributes. Each block's attention is an
`AttentionLayer`: a variant supplies its projections (`qkv`, `project_out`), and
the layer supplies the scaling (with its learned parameters, `ScalingParams`)
and the one call to `attnscale.core.attention`.

Attention health: `attention_stats(model, fn)` runs `fn(model)` with every
layer recording its per-query `AttentionStats` (sown as `nnx.Intermediate`: the
ordinary call is unchanged and remat passes them through), and `qk_clip` rescales
the q and k projections of the heads whose largest logit passed a threshold.

Dimension legend: B batch, T sequence, P prediction slots, D width, N heads,
K key/value heads, H head dim, V vocabulary.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from attnscale.core import differential as differential_lib
from attnscale.core import head_outputs, scalings, sharding
from attnscale.core import positions as positions_lib

# The module's name is shadowed by the function in attnscale/__init__.py.
from attnscale.core.attention import AttentionStats, attention
from attnscale.models import mup
from attnscale.models.config import ModelConfig
from attnscale.numerics import precision

Array = jax.Array


class AttentionCall(NamedTuple):
  """The exact inputs of one layer's attention call (what diagnostics inspect).

  A differential layer (`model.differential`) makes one call for its two maps,
  and this is that call: q [B, T, N, H] holds the N/2 heads' first maps then
  their second maps, k [B, S, K, H] likewise, v [B, S, K, 2 H] the K/2 value heads
  twice (`DifferentialHeads`). So the diagnostics see each softmax map as a head
  (heads [0, N/2) the maps p1, [N/2, N) the maps p2): entropy, largest logit
  and sink rate per map, and the output std of the maps' outputs before their
  difference. The difference p1 - lambda p2 is not reported: with negative
  weights it is no distribution, so it has no entropy, and its weight on the
  first key is the two maps' sink rates combined by lambda.
  """

  q_BTNH: Array
  k_BSKH: Array
  v_BSKH: Array
  scale_fn: scalings.ScaleFn
  is_causal: bool
  normalizer: str
  logit_softcap: float | None = None  # c: logits -> c tanh(logits / c)
  sink: Array | float | None = None  # the sink logit b (per head [N], or 0.0 = off-by-one)
  log_forget: Array | None = None  # FoX's log f_t [B, T, N] (model.forget_gate), else None
  selective: bool = False  # selective attention's -F from head 0 (model.selective)

  def options(self) -> dict[str, Any]:
    """The keyword arguments of `attention` besides q, k, v and the mask (the
    soft-cap and the sink only when on)."""
    options = {"scale_fn": self.scale_fn, "is_causal": self.is_causal,
               "normalizer": self.normalizer}
    if self.logit_softcap is not None:
      options["logit_softcap"] = self.logit_softcap
    if self.sink is not None:
      options["sink"] = self.sink
    if self.log_forget is not None:
      options["log_forget"] = self.log_forget
    if self.selective:
      options["selective"] = True
    return options


def dropout(x: Array, rate: float, key: Array | None) -> Array:
  """Inverted dropout; the identity when `key` is None (evaluation) or rate is 0."""
  if key is None or rate == 0:
    return x
  keep = jax.random.bernoulli(key, 1 - rate, x.shape)
  return jnp.where(keep, x / (1 - rate), 0).astype(x.dtype)


def split_key(key: Array | None, num: int) -> list[Array | None]:
  """`num` dropout keys from `key` (all None when dropout is off)."""
  return list(jax.random.split(key, num)) if key is not None else [None] * num


def check_length(cfg: ModelConfig, length: int) -> None:
  """One-line ValueError if the model cannot represent `length` positions."""
  if cfg.positions == "learned" and length > cfg.block_size:
    raise ValueError(f"sequence length {length} exceeds model.block_size {cfg.block_size}, "
                     "the learned position table: train with model.positions='rope' or "
                     "'none' to run longer than training")


def attention_kernel(cfg: ModelConfig) -> str:
  """The kernel this model's attention runs in a program for the current mesh's
  platform (`fused.kernel_for`, the one rule): "native", "xla", "splash", "cudnn" or
  "reference". For provenance.json, so that a run says which kernel trained it."""
  if cfg.attention_impl == "reference":
    return "reference"
  from attnscale.core import fused
  dtype = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}.get(cfg.dtype, jnp.float32)
  factory = scalings.entry(cfg.scaling).factory
  shape = (1, cfg.block_size, cfg.num_heads, cfg.width // cfg.num_heads)
  return fused.kernel_for(
      cfg.attention_impl, shape, shape[:2] + (cfg.num_kv_heads or cfg.num_heads, shape[3]),
      dtype, None, cfg.normalizer, cfg.logit_softcap or None,
      None if cfg.sink == "none" else 0.0, log_forget=cfg.forget_gate,
      logit_mod=getattr(factory, "logit_mod", None), pair_bias=cfg.selective)


def layernorm_kernel(cfg: ModelConfig) -> str:
  """The kernel this model's LayerNorms run in a program for the current mesh's
  platform (`attnscale.numerics.layer_norm.kernel_for`): "native", "fused_xla" or
  "xla" (flax's); the unit variant's own LayerNorm is XLA's. For provenance.json."""
  if cfg.variant == "unit":
    return "xla"
  from attnscale.numerics import layer_norm, precision
  dtype = precision.compute_dtype(cfg.dtype)
  return layer_norm.kernel_for(cfg.layernorm_impl, jnp.float32, dtype)


def gather_positions(x_BTD: Array, positions_BP: Array | None) -> Array:
  """x at the given positions per row, [B, P, D] (all of x when positions is None)."""
  if positions_BP is None:
    return x_BTD
  return jnp.take_along_axis(x_BTD, positions_BP[..., None].astype(jnp.int32), axis=1)


class ScalingParams(nnx.Module):
  """The parameters a scaling learns, in one attention layer (`scalings.Learned`).

  Created from the scaling's registration alone, so a new learned scaling needs
  no model code: one `nnx.Param` per declared keyword (not fixed in
  `scaling_params`), shaped and initialised from the model's sizes, and the
  registration's `from_dims` values (e.g. a training length) fixed from them.
  """

  def __init__(self, name: str, params: dict[str, Any] | None, dims: scalings.Dims):
    self.name = name
    entry = scalings.entry(name)
    fixed = {key: f(dims) for key, f in entry.from_dims.items()}
    fixed.update(params or {})
    self.fixed = tuple(sorted(fixed.items()))  # static, not learned
    self.learned_names = tuple(k for k in entry.learned if k not in fixed)
    for key in self.learned_names:
      setattr(self, key, nnx.Param(scalings.learned(name)[key].initial_value(dims)))

  def __call__(self) -> scalings.ScaleFn:
    """The scaling, holding this layer's current parameter values."""
    learned = {key: getattr(self, key)[...] for key in self.learned_names}
    return scalings.get(self.name, **dict(self.fixed), **learned)


class DifferentialHeads(nnx.Module):
  """`model.differential`'s parameters and head output (Ye et al. 2025, "Differential
  Transformer", ICLR 2025, arXiv 2410.05258; `attnscale.core.differential`):

      z_n = (1 - lambda_init) RMSNorm((p1_n - lambda p2_n) v_n),
      lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,
      lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for layer l = 1, 2, ...

  Parameter matching, the paper's: a differential model at num_heads = N has
  N/2 heads, each two maps whose q and k have the standard head dim H =
  width/N, and values 2 H wide. Its q, k, v and output projections are then
  the standard model's matrices ([D, N H], [D, K H], [D, K H], [N H, D]), so
  it has the standard model's parameters at the same width, plus 6 H a layer:
  lq1, lk1, lq2, lk2 [H] (init N(0, 0.1), one lambda per layer, as the
  reference code's) and the norm's gain [2 H] (init 1, shared by the heads).
  The kernel sees N heads of dim H (first maps, then second maps: a scaling's
  per-head parameters, a learned sink and FoX's gate are per map), and the
  N/2 heads' outputs, 2 H each, fill the output projection's N H inputs.
  """

  def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
    H = cfg.head_dim
    self.lambda_init = differential_lib.lambda_init(layer)  # static: the layer's constant
    init = nnx.initializers.normal(stddev=0.1)
    self.lambda_q1 = nnx.Param(init(rngs.params(), (H,), jnp.float32))
    self.lambda_k1 = nnx.Param(init(rngs.params(), (H,), jnp.float32))
    self.lambda_q2 = nnx.Param(init(rngs.params(), (H,), jnp.float32))
    self.lambda_k2 = nnx.Param(init(rngs.params(), (H,), jnp.float32))
    self.norm_gain = nnx.Param(jnp.ones((2 * H,), jnp.float32))

  def lam(self) -> Array:
    """This layer's lambda, a float32 scalar."""
    return differential_lib.reparameterised_lambda(
        self.lambda_q1[...], self.lambda_k1[...], self.lambda_q2[...], self.lambda_k2[...],
        self.lambda_init)

  def __call__(self, z_BTNV: Array) -> Array:
    """The kernel's output [B, T, N, 2 H] (first maps, then second maps) -> the N/2
    differential heads' outputs [B, T, N/2, 2 H], float32."""
    return differential_lib.head_output(differential_lib.combine(z_BTNV, self.lam()),
                                        self.norm_gain[...], self.lambda_init)


class AttentionLayer(nnx.Module):
  """Self-attention: a variant's projections around the configured scaling.

  The options every variant shares live here: the scaling's parameters, rotary
  positions, the logit soft-cap, the attention sink (`model.sink`: "zero" is
  the off-by-one softmax, "learned" one sink logit per head, initialised to 0,
  gpt-oss) and selective attention (`model.selective`: no parameters, the
  kernel's option, `attnscale.core.selective`), and what is done to each head's
  output after the kernel (`attnscale.core.head_outputs`): exclusive self-attention
  (`model.xsa`) and a per-head RMSNorm (`model.head_norm`, its gain here), before
  the output gate. An output gate (`model.attn_gate`) and FoX's forget gate
  (`model.forget_gate`) need projections, so a variant that offers them implements
  `gate_logits` and `forget_logits`. Differential attention (`model.differential`)
  needs its parameters: a variant that offers it sets `differential` to a
  `DifferentialHeads` and returns the values of its N/2 heads, [B, T, K/2, 2 H],
  from `qkv`.
  """

  # Set by `attention_stats` on a model merged for one step: sow this layer's stats.
  record_stats = False

  def __init__(self, cfg: ModelConfig):
    self.cfg = cfg
    self.differential: DifferentialHeads | None = nnx.data(None)  # a variant may set one
    # Under mup, what the scaling's muP rule makes of it (attnscale/models/mup.py).
    self.scaling = ScalingParams(*mup.attention_scaling(cfg), cfg.scaling_dims)
    self.sink_logit = (nnx.Param(jnp.zeros((cfg.num_heads,), jnp.float32))
                       if cfg.sink == "learned" else None)
    # model.head_norm's gain, one per head and dimension, at 1.
    self.head_norm_gain = (nnx.Param(jnp.ones((cfg.num_heads, cfg.head_dim), jnp.float32))
                           if cfg.head_norm == "rmsnorm" else None)

  def sink(self) -> Array | float | None:
    """The sink logit passed to `attention`: None (no sink), 0.0, or [N] learned."""
    if self.cfg.sink == "zero":
      return 0.0
    return None if self.sink_logit is None else self.sink_logit[...]

  def gate_logits(self, x_BTD: Array) -> Array:
    """Output gate logits [B, T, N, 1] (headwise) or [B, T, N, H] (elementwise):
    z * sigmoid(x W_g) (Qiu et al. 2025). Variants with a gate override this."""
    raise NotImplementedError(f"{type(self).__name__} has no output gate")

  def forget_logits(self, x_BTD: Array) -> Array:
    """FoX's forget-gate logits [B, T, N], x_t w + b (`model.forget_gate`). Variants
    with the gate override this."""
    raise NotImplementedError(f"{type(self).__name__} has no forget gate")

  def log_forget(self, x_BTD: Array) -> Array | None:
    """log f_t = log sigmoid(x_t w + b) [B, T, N] in float32, or None without the gate.

    The Forgetting Transformer (Lin et al., ICLR 2025, arXiv 2503.02130): query i's
    logit on key j gains sum_{l=j+1..i} log f_l <= 0, a data-dependent decay with the
    distance back (the kernel builds it from the cumulative sum,
    `attnscale.core.attention`). As the authors' layer: a [D, N] projection with a
    bias, the weights at the hidden init and the bias at 0 (f about 1/2 at init).
    """
    if not self.cfg.forget_gate:
      return None
    return jax.nn.log_sigmoid(self.forget_logits(x_BTD).astype(jnp.float32))

  def qkv(self, x_BTD: Array) -> tuple[Array, Array, Array]:
    """q [B, T, N, H], k and v [B, T, K, H]: what the scaling sees (differential:
    v [B, T, K/2, 2 H], see `AttentionCall`)."""
    raise NotImplementedError

  def project_out(self, z_BTD: Array) -> Array:
    """The output projection of the heads' concatenated outputs."""
    raise NotImplementedError

  def qk_weights(self) -> tuple[nnx.Param, nnx.Param]:
    """The q and k projection weights, [D, N * H] and [D, K * H] (head n's columns
    n H .. n H + H - 1), of which q and k are linear functions: what QK-clip scales."""
    raise NotImplementedError(f"{type(self).__name__} does not expose its q and k "
                              "projections (qk_weights): QK-clip cannot rescale them")

  def scale_fn(self) -> scalings.ScaleFn:
    return self.scaling()

  def call_inputs(self, x_BTD: Array) -> AttentionCall:
    q_BTNH, k_BTKH, v_BTKH = self.qkv(x_BTD)
    if self.cfg.positions == "rope":
      # Before the scaling: norms, key-norm sums and cosines see the rotated
      # vectors the logits are made of (rotation keeps norms).
      positions_T = jnp.arange(x_BTD.shape[1])
      q_BTNH = positions_lib.rope(q_BTNH, positions_T, self.cfg.rope_base)
      k_BTKH = positions_lib.rope(k_BTKH, positions_T, self.cfg.rope_base)
    if self.differential is not None:  # both maps weigh the same values
      v_BTKH = differential_lib.twice(v_BTKH, axis=2)
    return AttentionCall(q_BTNH, k_BTKH, v_BTKH, self.scale_fn(), self.cfg.causal,
                         self.cfg.normalizer, self.cfg.logit_softcap or None, self.sink(),
                         self.log_forget(x_BTD), self.cfg.selective)

  def __call__(self, x_BTD: Array, mask: Array | None = None) -> Array:
    B, T, D = x_BTD.shape
    call = self.call_inputs(x_BTD)
    q_BTNH, k_BTKH, v_BTKH = precision.attention_inputs(self.cfg, call.q_BTNH, call.k_BSKH,
                                                        call.v_BSKH)
    z_BTNH = attention(q_BTNH, k_BTKH, v_BTKH, mask=mask,
                       implementation=self.cfg.attention_impl, return_stats=self.record_stats,
                       **call.options())
    if self.record_stats:
      z_BTNH, stats = z_BTNH
      self.sow(nnx.Intermediate, "attn_stats", stats)
    if self.differential is not None:  # [B, T, N, 2 H] -> [B, T, N/2, 2 H]
      z_BTNH = self.differential(z_BTNH).astype(z_BTNH.dtype)
    if self.cfg.xsa:  # after the kernel, so every path and normaliser takes it alike
      z_BTNH = head_outputs.exclusive(z_BTNH, v_BTKH).astype(z_BTNH.dtype)
    if self.head_norm_gain is not None:
      z_BTNH = head_outputs.head_rms_norm(z_BTNH, self.head_norm_gain[...]).astype(z_BTNH.dtype)
    if self.cfg.attn_gate != "none":
      # Gated attention (Qiu et al. 2025, the SDPA-output gate G1): each head's
      # output (or each element of it) times sigmoid of a projection of the
      # layer's input, so a head can output nothing without a sink.
      gate = jax.nn.sigmoid(self.gate_logits(x_BTD).astype(jnp.float32))
      z_BTNH = (z_BTNH * gate).astype(z_BTNH.dtype)
    return self.project_out(z_BTNH.reshape(B, T, D))


class Block(nnx.Module):
  """One residual block; `attn` is its `AttentionLayer`."""

  attn: AttentionLayer

  def attn_input(self, x_BTD: Array) -> Array:
    """What the attention sees of the residual stream x (e.g. LN(x))."""
    raise NotImplementedError

  def __call__(self, x_BTD: Array, mask: Array | None = None,
               dropout_key: Array | None = None) -> Array:
    """The residual stream after this block."""
    raise NotImplementedError

  def attention_call(self, x_BTD: Array) -> AttentionCall:
    return self.attn.call_inputs(self.attn_input(x_BTD))


# model.remat -> the jax.checkpoint policy of each block: what its backward pass
# keeps from the forward pass (the rest is recomputed).
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,  # only the block's input
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # matmul outputs
}


def _remat(block: Block, remat: str):
  """`block` itself ("none"), or the block rematerialised under `REMAT_POLICIES[remat]`."""
  if remat == "none":
    return block
  run = nnx.remat(lambda b, x_BTD, mask, key: b(x_BTD, mask, key),
                  policy=REMAT_POLICIES[remat])
  return lambda x_BTD, mask, key: run(block, x_BTD, mask, key)


def attention_stats(model: Model, fn) -> tuple[Any, list[AttentionStats]]:
  """(fn(model), each layer's `AttentionStats` [B, T, N] from that forward pass).

  `fn` runs the model once (e.g. `task.loss(model, batch, key)`); every
  `AttentionLayer` of `model.blocks` records its stats meanwhile (on the fused
  path, no gradient). `model` should be one merged for this call: the flag stays set.
  """
  for block in model.blocks:
    block.attn.record_stats = True
  out, sown = nnx.capture(fn, nnx.Intermediate)(model)
  stats = [sown["blocks"][i]["attn"]["attn_stats"].get_value()[-1]
           for i in range(len(model.blocks))]
  return out, stats


def qk_clip(model: Model, max_logit_LN: Array, tau: float) -> Array:
  """QK-clip (Kimi K2, Moonshot AI 2025, "Kimi K2: Open Agentic Intelligence", arXiv
  2507.20534): rescales in place the q and k weights of every head whose largest logit
  S (`max_logit_LN`, layer x query head) exceeds tau, so that its logits on that batch
  become at most tau: logits bilinear in W_q and W_k (`scalings.Entry.bilinear`) scale
  by the product of the two factors.

  * One key head per query head (K = N, k not shared with v): W_q and W_k of head n
    each times sqrt(tau / S_n).
  * Grouped-query attention (K < N: a key head serves G query heads), or W_k = W_v
    (`model.shared_kv`): only the clipped query heads' W_q, times tau / S_n; the
    shared key (and value) heads stay, so an unclipped head changes nowhere.

  Unclipped heads are multiplied by exactly 1.0, so their weights stay bit for bit.
  Returns the factor applied to each head's logits [L, N] (1 = not clipped).
  """
  logit_factor_LN = jnp.where(max_logit_LN > tau, tau / max_logit_LN, 1.0)
  for block, factor_N in zip(model.blocks, logit_factor_LN):
    layer = block.attn
    cfg = layer.cfg
    w_q, w_k = layer.qk_weights()
    H = cfg.head_dim
    if cfg.kv_heads == cfg.num_heads and not cfg.shared_kv:
      f_N = jnp.sqrt(factor_N)
      w_k[...] = w_k[...] * jnp.repeat(f_N, H).astype(w_k[...].dtype)[None, :]
    else:
      f_N = factor_N
    w_q[...] = w_q[...] * jnp.repeat(f_N, H).astype(w_q[...].dtype)[None, :]
  return logit_factor_LN


def qk_clip_refusal(cfg: ModelConfig) -> str | None:
  """Why QK-clip cannot serve this model (one clause), or None if it can."""
  if not scalings.entry(cfg.scaling).bilinear:
    return (f"model.scaling={cfg.scaling!r} does not have logits bilinear in the q and k "
            "projections (it normalises q or k, or divides by key norms), so rescaling "
            "them does not bound its logits")
  if cfg.qk_norm != "none":
    return (f"model.qk_norm={cfg.qk_norm!r} normalises q and k (their gains are shared "
            "by the heads), so rescaling the projections does not bound the logits")
  if cfg.logit_softcap:
    return (f"model.logit_softcap={cfg.logit_softcap:g} already bounds the logits and "
            "its tanh is not bilinear")
  return None


class Model(nnx.Module):
  """The contract of a model variant: embed, blocks, readout.

  Subclasses set `cfg` and `blocks` (an `nnx.List` of `Block`) and implement
  `embed_tokens` and `logits`; they get the forward pass and `attention_calls`.
  """

  cfg: ModelConfig
  blocks: nnx.List

  @classmethod
  def validate_config(cls, cfg: ModelConfig) -> None:
    """Checks of the fields only this variant reads (one-line ValueError)."""

  def embed_tokens(self, tokens_BT: Array, dropout_key: Array | None = None) -> Array:
    """The residual stream's start [B, T, D]."""
    raise NotImplementedError

  def logits(self, x_BPD: Array) -> Array:
    """Logits [B, P, V] in float32 from the final residual stream at P positions."""
    raise NotImplementedError

  def loss_grad_scale(self, num_targets: int) -> float:
    """The constant by which this model's backward pass scales every gradient
    for a loss over `num_targets` logit rows (1: none). The train step divides the
    parameters' gradients by it, in float32, before the optimizer."""
    del num_targets
    return 1.0

  def residual_stream(self, tokens_BT: Array, mask: Array | None = None,
                      dropout_key: Array | None = None) -> Array:
    """Embeddings then every block: the final residual stream [B, T, D].

    Each layer gets its own dropout key (split from `dropout_key`; None = none).
    """
    check_length(self.cfg, tokens_BT.shape[1])
    keys = split_key(dropout_key, len(self.blocks) + 1)
    # The residual stream stays on the batch axes (attnscale/core/sharding.py says why).
    x_BTD = sharding.constrain_batch(self.embed_tokens(tokens_BT, keys[0]))
    for block, key in zip(self.blocks, keys[1:]):
      x_BTD = sharding.constrain_batch(_remat(block, self.cfg.remat)(x_BTD, mask, key))
    return x_BTD

  def attention_calls(self, tokens_BT: Array, *, mask: Array | None = None
                      ) -> list[AttentionCall]:
    """Every layer's attention inputs in a deterministic forward pass."""
    return [call for call, _ in self.layer_trace(tokens_BT, mask=mask)]

  def layer_trace(self, tokens_BT: Array, *, mask: Array | None = None
                  ) -> list[tuple[AttentionCall, Array]]:
    """Per layer, in one deterministic forward pass: its attention's inputs and the
    residual stream [B, T, D] its block writes (what diagnostics inspect)."""
    x_BTD = self.embed_tokens(tokens_BT)
    trace = []
    for block in self.blocks:
      call = block.attention_call(x_BTD)
      x_BTD = block(x_BTD, mask)
      trace.append((call, x_BTD))
    return trace

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
    x_BTD = self.residual_stream(tokens_BT, mask, dropout_key)
    return self.logits(gather_positions(x_BTD, positions))
