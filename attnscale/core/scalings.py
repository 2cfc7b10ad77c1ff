"""The registry of attention scalings: how to set the softmax temperature.

A scaling is any callable `scale_fn(q_BTNH, k_BSKH, keys) -> Scaled` where `keys`
is a `VisibleKeys` (which keys each query may see). It returns possibly transformed
queries and keys, a per-query logit factor s_i and a per-query output factor c_i:

    logits_ij = (q'_i . k'_j) * s_i,   z_i = c_i * sum_j softmax_j(logits_ij) v_j.

Because s_i is per query it can be folded into q before a fused kernel, and c_i is
applied to the kernel's output, so every scaling runs on `jax.nn.dot_product_attention`
(see "Folding" in docs/science.md). A per-query factor is never folded into k (that
would change the relative logits) nor an output factor into v.

Writing your own takes a few lines; register it to make it nameable from configs:

    @attnscale.scalings.register("key_norm_max")
    def key_norm_max():
      def scale_fn(q, k, keys):
        norms = jnp.linalg.norm(k, axis=-1)          # [B, S, K]
        # Careful: a max over *all* keys leaks the future in a causal model;
        # keys.sum only ever sums the visible ones.
        return Scaled(q, k, logit_scale=1.0 / keys.sum(norms) ** 0.5)
      return scale_fn

A scaling that learns a parameter declares it; every model creates it in each
attention layer and passes its value in (no model code names the scaling):

    @attnscale.scalings.register(
        "head_temperature", learned={"log_t": Learned(("heads",), init=0.0)})
    def head_temperature(log_t=0.0):                 # log_t: [N] when learned
      def scale_fn(q, k, keys):
        return Scaled(q, k, logit_scale=jnp.exp(log_t) * q.shape[-1] ** -0.5)
      return scale_fn

What a model must know about a scaling is declared where it is registered, so
no model or runtime code names a scaling (tests/test_layout.py checks it):

    learned=       the parameters it learns (`Learned`), created by the model
    from_dims=     keywords fixed from the model's sizes (a training length)
    normalizes_qk= it normalises q and k itself (the model refuses model.qk_norm)
    bilinear=      its logits are bilinear in q and k (QK-clip may rescale them)
    mup=           what model.parameterization=mup does with it: a `MupRule` (the
                   keyword that multiplies its logits becomes mult x a x width(d_base,
                   d)), or a string saying why no muP rule is defined; undeclared,
                   muP refuses it in one line saying what to declare
    umup=          it is u-muP's attention (model.parameterization=umup takes it)
    config_args=   the config argument's keywords it takes (p, temperature, s)
    presets=       config-argument names of it in another model variant (`Preset`:
                   scaling=unit_scaled is fully_scaled in the unit-scaled transformer)

A scaling of your own declares its muP rule the same way:

    @attnscale.scalings.register(
        "scaled_dot", mup=MupRule(width=lambda d_base, d: math.sqrt(d_base / d)))
    def scaled_dot(mult=1.0):                      # s = mult / sqrt(d)
      def scale_fn(q, k, keys):
        return Scaled(q, k, logit_scale=mult * q.shape[-1] ** -0.5)
      return scale_fn

Dimension legend: B batch, T queries, S keys, N query heads, K key/value heads,
H head dim.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from attnscale import checks
from attnscale.core.visibility import VisibleKeys, upcast

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Scaled:
  """What a scaling returns.

  Attributes:
    q: transformed queries [B, T, N, H] (or the input queries).
    k: transformed keys [B, S, K, H].
    logit_scale: s_i, broadcastable to [B, T, N]; a Python float for constants.
    output_scale: c_i, broadcastable to [B, T, N]; None means 1.
  """

  q: Array
  k: Array
  logit_scale: Array | float = 1.0
  output_scale: Array | float | None = None


class ScaleFn(Protocol):
  """A scaling. It may also define `init_logit_scale(head_dim) -> float`, its
  constant s (standard, fully scaled, u-muP): the unit-scaled model sets its q/k
  gradient scales from it (a scaling without one is treated as s = 1/sqrt(d)); and
  `logit_mod(logits, i, j)`, a per-pair transform of the scaled logits by the query
  and key positions, which no per-query factor can express (scale_invariant's; the
  reference path and the XLA kernel apply it, splash and cuDNN refuse it)."""

  def __call__(self, q_BTNH: Array, k_BSKH: Array, keys: VisibleKeys) -> Scaled:
    ...


@dataclasses.dataclass(frozen=True)
class Dims:
  """The sizes a learned parameter's shape and initialiser may depend on."""

  heads: int  # N, query heads
  kv_heads: int  # K, key/value heads
  head_dim: int  # H
  train_len: int  # L, the training context length (model.block_size)


@dataclasses.dataclass(frozen=True)
class Learned:
  """A parameter a scaling learns: one per attention layer, created by the model.

  The model creates it under the keyword's name, initialised by `init`, and passes
  its current value to the scaling's factory as that keyword on every call, so the
  gradient reaches it. Setting the keyword in `model.scaling_params` fixes it
  instead (no parameter is created).

  Attributes:
    shape: per-layer shape, dims by name ("heads", "kv_heads", "head_dim", as in
      `Dims`) or int; () is one scalar per layer, ("heads",) one per head.
    init: a number, or `f(dims: Dims)` returning one (or an array of `shape`).
  """

  shape: tuple[str | int, ...] = ()
  init: float | Callable[[Dims], Any] = 0.0

  def initial_value(self, dims: Dims) -> Array:
    shape = tuple(getattr(dims, d) if isinstance(d, str) else d for d in self.shape)
    value = self.init(dims) if callable(self.init) else self.init
    return jnp.broadcast_to(jnp.asarray(value, jnp.float32), shape)


@dataclasses.dataclass(frozen=True)
class MupRule:
  """What muP (`model.parameterization="mup"`) does with a scaling's logits.

  muP's attention logits are a q.k sqrt(d_base)/d, with a = `model.mup_attn_mult`,
  d the head dim and d_base = base_width / num_heads: sp's 1/sqrt(d) at the base
  width, 1/d as the width grows, because after training q and k are aligned and q.k
  grows like d, not sqrt(d) (Yang et al. 2022, "Tensor Programs V", arXiv
  2203.03466, appendix J). The rule says how this scaling gets there: the factory
  keyword `mult`, which multiplies its logits, becomes

      mult x a x width(d_base, d)        (mult's own value, 1.0 by default, first)

  Attributes:
    mult: the factory's keyword that multiplies the logits (its default must be 1).
      None: the logits have no width exponent to fix (a learned temperature bounds
      them whatever the width); the scaling is used as it is and a must be 1.
    width: f(d_base, d) -> the width factor; None: none (the logits are already 1/d).
    use: the registered scaling built instead, with only `mult` set (the original's
      params do not carry over): a scaling without a multiplier names one with it.
    why: mult=None: why no width factor is needed (quoted in the error for a != 1).
  """

  mult: str | None = "mult"
  width: Callable[[float, int], float] | None = None
  use: str | None = None
  why: str = ""


@dataclasses.dataclass(frozen=True)
class Preset:
  """A name the config argument `scaling=` takes for a registered scaling run in
  another model variant, with the fields that make it that experiment.

  Attributes:
    variant: `model.variant` (a name in `attnscale.models.VARIANTS`).
    fields: further `config.model` fields, dotted path -> value.
  """

  variant: str
  fields: dict[str, Any] = dataclasses.field(default_factory=dict)

  def matches(self, model) -> bool:
    """Whether `config.model` (a ConfigDict or dict) has this preset's variant and fields."""
    if model.get("variant") != self.variant:
      return False
    for path, value in self.fields.items():
      node = model
      for key in path.split("."):
        node = node.get(key) if node is not None else None
      if node != value:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Entry:
  """A registered scaling: its factory and what the model must know about it."""

  factory: Callable[..., ScaleFn]
  learned: dict[str, Learned]  # keyword -> the parameter the model creates for it
  normalizes_qk: bool  # replaces q and k by normalised versions (cosine, QK-norm)
  # keyword -> f(dims): a fixed value the model computes from its sizes (log_n_ratio's
  # training length); `model.scaling_params` overrides it.
  from_dims: dict[str, Callable[[Dims], Any]] = dataclasses.field(default_factory=dict)
  # The logits are bilinear in q and k: q' = q, k' = k and s_i depends on positions,
  # key counts and learned constants only, so scaling W_q (or W_k) by a scales them
  # by a (what QK-clip relies on, `attnscale.models.base.qk_clip`).
  bilinear: bool = False
  # muP's rule (`MupRule`), or why none is defined (a clause), or None: not declared.
  mup: MupRule | str | None = None
  umup: bool = False  # u-muP's attention: model.parameterization="umup" takes it
  # The config argument's keywords (`scaling=key_norm_power,p=3`) passed to the factory.
  config_args: tuple[str, ...] = ()
  # Config-argument names of this scaling in another model variant -> `Preset`.
  presets: dict[str, Preset] = dataclasses.field(default_factory=dict)


_REGISTRY: dict[str, Entry] = {}
# Scaling names that were renamed: old -> new (the old name is an error saying so).
RENAMED = {"unit_scaled": "umup"}
# The config argument's keywords a scaling may take (`register(config_args=...)`).
CONFIG_ARGS = ("p", "temperature", "s", "gamma", "a")


def register(name: str, *, learned: dict[str, Learned] | None = None,
             normalizes_qk: bool = False,
             from_dims: dict[str, Callable[[Dims], Any]] | None = None,
             bilinear: bool = False, mup: MupRule | str | None = None,
             umup: bool = False, config_args: tuple[str, ...] = (),
             presets: dict[str, Preset] | None = None):
  """Decorator: registers a factory `f(**params) -> scale_fn` under `name`.

  Args:
    name: the name configs use (`model.scaling`).
    learned: the parameters the scaling learns, keyword -> `Learned`; the model
      creates them in every attention layer and passes them to `f` as keywords.
      Every keyword needs a default in `f`, so `get(name)` works without them.
    normalizes_qk: the scaling normalises q and k itself (the model then refuses
      `model.qk_norm`, which would normalise them twice).
    from_dims: keywords the model fills from its sizes, keyword -> f(`Dims`),
      fixed rather than learned (log_n_ratio's `train_len`); a value in
      `model.scaling_params` wins. Each needs a default in `f` as well.
    bilinear: the logits are q.k times a factor of positions, key counts or
      learned constants only (not of q or k): QK-clip (`config.qk_clip`) may
      rescale the q and k projections. False (the safe default) refuses QK-clip.
    mup: what `model.parameterization="mup"` does with the logits: a `MupRule`,
      or a string saying why no muP rule is defined (the error quotes it). None
      (not declared): muP refuses the scaling, saying to declare one.
    umup: the scaling is u-muP's attention (`model.parameterization="umup"`, in the
      unit variant, needs one).
    config_args: keywords the config argument sets (`get_config("scaling=NAME,p=3")`:
      p, temperature, s, gamma, a), passed as `model.scaling_params`; a learned one only
      when not 0 (0 leaves it learned).
    presets: config-argument names of this scaling inside another model variant,
      name -> `Preset` (`scaling=unit_scaled`: fully_scaled in the unit-scaled
      transformer); the run's label is that name.
  """
  if not set(config_args) <= set(CONFIG_ARGS):
    raise ValueError(f"register({name!r}): config_args takes keywords of {CONFIG_ARGS} (the "
                     f"config argument's), got {tuple(config_args)}")
  if mup is not None and not isinstance(mup, (MupRule, str)):
    raise TypeError(f"register({name!r}, mup=...) takes a scalings.MupRule or a string "
                    f"saying why no muP rule is defined, got {mup!r}")

  def wrap(factory):
    _REGISTRY[name] = Entry(factory, dict(learned or {}), normalizes_qk, dict(from_dims or {}),
                            bilinear, mup, umup, tuple(config_args), dict(presets or {}))
    return factory

  return wrap


def names() -> list[str]:
  """The registered scaling names."""
  return list(_REGISTRY)


def entry(name: str, *, field: str = "scaling") -> Entry:
  """The registration of `name`; ValueError (listing the valid names, naming
  `field`) if unknown."""
  if name in RENAMED:
    raise ValueError(f"{field} {name!r} was renamed {RENAMED[name]!r} (the config argument "
                     f"scaling=unit_scaled still selects Graphcore's unit-scaled experiment)")
  if name not in _REGISTRY:
    raise ValueError(checks.choice_error(field, name, names()))
  return _REGISTRY[name]


def learned(name: str) -> dict[str, Learned]:
  """The parameters scaling `name` learns (keyword -> `Learned`)."""
  return entry(name).learned


def presets() -> dict[str, tuple[str, Preset]]:
  """Every preset: config-argument name -> (registered scaling, `Preset`)."""
  return {preset_name: (name, preset) for name, e in _REGISTRY.items()
          for preset_name, preset in e.presets.items()}


def preset_of(model) -> str | None:
  """The preset name `config.model` (a ConfigDict or dict) is, or None."""
  for preset_name, (name, preset) in presets().items():
    if model.get("scaling") == name and preset.matches(model):
      return preset_name
  return None


def get(name: str, **params) -> ScaleFn:
  """Returns the scaling `name` built with `params`.

  Raises:
    ValueError: unknown name (the message lists the valid ones) or bad params.
  """
  factory = entry(name).factory
  try:
    return factory(**params)
  except TypeError as e:  # an unknown keyword: say which scaling it was for.
    raise ValueError(f"bad params {params} for scaling {name!r}: {e}") from None


# ---------------------------------------------------------------------------
# Helpers with gradients that stay finite at zero vectors (padded keys are
# often exact zeros, and d||x||/dx is undefined there).


def safe_norm_pow(x_XH: Array, p: float = 1.0) -> Array:
  """||x||_2^p over the last axis, in float32 or wider; 0 (with zero gradient) at x = 0."""
  sq_X = jnp.sum(jnp.square(upcast(x_XH)), axis=-1)
  nonzero_X = sq_X > 0
  return jnp.where(nonzero_X, jnp.where(nonzero_X, sq_X, 1.0) ** (p / 2), 0.0)


def safe_reciprocal(x: Array) -> Array:
  """1/x, and 0 where x == 0 (a query with no visible keys)."""
  nonzero = x != 0
  return jnp.where(nonzero, 1.0 / jnp.where(nonzero, x, 1.0), 0.0)


def l2_normalize(x_XH: Array) -> Array:
  """x / ||x||_2 over the last axis (a zero vector stays zero), float32 or wider."""
  return upcast(x_XH) * safe_reciprocal(safe_norm_pow(x_XH))[..., None]


def cosine_temperature_init(train_len: int) -> float:
  """Henry et al. 2020's initial temperature g0 = log2(L^2 - L) for length L."""
  if train_len < 2:
    raise ValueError(f"train_len must be >= 2, got {train_len}")
  return math.log2(train_len**2 - train_len)


# ---------------------------------------------------------------------------
# The scalings. Each class docstring states the formula and its source.


@dataclasses.dataclass(frozen=True)
class Standard:
  """s = 1/sqrt(d). Vaswani et al. 2017, "Attention is all you need", footnote 4."""

  def __call__(self, q, k, keys):
    return Scaled(q, k, logit_scale=q.shape[-1] ** -0.5)

  def init_logit_scale(self, head_dim: int) -> float:
    return head_dim**-0.5


@dataclasses.dataclass(frozen=True)
class NoScaling:
  """s = 1: the unscaled dot product (the cosine-vs-dot-product question)."""

  def __call__(self, q, k, keys):
    return Scaled(q, k)


@dataclasses.dataclass(frozen=True)
class KeyNormPower:
  """s_i = 1 / sum_{j visible to i} ||k_j||_2^p  (times n_i when `mean`).

  Bernhard 2023, "Scaling dot-product attention by the sum of key norms"
  (arXiv 2311.09406): p = 1 is the sum of key norms, `mean` the average key
  length n_i / sum ||k_j||, other p the "sums of powers of key lengths".
  Invariant to rescaling all keys when p = 1. Under causality the sum is a
  prefix sum, under a padding mask it skips padded keys.
  """

  p: float = 1.0
  mean: bool = False

  def __post_init__(self):
    if not self.p >= 0:
      raise ValueError(f"key norm power p must be >= 0, got {self.p}")
    if self.mean and self.p != 1:
      raise ValueError(f"key_norm_mean takes p = 1, got p={self.p}")

  def __call__(self, q, k, keys):
    s_BTN = safe_reciprocal(keys.sum(safe_norm_pow(k, self.p)))
    if self.mean:
      s_BTN = s_BTN * keys.count()
    return Scaled(q, k, logit_scale=s_BTN)


@dataclasses.dataclass(frozen=True)
class Cosine:
  """logits = g * (q_i/||q_i||) . (k_j/||k_j||), g a temperature.

  Henry et al. 2020, "Query-Key Normalization for Transformers" (arXiv
  2010.04245). g is learnable per layer, initialised to g0 = log2(L^2 - L) for
  training length L (`cosine_temperature_init`). `temperature` may be a traced
  array (scalar or broadcastable to [B, T, N], e.g. one per head) so a model can
  learn it; the model creates it (`register(..., learned=...)` below). With
  temperature=None (analysis), g0 of each query's own key count n_i (at least
  2) is used: from the keys it sees, never the total length, so a causal prefix
  gives the same outputs as the full sequence.
  """

  temperature: Any = None

  def __call__(self, q, k, keys):
    g = self.temperature
    if g is None:
      n_BTN = jnp.maximum(keys.count(), 2.0)
      g = jnp.log2(n_BTN * n_BTN - n_BTN)
    return Scaled(l2_normalize(q), l2_normalize(k),
                  logit_scale=upcast(g))


@dataclasses.dataclass(frozen=True)
class QKLayerNorm:
  """LayerNorm(q), LayerNorm(k) over the head dim (no bias), then s = 1/sqrt(d).

  Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters"
  (arXiv 2302.05442); Flax's `normalize_qk`. `q_scale` / `k_scale` are the
  LayerNorm gains (shape [H] or [N|K, H], learnable), None = 1. `mult` multiplies
  s (1: the paper's; muP's sqrt(d_base/d) under model.parameterization=mup).
  """

  q_scale: Any = None
  k_scale: Any = None
  eps: float = 1e-6
  mult: float = 1.0  # logits x mult: muP's width factor (attnscale/models/mup.py)

  def __call__(self, q, k, keys):
    return Scaled(layer_norm(q, self.q_scale, self.eps),
                  layer_norm(k, self.k_scale, self.eps),
                  logit_scale=self.mult * q.shape[-1] ** -0.5)


def layer_norm(x_XH, scale_H=None, eps=1e-6):
  """LayerNorm over the last axis (no bias; gain `scale_H` [H] or [N|K, H], None = 1),
  in float32 at least: QKLayerNorm's, and the model's `qk_norm="layernorm"`."""
  x_XH = upcast(x_XH)
  mean_X1 = x_XH.mean(-1, keepdims=True)
  var_X1 = jnp.square(x_XH - mean_X1).mean(-1, keepdims=True)
  y_XH = (x_XH - mean_X1) * jax.lax.rsqrt(var_X1 + eps)
  if scale_H is None:
    return y_XH
  scale_H = jnp.asarray(scale_H)  # [H] or [N|K, H]: broadcast over the leading axes
  return y_XH * scale_H.reshape((1,) * (y_XH.ndim - scale_H.ndim) + scale_H.shape)


@dataclasses.dataclass(frozen=True)
class QKRMSNorm:
  """RMSNorm(q), RMSNorm(k) over the head dim (learned gain, no bias), then s = 1/sqrt(d).

  x / sqrt(mean(x^2) + eps) * g: Zhang & Sennrich 2019's RMSNorm applied to
  queries and keys, as OLMo 2 (arXiv 2501.00656), Qwen3 and Gemma 3 ship it. It
  differs from `QKLayerNorm` only in not subtracting the mean. `q_scale` /
  `k_scale` are the gains ([H] or [N|K, H], learnable), None = 1. `mult` as
  `QKLayerNorm`'s.
  """

  q_scale: Any = None
  k_scale: Any = None
  eps: float = 1e-6
  mult: float = 1.0  # logits x mult: muP's width factor (attnscale/models/mup.py)

  def __call__(self, q, k, keys):
    return Scaled(rms_norm(q, self.q_scale, self.eps), rms_norm(k, self.k_scale, self.eps),
                  logit_scale=self.mult * q.shape[-1] ** -0.5)


def rms_norm(x_XH, scale_H=None, eps=1e-6):
  """RMSNorm over the last axis (gain as `layer_norm`'s): QKRMSNorm's, and the
  model's `qk_norm="rmsnorm"`."""
  x_XH = upcast(x_XH)
  y_XH = x_XH * jax.lax.rsqrt(jnp.square(x_XH).mean(-1, keepdims=True) + eps)
  if scale_H is None:
    return y_XH
  scale_H = jnp.asarray(scale_H)
  return y_XH * scale_H.reshape((1,) * (y_XH.ndim - scale_H.ndim) + scale_H.shape)


@dataclasses.dataclass(frozen=True)
class InverseD:
  """s = 1/d: muP's attention scaling (Yang et al. 2022, "Tensor Programs V",
  arXiv 2203.03466, section 4 / appendix J).

  With q and k correlated after training, q.k grows like d, not sqrt(d), so 1/d
  keeps the logits O(1) as the width grows; at initialisation (independent q, k)
  the logits are sqrt(d) times smaller than standard's. `mult` is muP's
  attention multiplier (u-muP's `umup` scaling is mult * q.k / d with a unit
  output factor; this is the plain form).
  """

  mult: float = 1.0

  def __call__(self, q, k, keys):
    return Scaled(q, k, logit_scale=self.mult / q.shape[-1])

  def init_logit_scale(self, head_dim: int) -> float:
    return self.mult / head_dim


@dataclasses.dataclass(frozen=True)
class FullyScaled:
  """s = 1/sqrt(d), output factor c_i = max(1, sqrt(n_i / e)).

  Graphcore Research, "Almost-scaled dot-product attention" (2023): with q, k, v
  ~ N(0, 1) the standard attention output has std about sqrt(e/n) (0.10 at
  n = 256), so multiplying by sqrt(n/e) restores unit scale. n_i is the number
  of keys query i sees (causal prefix, non-padded). For tiny n the factor
  sqrt(n/e) is wrong (std 0.6 at n = 1, where 1 is right), so by default it is
  clamped at 1, the documented causal rule; `clamp=False` gives plain sqrt(n/e).
  """

  clamp: bool = True

  def __call__(self, q, k, keys):
    c_BTN = jnp.sqrt(keys.count() / math.e)
    if self.clamp:
      c_BTN = jnp.maximum(c_BTN, 1.0)
    return Scaled(q, k, logit_scale=q.shape[-1] ** -0.5, output_scale=c_BTN)

  def init_logit_scale(self, head_dim: int) -> float:
    return head_dim**-0.5


# muP (`MupRule`): standard's 1/sqrt(d) has no multiplier, so muP builds inverse_d with
# mult a sqrt(d_base): s = a sqrt(d_base)/d, sp's 1/sqrt(d) at the base width.
register("standard", bilinear=True,
         mup=MupRule(use="inverse_d", width=lambda d_base, d: math.sqrt(d_base)))(Standard)
register("none", bilinear=True,
         mup="no muP rule is defined here for the unscaled dot product")(NoScaling)
# muP's exponent for 1/sum ||k_j||^p would depend on p and on the keys' alignment.
KEY_NORMS_NO_MUP = "it divides by data-dependent key norms, and no muP rule is defined for that"
register("key_norm_sum", mup=KEY_NORMS_NO_MUP)(lambda: KeyNormPower(p=1.0))
register("key_norm_mean", mup=KEY_NORMS_NO_MUP)(lambda: KeyNormPower(p=1.0, mean=True))
register("key_norm_power", mup=KEY_NORMS_NO_MUP,
         config_args=("p",))(lambda p=2.0: KeyNormPower(p=p))
# Henry et al. 2020: one learned temperature per layer, g0 = log2(L^2 - L). Under muP
# unchanged: cos(q, k) is O(1) aligned or not, so there is no width exponent to fix.
register("cosine", normalizes_qk=True, learned={
    "temperature": Learned((), init=lambda dims: cosine_temperature_init(dims.train_len)),
}, config_args=("temperature",), mup=MupRule(
    mult=None, why="g cos(q, k) is bounded by its learned temperature g whatever the width",
))(Cosine)
# muP for the QK-norms: normalising q and k fixes their RMS (O(1) per coordinate, as muP
# has it) but not their alignment, so q.k/sqrt(d) still grows like sqrt(d): they keep
# their norm and take muP's 1/d, mult a sqrt(d_base/d) on their 1/sqrt(d) (Yang et al.
# 2022, section J.2.1's argument, unchanged by the norm).
QK_NORM_MUP = MupRule(width=lambda d_base, d: math.sqrt(d_base / d))
# The LayerNorm gains over the head dim, shared by the heads (Flax's normalize_qk).
register("qk_layernorm", normalizes_qk=True, mup=QK_NORM_MUP, learned={
    "q_scale": Learned(("head_dim",), init=1.0),
    "k_scale": Learned(("head_dim",), init=1.0),
})(QKLayerNorm)
# Graphcore's experiment, `scaling=unit_scaled`: fully scaled attention in the
# unit-scaled transformer, its branch weighted to sqrt(e/n) of the skip.
register("fully_scaled", bilinear=True,
         mup="no muP rule is defined here for its output factor max(1, sqrt(n_i/e))",
         presets={"unit_scaled": Preset("unit", {"unit.attn_residual": "relative"})},
         )(FullyScaled)
# RMS QK-norm: gains over the head dim shared by the heads, as qk_layernorm's.
register("qk_rmsnorm", normalizes_qk=True, mup=QK_NORM_MUP, learned={
    "q_scale": Learned(("head_dim",), init=1.0),
    "k_scale": Learned(("head_dim",), init=1.0),
})(QKRMSNorm)
# Already muP's 1/d: its own mult times a.
register("inverse_d", bilinear=True, mup=MupRule())(InverseD)
# The temperatures that grow with the sequence (log_n, log_n_ratio, temperature_tuning,
# yarn) are in length_scalings.py, which registers them (attnscale/core/__init__.py
# imports it, so every `from attnscale.core import scalings` has them).


# u-muP's attention (the unit-scaling library's), as a scaling; attnscale/numerics/unit_scaling.py
# has the rest of unit scaling.
@dataclasses.dataclass(frozen=True)
class UnitScaledAttention:
  """s = mult/d, c_i = n_i / sqrt(1 + (n_i - 1) exp(mult^2/d)).

  Logits mult * q.k / d as in u-muP (Blake et al. 2024; the unit-scaling
  library's scaled_dot_product_attention): 1/d, not 1/sqrt(d), and mult =
  sqrt(d) recovers the standard logits. c_i makes the output unit-scale at init
  for q, k, v ~ N(0, 1), per query from n_i (the keys query i sees), so it is
  causal- and padding-safe; the library instead uses one global factor from the
  sequence length, causality and mult. Derivation: the logits of query i are
  about N(0, sigma^2), sigma^2 = mult^2/d; z_i = sum_j p_ij v_j has variance
  E[sum_j p_ij^2] ~ (1 + (n - 1) exp(sigma^2))/n^2, exact at n = 1 (= 1) and
  at sigma = 0 (uniform, 1/n), the delta method for small sigma (1/n +
  sigma^2 (n - 1)/n^2) and exp(sigma^2)/n for large n (Graphcore's sqrt(e/n) at
  sigma = 1, so c -> sqrt(n/e), the "fully_scaled" rule). At mult = 1 the
  softmax is nearly uniform and c_i is about sqrt(n_i). q and k gradients are
  not rescaled (std about mult/sqrt(d) at init).

  Where it is not unit: the variance model is a large-n approximation, and for
  few keys it overestimates E[sum_j p_ij^2], so c_i is too small. At mult =
  sqrt(d) (the standard logits, sigma^2 = 1) a causal prefix's output std is
  1.00 at n_i = 1, 0.83 at n_i = 2, 0.82 at 3, 0.83 at 4, 0.86 at 8, 0.90 at 16,
  0.94 at 32, 0.96 at 64, 0.98 at 128 and 0.99 at 256 (the same for d = 32, 64,
  128; q, k, v ~ N(0, 1), 400k draws per n). At mult = sqrt(d)/2 it is >= 0.98
  everywhere, at mult = 1 it is 1.000. Bidirectional attention over n >= 64
  keys is within 4% at any of these mults. (tests/test_unit_scaling.py,
  `test_unit_scaled_below_one_at_short_causal_prefixes`.)
  """

  mult: float = 1.0

  def __call__(self, q, k, keys):
    d = q.shape[-1]
    e_var = math.exp(self.mult**2 / d)
    n_BTN = jnp.maximum(keys.count(), 1.0)  # n = 0 rows are zeroed by `attention`.
    c_BTN = n_BTN * jax.lax.rsqrt(1.0 + (n_BTN - 1.0) * e_var)
    return Scaled(q, k, logit_scale=self.mult / d, output_scale=c_BTN)

  def init_logit_scale(self, head_dim: int) -> float:
    return self.mult / head_dim


register("umup", bilinear=True, umup=True,
         mup="it is u-muP's attention: use model.parameterization='umup' (model.variant='unit')",
         )(UnitScaledAttention)
