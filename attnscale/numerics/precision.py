"""Number formats, exact rounding to them, and simulated fp8 matrix products.

`model.dtype` picks how a model computes (params, optimizer state, residual
stream, LayerNorm statistics, softmax, logits and loss stay float32 in every mode):

  float32   everything float32.
  bfloat16  products and activations in bf16 (real bf16 arithmetic).
  float16   the same in fp16: real fp16 arithmetic and real fp16 gradients, with
            no loss scaling, so a gradient below 2^-24 flushes to zero.
  fp8       simulated: float32 arithmetic, but every matrix product's inputs are
            rounded to e4m3 in the forward pass and the gradient arriving at its
            output to e5m2 in the backward pass (`Fp8`), with no loss scaling;
            `model.fp8_scaling="per_tensor"` scales each rounded tensor by a power
            of two from its current absolute max first (the usual baseline).

Exactly which tensors `fp8` rounds, and where (`Fp8`; docs/science.md, "Low precision"):

  * every dense layer and every unit-scaled `linear`/`matmul`
    (`attnscale.numerics.layers.matmul`, `layers.Dense`): forward, x and w -> e4m3
    (w after its cast from the float32 parameter; in the unit model after the
    unit op's backward scales, which do not act forward); backward, dY (the
    gradient arriving at x @ w) -> e5m2 before both backward products
    dX = dY W^T and dW = X^T dY, whose results stay float32. The tied readouts
    (x @ E^T) included.
  * attention: q, k and v -> e4m3 as they enter the kernel
    (`attention_inputs`, after RoPE and any QK-norm, before the scaling), so the
    scaling's norms and the logits q.k see e4m3 values. Inside the kernel the
    logit scale, the softmax and the probabilities p stay float32, so p @ v
    multiplies float32 p by e4m3-valued v; the kernel's backward is float32 (dq,
    dk, dv reach the q/k/v projections in float32 and are rounded to e5m2 there,
    as those products' dY). Rounding p would need its own scale (FlashAttention-3's
    fp8 path keeps p in e4m3 after scaling it into range); left out.
  * nothing else: embeddings, LayerNorm, GELU, residual sums, the loss and the
    optimizer see float32.

The derivative of rounding is taken as 1 (straight-through): the backward pass
of `Fp8.inputs` passes its gradient unchanged, as every fp8 training recipe does.

The e5m2 rounding of dY is the convention of FP8 training (Micikevicius et al.
2022, "FP8 Formats for Deep Learning", arXiv 2209.05433: e4m3 for weights and
activations, e5m2 for gradients; NVIDIA Transformer Engine) and of unit-scaling's
`simulate_format` (`quantise_bwd` on the linear's output).

Dimension legend: B leading axes, I fan-in, O fan-out.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Format:
  """A floating-point format: its dtype, range and what happens past its largest value.

  Attributes:
    name: "float16", "bfloat16", "e4m3" or "e5m2".
    dtype: the jnp dtype that stores it.
    max: the largest finite value.
    min_normal: the smallest positive normal value, 2^(1 - bias).
    min_subnormal: the smallest positive value, min_normal * 2^-mantissa_bits.
    saturates: True: an overflow becomes +-max (e4m3fn has no infinity);
      False: it becomes +-inf.
  """

  name: str
  dtype: Any
  max: float
  min_normal: float
  min_subnormal: float
  saturates: bool


# ml_dtypes.finfo gives the same numbers (tests/test_precision.py checks).
FORMATS = {
    "float16": Format("float16", jnp.float16, 65504.0, 2.0**-14, 2.0**-24, False),
    "bfloat16": Format("bfloat16", jnp.bfloat16, 3.3895313892515355e38, 2.0**-126,
                       2.0**-133, False),
    # OCP FP8 E4M3 ("fn": finite, no inf; one NaN pattern): max 448 = 1.75 * 2^8.
    "e4m3": Format("e4m3", jnp.float8_e4m3fn, 448.0, 2.0**-6, 2.0**-9, True),
    # OCP FP8 E5M2 (IEEE-like, with inf): max 57344 = 1.75 * 2^15.
    "e5m2": Format("e5m2", jnp.float8_e5m2, 57344.0, 2.0**-14, 2.0**-16, False),
}
FP8_SCALINGS = ("none", "per_tensor")


def get_format(fmt: str | Format) -> Format:
  if isinstance(fmt, Format):
    return fmt
  if fmt not in FORMATS:
    raise ValueError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
  return FORMATS[fmt]


def round_to(x: Array, fmt: str | Format) -> Array:
  """x rounded to the nearest value of `fmt` (ties to even), returned in x's dtype.

  One conversion, x.dtype -> fmt -> x.dtype, so no double rounding; values the
  format represents come back bit for bit. Below half the smallest subnormal a
  value flushes to (signed) zero. Past the largest finite value: fp16, bf16 and
  e5m2 give +-inf (round to nearest: from max + half an ulp on); e4m3fn has no
  inf, and a plain cast (XLA's and ml_dtypes') gives NaN, so e4m3 values are
  clipped to +-448 first: the OCP spec's saturating conversion, which fp8
  training uses (Transformer Engine, H100's cvt.satfinite). NaN stays NaN.
  """
  fmt = get_format(fmt)
  x = jnp.asarray(x)
  if fmt.saturates:
    x = jnp.clip(x, -fmt.max, fmt.max)
  return x.astype(fmt.dtype).astype(x.dtype)


def per_tensor_scale(x: Array, fmt: str | Format) -> Array:
  """2^e, the largest power of two with amax(x) * 2^e <= fmt.max (1 if x is all zeros).

  The per-tensor ("current") scaling of fp8 training (Micikevicius et al. 2022;
  Transformer Engine's current scaling), rounded down to a power of two so that
  the scaling itself is exact in float32 and every simulated error is the
  format's.
  """
  fmt = get_format(fmt)
  amax = jax.lax.stop_gradient(jnp.max(jnp.abs(x)).astype(jnp.float32))
  ok = (amax > 0) & jnp.isfinite(amax)
  e = jnp.floor(jnp.log2(fmt.max / jnp.where(ok, amax, 1.0)))
  e = jnp.clip(jnp.where(ok, e, 0.0), -100, 100).astype(jnp.int32)
  scale = jnp.ldexp(jnp.float32(1.0), e)
  # log2 in float32 can land one above the exact exponent.
  return jnp.where(amax * scale > fmt.max, scale / 2, scale)


def quantise(x: Array, fmt: str | Format, scaling: str = "none") -> Array:
  """x rounded to `fmt`, first scaled into its range by `per_tensor_scale` if asked."""
  if scaling == "none":
    return round_to(x, fmt)
  if scaling == "per_tensor":
    scale = per_tensor_scale(x, fmt).astype(x.dtype)
    return round_to(x * scale, fmt) / scale
  raise ValueError(f"fp8 scaling must be one of {FP8_SCALINGS}, got {scaling!r}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def round_forward(x: Array, fmt: str, scaling: str = "none") -> Array:
  """Forward: `quantise(x)`. Backward: the gradient passes unchanged (straight-through)."""
  return quantise(x, fmt, scaling)


def _round_forward_fwd(x, fmt, scaling):
  return quantise(x, fmt, scaling), None


def _round_forward_bwd(fmt, scaling, _, g):
  return (g,)


round_forward.defvjp(_round_forward_fwd, _round_forward_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def round_backward(x: Array, fmt: str, scaling: str = "none") -> Array:
  """Forward: identity. Backward: the incoming gradient is `quantise`d."""
  return x


def _round_backward_fwd(x, fmt, scaling):
  return x, None


def _round_backward_bwd(fmt, scaling, _, g):
  return (quantise(g, fmt, scaling),)


round_backward.defvjp(_round_backward_fwd, _round_backward_bwd)


@dataclasses.dataclass(frozen=True)
class Fp8:
  """Simulated fp8 for one matrix product: `inputs` on each operand, `grad` on its output.

  y = fp8.grad(matmul(fp8.inputs(x), fp8.inputs(w))): forward, x and w rounded
  to `forward` (e4m3); backward, the gradient arriving at y rounded to
  `backward` (e5m2) before the two backward products, which then see the
  rounded x and w as their other operand (what an fp8 kernel saves). Scaling
  "per_tensor" scales each rounded tensor by `per_tensor_scale` (from its own
  current amax) and back; "none" rounds as is.
  """

  scaling: str = "none"
  forward: str = "e4m3"
  backward: str = "e5m2"

  def __post_init__(self):
    if self.scaling not in FP8_SCALINGS:
      raise ValueError(f"model.fp8_scaling must be one of {list(FP8_SCALINGS)}, "
                       f"got {self.scaling!r}")
    get_format(self.forward), get_format(self.backward)

  def inputs(self, x: Array) -> Array:
    return round_forward(x, self.forward, self.scaling)

  def grad(self, y: Array) -> Array:
    return round_backward(y, self.backward, self.scaling)


# ---------------------------------------------------------------------------
# What a model config asks for.

# model.dtype -> the dtype of products and activations (fp8 simulates in float32).
COMPUTE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
                  "fp8": "float32"}


def compute_dtype(dtype: str) -> str:
  """The dtype name products and activations take under model.dtype = `dtype`."""
  if dtype not in COMPUTE_DTYPES:
    raise ValueError(f"model.dtype must be one of {list(COMPUTE_DTYPES)}, got {dtype!r}")
  return COMPUTE_DTYPES[dtype]


def fp8_of(cfg) -> Fp8 | None:
  """The `Fp8` rounding of a model config's products, or None (every dtype but fp8)."""
  if cfg.dtype != "fp8":
    return None
  return Fp8(scaling=getattr(cfg, "fp8_scaling", "none"))


def attention_inputs(cfg, q_BTNH: Array, k_BSKH: Array, v_BSKH: Array
                     ) -> tuple[Array, Array, Array]:
  """q, k, v as the attention kernel takes them: rounded to e4m3 under fp8, else as given.

  Forward only (straight-through backward; see the module docstring). Also the
  `tap` of "q", "k" and "v" for scale tracking. The same arrays when neither
  applies, so float32 is untouched.
  """
  q_BTNH, k_BSKH, v_BSKH = tap(q_BTNH, "q"), tap(k_BSKH, "k"), tap(v_BSKH, "v")
  fp8 = fp8_of(cfg)
  if fp8 is None:
    return q_BTNH, k_BSKH, v_BSKH
  return fp8.inputs(q_BTNH), fp8.inputs(k_BSKH), fp8.inputs(v_BSKH)


# ---------------------------------------------------------------------------
# Taps: where scale tracking observes tensors (attnscale.numerics.scale_tracking).

Observer = Callable[[Array, str], Array]
_OBSERVER: contextvars.ContextVar[Observer | None] = contextvars.ContextVar(
    "attnscale_precision_observer", default=None)


def tap(x: Array, label: str) -> Array:
  """x itself, unless an observer is installed (`observing`): then what it returns.

  The matrix products (`layers.matmul`: "x" their input, "y" their output) and
  the attention inputs ("q", "k", "v") call this, so `scale_tracking` sees
  every tensor a format would round without model code naming it. With no
  observer (training, evaluation) it returns x: nothing is added to the graph.
  """
  observer = _OBSERVER.get()
  return x if observer is None else observer(x, label)


@contextlib.contextmanager
def observing(observer: Observer):
  """Installs `observer` for every `tap` traced inside the block."""
  token = _OBSERVER.set(observer)
  try:
    yield
  finally:
    _OBSERVER.reset(token)
