"""`ModelConfig`: the hyperparameters of every model variant (mirrors `config.model`).

The fields every variant reads sit at the top level; a variant's own fields sit
in its sub-config (`unit` for the unit-scaled transformer). Each bad value fails
at construction with a one-line ValueError naming the field and what is allowed;
checks that only one variant needs live in that variant's `validate_config`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnscale import checks
from attnscale.core import scalings
from attnscale.core.attention import IMPLEMENTATIONS, NORMALIZERS
from attnscale.core.positions import POSITIONS
from attnscale.numerics.layer_norm import IMPLEMENTATIONS as LAYERNORM_IMPLS
from attnscale.numerics.precision import FP8_SCALINGS

# bfloat16 / float16: products and activations in bf16 / fp16; params, residual
# stream, LayerNorm statistics, softmax, logits and loss in float32 (float16 with no
# loss scaling). fp8: simulated, float32 arithmetic with every matrix product's
# inputs rounded to e4m3 and its incoming gradient to e5m2 (attnscale/numerics/precision.py).
DTYPES = ("float32", "bfloat16", "float16", "fp8")
LN_POSITIONS = ("pre", "post")
SINKS = ("none", "zero", "learned")
GATES = ("none", "headwise", "elementwise")
HEAD_NORMS = ("none", "rmsnorm")  # model.head_norm: attnscale/core/head_outputs.py
HEADS = ("lm", "mlm")
QK_NORMS = ("none", "layernorm", "rmsnorm")  # model.qk_norm: the model's own, no scaling
PARAMETERIZATIONS = ("sp", "mup", "umup")  # model.parameterization: attnscale/models/mup.py
MUP_VECTOR_LRS = ("constant", "per_width")  # model.mup_vector_lr: attnscale/models/mup.py
REMATS = ("none", "full", "dots")  # config.remat: see models.base.REMAT_POLICIES
# The model variants by name, filled by attnscale/models/__init__.py (the variants
# import this module, so it cannot import them).
VARIANTS: dict[str, type] = {}
# Values that were renamed: (field, old value) -> new value.
RENAMED_VALUES = {("model.variant", "unit_scaled"): "unit"}


def field(default: Any = dataclasses.MISSING, doc: str = "", **kw) -> Any:
  """A config field: its default and its one-line doc (`metadata["doc"]`), the
  single source of `config.model` (attnscale.config.builders.model_fields) and of
  docs/reference/config.md. `top_level`: set from that top-level config field,
  not from `config.model`."""
  top_level = kw.pop("top_level", None)
  return dataclasses.field(default=default, metadata={"doc": doc, "top_level": top_level},
                           **kw)


@dataclasses.dataclass(frozen=True)
class UnitConfig:
  """The unit-scaled, residual-weighted transformer's fields (`config.model.unit`)."""

  residual_mult: float = field(1.0, "u-muP: all branches' weight against the embedding")
  residual_attn_ratio: float = field(1.0, "u-muP: attention / MLP branch weight ratio")
  residual_rule: str = field(
      "umup", "umup: (tau f + x)/sqrt(1+tau^2) | 2023: sqrt(1-tau) x + sqrt(tau) f")
  attn_residual: str = field(
      "rule", "rule (the depth rule only) | relative: attention tau x sqrt(e/n) (Graphcore's fix)")
  scaled_loss: bool = field(
      True, "the logits' gradient scaled to unit std, as unit_scaling's cross_entropy "
      "(False: the plain mean's ~1/(B T sqrt(V)), which low precision flushes)")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a model (mirrors `config.model`)."""

  vocab_size: int = field(65, "tokens (checked against the data)")
  block_size: int = field(
      256, "training context length; the longest sequence with learned positions")
  num_layers: int = field(6, "transformer blocks")
  num_heads: int = field(6, "attention heads (must divide width)")
  num_kv_heads: int | None = field(None, "key/value heads; None = num_heads; fewer = grouped-query")
  width: int = field(384, "d_model")
  mlp_ratio: int = field(4, "MLP hidden = mlp_ratio * width")
  dropout: float = field(
      0.0, "on embeddings and residual branches; none on attention weights (the fused kernel "
      "has none)")
  scaling: str = field("standard", "the attention scaling: a name from attnscale.scalings.names()")
  scaling_params: dict = field(
      doc="the scaling's params (e.g. key_norm_power's p); a learned one set here is fixed",
      default_factory=dict)
  qk_norm: str = field(
      "none", "none | layernorm | rmsnorm: a learned norm of q and k over the head dim "
      "before the scaling (was model.qk_layernorm=True: layernorm)")
  shared_kv: bool = field(False, "one projection for keys and values (W_K = W_V)")
  normalizer: str = field("softmax", "softmax | sigmoid (the softmax alternative; slow path)")
  attention_impl: str | None = field(
      None, "None: the fused kernel for the platform (native on a CPU where it built) | "
      "native (C++ flash attention, CPU) | xla (today's XLA kernel) | cudnn | splash | reference")
  layernorm_impl: str | None = field(
      None, "None: native on a CPU where it built, else flax's | native (C++ LayerNorm, CPU) | "
      "fused_xla (flax's forward, fused backward) | xla (flax's nn.LayerNorm, today's)")
  causal: bool = field(True, "False: bidirectional (an encoder); padding goes in the mask")
  ln_position: str = field("pre", "pre: x + f(LN(x)) (GPT-2) | post: LN(x + f(x)) (BERT)")
  head: str = field(
      "lm", "lm: the tied embedding | mlm: BERT's dense + GELU + LN, tied embedding, bias")
  dtype: str = field(
      "float32", "float32 | bfloat16 | float16 (no loss scaling) | fp8 (simulated: e4m3 "
      "product inputs, e5m2 gradients); params, softmax and loss stay float32")
  fp8_scaling: str = field(
      "none", "dtype=fp8: none | per_tensor (power-of-2 scale from the current amax)")
  init_std: float = field(0.02, "std of the weights' normal init (residual outputs / sqrt(2 L))")
  parameterization: str = field(
      "sp", "sp (standard) | mup: muP for Adam, standard variant (scalings standard, "
      "qk_rmsnorm, qk_layernorm, cosine, inverse_d): hidden init x sqrt(base_width/width), "
      "hidden LR x base_width/width, logits x base_width/width, attention "
      "sqrt(base_width/num_heads)/d (cosine unchanged) | umup: u-muP, unit variant with "
      "scaling umup: LR x L^-1/2 fan_in^-1/2 on block matrices, untied 1/fan_in readout "
      "(attnscale/models/mup.py; docs/experiments/width.md)")
  base_width: int = field(
      64, "mup: the width at which mup equals sp (64: graphcore_cpu's, where its LR was tuned)")
  mup_output_mult: float = field(
      1.0, "mup: the readout's base multiplier (microsoft/mup's output_mult): logits x "
      "mup_output_mult base_width/width; 1: sp's readout at the base width")
  mup_attn_mult: float = field(
      1.0, "mup: the attention's base multiplier: logits q.k mup_attn_mult sqrt(base_width/"
      "num_heads)/d; 1: sp's 1/sqrt(d) at the base width")
  mup_vector_lr: str = field(
      "constant", "mup: Adam LR of the embeddings, gains and biases: constant (muP's) | "
      "per_width: x base_width/width as the hidden matrices (an ablation that gives sp's "
      "relative rates with muP's forward pass; not muP)")
  depth_alpha: float = field(
      0.0, "residual branches x (base_depth/num_layers)^alpha, standard pre-LN only: 0 off | "
      "0.5 depth-muP | 1 CompleteP; also block LR x (num_layers/base_depth)^(alpha-1), Adam "
      "eps x (base_depth/num_layers)^alpha (docs/experiments/width.md)")
  base_depth: int = field(
      4, "depth_alpha > 0: the depth at which the rule is the base model (4: graphcore_cpu's)")
  logit_softcap: float = field(
      0.0, "c > 0: logits -> c tanh(logits / c) (Gemma 2: 50); 0 = off")
  sink: str = field(
      "none", "none | zero (off-by-one softmax) | learned (a sink logit per head)")
  attn_gate: str = field(
      "none", "none | headwise | elementwise: output * sigmoid(x W_g) (gated attention)")
  forget_gate: bool = field(
      False, "FoX (Lin et al. 2025): a learned per-head forget gate f_t = sigmoid(x_t w + b); "
      "logits_ij + sum_{l=j+1..i} log f_l, any normaliser; causal only")
  differential: bool = field(
      False, "differential attention (Ye et al. 2025): num_heads/2 heads, each "
      "(softmax(q1 k1) - lambda softmax(q2 k2)) v with q, k head dim width/num_heads and v "
      "twice as wide, then RMSNorm x (1 - lambda_init); the standard model's projections "
      "(+6 head_dim parameters a layer); needs even num_heads and kv heads")
  selective: bool = field(
      False, "selective attention (Leviathan et al. 2024): every head's logits minus "
      "F_ij = sum_{k<i} relu(head 0's l_kj), first key and diagonal left out; no "
      "parameters; causal only; the XLA kernel, O(B T^2) memory a layer")
  xsa: bool = field(
      False, "exclusive self-attention (Zhai 2026): each head's output minus its projection on "
      "the token's own value, z_i = y_i - (y_i . v_i) v_i / |v_i|^2; no parameters")
  head_norm: str = field(
      "none", "none | rmsnorm: each head's attention output RMS-normalised over its head dim, "
      "with a learned gain [N, H] (head-wise RMSNorm, arXiv 2605.06611)")
  positions: str = field(
      "learned", "learned (absolute table) | rope (rotary on q, k) | none (NoPE; causal only)")
  rope_base: float = field(10000.0, "rotary frequency base (positions=rope)")
  variant: str = field("standard", "the model: attnscale.models.VARIANTS (standard | unit)")
  unit: UnitConfig = field(UnitConfig(), "the unit variant's own fields")
  remat: str = field(
      "none", "rematerialisation of each block (a memory choice, not the model's maths)",
      top_level="remat")

  def __post_init__(self):
    if isinstance(self.unit, dict):  # from config.model.to_dict()
      object.__setattr__(self, "unit", UnitConfig(**self.unit))
    if ("model.variant", self.variant) in RENAMED_VALUES:
      raise ValueError(f"model.variant={self.variant!r} was renamed "
                       f"{RENAMED_VALUES['model.variant', self.variant]!r}")
    if self.variant not in VARIANTS:
      raise ValueError(checks.choice_error("model.variant", self.variant, VARIANTS))
    # Unknown names fail here, listing the valid ones (the one check of model.scaling).
    entry = scalings.entry(self.scaling, field="model.scaling")
    scalings.get(self.scaling, **dict(self.scaling_params or {}))  # bad params fail now
    if self.width % self.num_heads:
      raise ValueError(f"model.num_heads ({self.num_heads}) must divide model.width "
                       f"({self.width})")
    if self.num_heads % self.kv_heads:
      raise ValueError(f"model.num_kv_heads ({self.kv_heads}) must divide model.num_heads "
                       f"({self.num_heads})")
    if self.qk_norm not in QK_NORMS:
      raise ValueError(f"model.qk_norm must be one of {list(QK_NORMS)}, got {self.qk_norm!r}")
    if self.qk_norm != "none" and entry.normalizes_qk:
      raise ValueError(f"model.qk_norm={self.qk_norm!r} with scaling={self.scaling!r} would "
                       "normalise q and k twice: use one of them")
    if self.normalizer not in NORMALIZERS:
      raise ValueError(checks.choice_error("model.normalizer", self.normalizer, NORMALIZERS))
    if self.attention_impl not in IMPLEMENTATIONS:
      raise ValueError(f"model.attention_impl must be one of "
                       f"{IMPLEMENTATIONS}, got {self.attention_impl!r}")
    if self.layernorm_impl not in LAYERNORM_IMPLS:
      raise ValueError(f"model.layernorm_impl must be one of {list(LAYERNORM_IMPLS)}, "
                       f"got {self.layernorm_impl!r}")
    if self.ln_position not in LN_POSITIONS:
      raise ValueError(f"model.ln_position must be one of {list(LN_POSITIONS)}, "
                       f"got {self.ln_position!r}")
    if self.head not in HEADS:
      raise ValueError(f"model.head must be one of {list(HEADS)}, got {self.head!r}")
    if self.remat not in REMATS:
      raise ValueError(f"config.remat must be one of {list(REMATS)}, got {self.remat!r}")
    if self.dtype not in DTYPES:
      raise ValueError(f"model.dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
    if self.fp8_scaling not in FP8_SCALINGS:
      raise ValueError(f"model.fp8_scaling must be one of {list(FP8_SCALINGS)}, "
                       f"got {self.fp8_scaling!r}")
    if not self.logit_softcap >= 0:
      raise ValueError(f"model.logit_softcap must be >= 0 (0 = off), got {self.logit_softcap}")
    if self.sink not in SINKS:
      raise ValueError(f"model.sink must be one of {list(SINKS)}, got {self.sink!r}")
    if self.sink != "none" and self.normalizer != "softmax":
      raise ValueError(f"model.sink={self.sink!r} needs model.normalizer='softmax' (a sink "
                       f"adds to the softmax's denominator), got {self.normalizer!r}")
    if self.attn_gate not in GATES:
      raise ValueError(f"model.attn_gate must be one of {list(GATES)}, got {self.attn_gate!r}")
    if self.forget_gate and not self.causal:
      raise ValueError("model.forget_gate=True needs model.causal=True: FoX's gate decays "
                       "with the distance back in time, which a bidirectional encoder has not")
    if self.selective and not self.causal:
      raise ValueError("model.selective=True needs model.causal=True: a query masks keys "
                       "for the queries after it, an order a bidirectional encoder has not")
    if self.selective and self.attention_impl in ("cudnn", "splash"):
      raise ValueError(f"model.selective=True cannot run on model.attention_impl="
                       f"{self.attention_impl!r} (no [T, S] logit bias there): use None, "
                       "'xla' or 'reference'")
    if self.normalizer == "stickbreaking" and not self.causal:
      raise ValueError("model.normalizer='stickbreaking' needs model.causal=True: the stick "
                       "breaks from the nearest earlier key back, an order an encoder has not")
    if self.head_norm not in HEAD_NORMS:
      raise ValueError(f"model.head_norm must be one of {list(HEAD_NORMS)}, "
                       f"got {self.head_norm!r}")
    if self.positions not in POSITIONS:
      raise ValueError(f"model.positions must be one of {list(POSITIONS)}, "
                       f"got {self.positions!r}")
    if self.positions == "none" and not self.causal:
      raise ValueError("model.positions='none' needs model.causal=True: a bidirectional "
                       "encoder cannot infer positions (use 'learned' or 'rope')")
    if self.positions == "rope" and self.head_dim % 2:
      raise ValueError(f"model.positions='rope' needs an even head dim, got "
                       f"width/num_heads = {self.head_dim}")
    if not self.rope_base > 1:
      raise ValueError(f"model.rope_base must be > 1, got {self.rope_base}")
    if not 0 <= self.dropout < 1:
      raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")
    if self.differential:
      self._validate_differential()
    self._validate_parameterization()
    VARIANTS[self.variant].validate_config(self)

  def _validate_differential(self):
    """model.differential's needs: two maps per head, and the options it cannot take."""
    for name, heads in (("model.num_heads", self.num_heads),
                        ("model.num_kv_heads", self.kv_heads)):
      if heads % 2:
        raise ValueError(f"model.differential=True needs an even {name} (num_heads/2 "
                         f"differential heads, each two maps of width/num_heads), got {heads}")
    if self.shared_kv:
      raise ValueError("model.differential=True cannot take model.shared_kv=True: its keys "
                       "are two maps of head dim H and its values 2 H wide, so W_K = W_V "
                       "has no meaning")
    if self.attn_gate != "none":
      raise ValueError(f"model.differential=True cannot take model.attn_gate="
                       f"{self.attn_gate!r}: no rule says whether the gate acts on each "
                       "map or on the differential head after its norm: use "
                       "model.attn_gate='none'")
    if self.xsa or self.head_norm != "none":
      raise ValueError("model.differential=True cannot take model.xsa or model.head_norm: "
                       "its heads already end in their own RMSNorm, and no rule says "
                       "which of the two maps' values XSA would project out")
    if self.selective:
      raise ValueError("model.differential=True cannot take model.selective=True: no rule "
                       "says which of head 0's two maps selects, nor whether F enters both")
    if self.parameterization == "mup":
      raise ValueError("model.parameterization='mup' cannot apply to model.differential=True: "
                       "muP's rules for lambda's reparameterisation (exp of a dot of learned "
                       "vectors) and the heads' RMSNorm are not derived here")

  def _validate_parameterization(self):
    if self.parameterization not in PARAMETERIZATIONS:
      raise ValueError(f"model.parameterization must be one of {list(PARAMETERIZATIONS)}, "
                       f"got {self.parameterization!r}")
    if isinstance(self.base_width, bool) or not isinstance(self.base_width, int) or (
        self.base_width < 1):
      raise ValueError(f"model.base_width must be an int >= 1, got {self.base_width!r}")
    if self.parameterization == "mup" and self.variant != "standard":
      raise ValueError(f"model.parameterization='mup' needs model.variant='standard', got "
                       f"{self.variant!r} (the unit variant is u-muP already)")
    if self.parameterization == "mup":
      reason = mup_refusal(self)
      if reason:
        raise ValueError(f"model.parameterization='mup' cannot apply: {reason}")
    if self.parameterization == "umup" and not (
        self.variant == "unit" and scalings.entry(self.scaling).umup):
      allowed = " or ".join(repr(n) for n in scalings.names() if scalings.entry(n).umup)
      raise ValueError(f"model.parameterization='umup' needs model.variant='unit' and "
                       f"model.scaling={allowed} (u-muP's attention), got {self.variant!r} and "
                       f"{self.scaling!r}")

    for name in ("mup_output_mult", "mup_attn_mult"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"model.{name} must be a number > 0, got {value!r}")
      if value != 1 and self.parameterization != "mup":
        raise ValueError(f"model.{name}={value} needs model.parameterization='mup', got "
                         f"{self.parameterization!r}")
    if self.mup_vector_lr not in MUP_VECTOR_LRS:
      raise ValueError(f"model.mup_vector_lr must be one of {', '.join(MUP_VECTOR_LRS)}, got "
                       f"{self.mup_vector_lr!r}")
    if self.mup_vector_lr != "constant" and self.parameterization != "mup":
      raise ValueError(f"model.mup_vector_lr={self.mup_vector_lr!r} needs "
                       f"model.parameterization='mup', got {self.parameterization!r}")
    if isinstance(self.depth_alpha, bool) or not isinstance(self.depth_alpha, (int, float)) or (
        not 0 <= self.depth_alpha <= 1):
      raise ValueError(f"model.depth_alpha must be a number in [0, 1] (0 off, 0.5 depth-muP, "
                       f"1 CompleteP), got {self.depth_alpha!r}")
    if isinstance(self.base_depth, bool) or not isinstance(self.base_depth, int) or (
        self.base_depth < 1):
      raise ValueError(f"model.base_depth must be an int >= 1, got {self.base_depth!r}")
    if self.depth_alpha and (self.variant != "standard" or self.ln_position != "pre"):
      raise ValueError(f"model.depth_alpha={self.depth_alpha} needs model.variant='standard' "
                       f"and model.ln_position='pre' (a pre-LN residual stream), got "
                       f"{self.variant!r}, {self.ln_position!r}")

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads

  @property
  def scaling_dims(self) -> scalings.Dims:
    """The sizes a scaling's learned parameters are shaped and initialised by."""
    return scalings.Dims(heads=self.num_heads, kv_heads=self.kv_heads,
                         head_dim=self.head_dim, train_len=self.block_size)


def mup_refusal(cfg: ModelConfig) -> str | None:
  """Why mup does not apply to `cfg`'s attention scaling (one clause), or None: the
  scaling's registration declares its muP rule (`scalings.MupRule`) or why none."""
  rule = scalings.entry(cfg.scaling).mup
  if isinstance(rule, scalings.MupRule):
    if rule.mult is None and cfg.mup_attn_mult != 1:
      return (f"scaling={cfg.scaling!r} has no width exponent for mup_attn_mult to fix "
              f"({rule.why}): use model.mup_attn_mult=1")
    return None
  if rule:
    return f"scaling={cfg.scaling!r}: {rule}"
  defined = [n for n in scalings.names() if isinstance(scalings.entry(n).mup, scalings.MupRule)]
  return (f"scaling={cfg.scaling!r} declares no muP rule (defined: {defined}): register it "
          f"with mup=scalings.MupRule(...) (the keyword that multiplies its logits) or "
          f"mup='why none applies'")
