"""`ModelConfig`: the hyperparameters of every model variant (mirrors `config.model`).

The fields every variant reads sit at the top level; a variant's own fields sit
in its sub-config (`unit` for the unit-scaled transformer). Each bad value fails
at construction with a one-line ValueError naming the field and what is allowed;
checks that only one variant needs live in that variant's `validate_config`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnscale.core import scalings
from attnscale.core.attention import IMPLEMENTATIONS, NORMALIZERS
from attnscale.numerics.precision import FP8_SCALINGS
from attnscale.core.positions import POSITIONS

# bfloat16 / float16: products and activations in bf16 / fp16; params, residual
# stream, LayerNorm statistics, softmax, logits and loss in float32 (float16 with no
# loss scaling). fp8: simulated, float32 arithmetic with every matrix product's
# inputs rounded to e4m3 and its incoming gradient to e5m2 (attnscale/numerics/precision.py).
DTYPES = ("float32", "bfloat16", "float16", "fp8")
LN_POSITIONS = ("pre", "post")
SINKS = ("none", "zero", "learned")
GATES = ("none", "headwise", "elementwise")
HEADS = ("lm", "mlm")
REMATS = ("none", "full", "dots")  # config.remat: see models.base.REMAT_POLICIES
# The model variants by name, filled by attnscale/models/__init__.py (the variants
# import this module, so it cannot import them).
VARIANTS: dict[str, type] = {}
# Values that were renamed: (field, old value) -> new value.
RENAMED_VALUES = {("model.variant", "unit_scaled"): "unit"}


@dataclasses.dataclass(frozen=True)
class UnitConfig:
  """The unit-scaled, residual-weighted transformer's fields (`config.model.unit`)."""

  residual_mult: float = 1.0  # u-muP: branches' total weight against the embedding
  residual_attn_ratio: float = 1.0  # u-muP: attention / MLP branch weight ratio
  residual_rule: str = "umup"  # umup: (tau f + x)/sqrt(1+tau^2) | 2023: sqrt(1-tau) x + sqrt(tau) f
  attn_residual: str = "rule"  # rule (depth rule only) | relative (x sqrt(e/n): Graphcore's fix)
  scaled_loss: bool = True  # logits' gradient to unit scale (unit_scaling's cross_entropy)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a model (mirrors `config.model`)."""

  vocab_size: int = 65
  block_size: int = 256  # training context length; the longest sequence with learned positions
  num_layers: int = 6
  num_heads: int = 6
  num_kv_heads: int | None = None  # None = num_heads; fewer = grouped-query
  width: int = 384
  mlp_ratio: int = 4
  dropout: float = 0.0  # embeddings and residual branches; none on attention weights
  scaling: str = "standard"  # a name from attnscale.scalings.names()
  scaling_params: Any = None  # the scaling's params, e.g. {"p": 2.0}; fixes a learned one
  qk_layernorm: bool = False  # learned LayerNorm on q and k before the scaling
  shared_kv: bool = False  # one projection for keys and values (W_K = W_V)
  normalizer: str = "softmax"  # or "sigmoid" (reference path only)
  attention_impl: str | None = None  # None/"xla"/"cudnn" fused, or "reference"
  causal: bool = True  # False: bidirectional (an encoder); padding goes in `mask`
  ln_position: str = "pre"  # pre: x + f(LN(x)) (GPT-2) | post: LN(x + f(x)) (BERT)
  head: str = "lm"  # lm: tied embedding | mlm: BERT's dense+GELU+LN, tied embedding, bias
  dtype: str = "float32"  # compute dtype ("bfloat16": mixed precision); params stay float32
  fp8_scaling: str = "none"  # dtype="fp8": none | per_tensor (power-of-2 scale from current amax)
  init_std: float = 0.02
  logit_softcap: float = 0.0  # c > 0: logits -> c tanh(logits / c) (Gemma 2: 50); 0 = off
  sink: str = "none"  # none | zero (off-by-one softmax) | learned (a sink logit per head)
  attn_gate: str = "none"  # none | headwise | elementwise: z * sigmoid(x W_g) (gated attention)
  positions: str = "learned"  # learned (absolute table) | rope (rotary on q, k) | none (NoPE)
  rope_base: float = 10000.0  # rotary frequency base (positions="rope")
  variant: str = "standard"  # a name from attnscale.models.VARIANTS
  unit: UnitConfig = UnitConfig()  # the "unit" variant's fields
  # Rematerialisation of each block (jax.checkpoint): none | full | dots. Set from
  # the top-level config.remat (a memory choice, not part of the model's maths).
  remat: str = "none"

  def __post_init__(self):
    if isinstance(self.unit, dict):  # from config.model.to_dict()
      object.__setattr__(self, "unit", UnitConfig(**self.unit))
    if self.variant in ("unit_scaled",):
      raise ValueError(f"model.variant={self.variant!r} was renamed "
                       f"{RENAMED_VALUES['model.variant', self.variant]!r}")
    if self.variant not in VARIANTS:
      raise ValueError(f"model.variant must be one of {list(VARIANTS)}, "
                       f"got {self.variant!r}")
    entry = scalings.entry(self.scaling)  # unknown names fail here, listing the valid ones
    scalings.get(self.scaling, **dict(self.scaling_params or {}))  # bad params fail now
    if self.width % self.num_heads:
      raise ValueError(f"model.num_heads ({self.num_heads}) must divide model.width "
                       f"({self.width})")
    if self.num_heads % self.kv_heads:
      raise ValueError(f"model.num_kv_heads ({self.kv_heads}) must divide model.num_heads "
                       f"({self.num_heads})")
    if self.qk_layernorm and entry.normalizes_qk:
      raise ValueError(f"model.qk_layernorm=True with scaling={self.scaling!r} would "
                       "normalise q and k twice: use one of them")
    if self.normalizer not in NORMALIZERS:
      raise ValueError(f"model.normalizer must be one of {NORMALIZERS}, "
                       f"got {self.normalizer!r}")
    if self.attention_impl not in IMPLEMENTATIONS:
      raise ValueError(f"model.attention_impl must be one of "
                       f"{IMPLEMENTATIONS}, got {self.attention_impl!r}")
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
    VARIANTS[self.variant].validate_config(self)

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
