"""Unit scaling, the functional layer: ops whose outputs and gradients have unit scale.

Blake et al. 2023, "Unit Scaling: Out-of-the-Box Low-Precision Training" (arXiv
2303.11257), and Blake et al. 2024, "u-muP: The Unit-Scaled Maximal Update
Parametrization" (arXiv 2407.17465). The reference design is Graphcore's
`unit-scaling` library, version 0.3.5 (github.com/graphcore-research/unit-scaling,
tag v0.3.5: `unit_scaling/functional.py`, `core/functional.py`, `constraints.py`,
`scale.py`, `_modules.py`), read for every op here: each op multiplies its
output by one factor in the forward pass (`scale_fwd`) and its input/weight
gradients by others in the backward pass (`scale_bwd`), chosen so that at
initialisation, with unit-variance inputs, N(0, 1) weights and a unit-variance
cotangent, everything has std about 1. Each docstring states its rule and where
the constant comes from. Constants are computed for N(0, 1) inputs and do not
track the data: unit scale holds at init, not throughout training.

Where this module differs from the library it says so in the op's docstring:
`gelu`'s default constants (exact, by quadrature; `scales="library"` gives
0.3.5's interpolated model) and `UnitScaledAttention` (per query, not one global
factor). Every other op computes the library's formula (tests/test_unit_scaling.py
checks each against constants derived from the library's source).

Simulated fp8 (`attnscale.numerics.precision`): `linear` and `matmul` take `fp8=`, which
rounds both operands to e4m3 forward and the product's incoming gradient to e5m2
backward, after the unit scales are applied (so the formats see unit-scale tensors).

Importing this module registers the attention scaling "umup" (formerly "unit_scaled").

Dimension legend: B batch (all leading axes, flattened), I fan-in, O fan-out,
V vocabulary, D model/feature width; for attention as in `attnscale.core.attention`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attnscale.core import scalings
from attnscale.core.visibility import upcast
from attnscale.numerics import layers, precision

Array = jax.Array

# ---------------------------------------------------------------------------
# Identity in one direction, a multiplication in the other.


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def scale_fwd(x: Array, scale: float) -> Array:
  """Forward: x * scale. Backward: the gradient passes through unscaled.

  `unit_scaling.scale_fwd`. `scale` is a Python float (not differentiated).
  """
  return x * scale


def _scale_fwd_fwd(x, scale):
  return x * scale, None


def _scale_fwd_bwd(scale, _, g):
  return (g,)


scale_fwd.defvjp(_scale_fwd_fwd, _scale_fwd_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def scale_bwd(x: Array, scale: float) -> Array:
  """Forward: identity. Backward: the gradient is multiplied by `scale`.

  `unit_scaling.scale_bwd`. `scale` is a Python float (not differentiated).
  """
  return x


def _scale_bwd_fwd(x, scale):
  return x, None


def _scale_bwd_bwd(scale, _, g):
  return (g * scale,)


scale_bwd.defvjp(_scale_bwd_fwd, _scale_bwd_bwd)


# `unit_scaling.constraints`: for an op with one input, (output, grad input); with
# two (matmul), (output, grad left, grad right).
CONSTRAINTS = (None, "to_output_scale", "to_grad_input_scale", "gmean", "hmean", "amean")
TERNARY_CONSTRAINTS = (None, "to_output_scale", "to_left_grad_scale", "to_right_grad_scale",
                       "gmean", "hmean", "amean")


def _constrain(constraint: str | None, *scales: float) -> tuple[float, ...]:
  """The library's `apply_constraint`: tie an op's forward and input-gradient scales.

  Blake et al. 2023, section 5.2: an op whose input is not a "cut edge" of the
  graph needs the same scale forward and backward, or dL/dx is no longer a
  multiple of the true gradient. `scales` is (output, grad input) or (output,
  grad left, grad right). None keeps them separate (each exactly unit);
  "to_output_scale" (the library's default) uses the forward scale for all;
  "to_grad_input_scale" / "to_left_grad_scale" / "to_right_grad_scale" pick that
  gradient's; "gmean", "hmean", "amean" the geometric, harmonic, arithmetic mean.
  """
  allowed = CONSTRAINTS if len(scales) == 2 else TERNARY_CONSTRAINTS
  if constraint not in allowed:
    raise ValueError(f"constraint must be one of {allowed}, got {constraint!r}")
  if constraint is None:
    return scales
  pick = {"to_output_scale": 0, "to_grad_input_scale": 1, "to_left_grad_scale": 1,
          "to_right_grad_scale": 2}
  if constraint in pick:
    s = scales[pick[constraint]]
  elif constraint == "gmean":
    s = math.prod(scales)**(1 / len(scales))
  elif constraint == "hmean":
    s = len(scales) / sum(1 / x for x in scales)
  else:  # amean
    s = sum(scales) / len(scales)
  return (s,) * len(scales)


def logarithmic_interpolation(alpha: float, lower: float, upper: float) -> float:
  """exp(alpha log(upper) + (1 - alpha) log(lower)): the library's empirical scale models.

  `unit_scaling.core.functional.logarithmic_interpolation`: alpha = 0 gives
  lower, 1 gives upper, constant ratio in between.
  """
  return math.exp(alpha * math.log(upper) + (1 - alpha) * math.log(lower))


# ---------------------------------------------------------------------------
# Unit-scaled ops.


def linear(x_BxI: Array, w_IxO: Array, b_O: Array | None = None, *,
           constraint: str | None = "to_output_scale",
           scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
           preferred_element_type=None, fp8: precision.Fp8 | None = None) -> Array:
  """y = (x @ w + b) / sqrt(fan_in), for weights initialised N(0, 1).

  `unit_scaling.functional.linear`: output scale 1/fan_in^p0 (the bias too: the
  library applies `scale_fwd` to `F.linear(input, weight, bias)`, the whole sum);
  input gradient 1/fan_out^p1 (a sum of fan_out unit terms); weight and bias
  gradients 1/batch_size^p2, batch_size = x.size // fan_in (sums over the batch).
  scale_power = (p0, p1, p2) = (1/2, 1/2, 1/2); `linear_readout` uses (1, 1/2, 1/2).
  The library's default constraint "to_output_scale" makes the input gradient
  use the output scale too (exactly unit only when fan_in == fan_out, else its
  std is sqrt(fan_out / fan_in)); constraint=None gives the separate, both-unit
  scales. preferred_element_type: the product's accumulation and output dtype
  (e.g. float32 from bfloat16 inputs). fp8: simulated fp8 product
  (`attnscale.numerics.precision.Fp8`): x and w rounded to e4m3 after their backward
  scales, the gradient arriving at x @ w (before the output scale's pass-through)
  rounded to e5m2.
  """
  fan_in, fan_out = w_IxO.shape
  batch_size = x_BxI.size // fan_in
  out_power, grad_x_power, grad_w_power = scale_power
  out_scale, grad_x_scale = _constrain(constraint, fan_in**-out_power, fan_out**-grad_x_power)
  x_BxI = scale_bwd(x_BxI, grad_x_scale)
  w_IxO = scale_bwd(w_IxO, batch_size**-grad_w_power)
  y_BxO = layers.matmul(x_BxI, w_IxO, preferred_element_type=preferred_element_type, fp8=fp8)
  if b_O is not None:
    b_O = scale_bwd(b_O, batch_size**-grad_w_power)
    y_BxO = y_BxO + _over_last_axis(b_O.astype(y_BxO.dtype), y_BxO.ndim)
  return scale_fwd(y_BxO, out_scale)


def linear_readout(x_BxI: Array, w_IxO: Array, b_O: Array | None = None, *,
                   constraint: str | None = None, preferred_element_type=None,
                   fp8: precision.Fp8 | None = None) -> Array:
  """u-muP's output layer: y = (x @ w + b) / fan_in, gradients as `linear`'s.

  `unit_scaling.functional.linear_readout` (Blake et al. 2024, u-muP): scale
  powers (1, 1/2, 1/2) and no constraint, so the logits have std 1/sqrt(fan_in)
  at init (muP's readout: hidden-layer updates, not the init, move the logits)
  while the input and weight gradients stay unit. The unit model's tied readout
  uses `linear` instead (1/sqrt(D): unit logits at init; see
  `UnitScaledTransformer.logits`).
  """
  return linear(x_BxI, w_IxO, b_O, constraint=constraint, scale_power=(1.0, 0.5, 0.5),
                preferred_element_type=preferred_element_type, fp8=fp8)


def matmul(left_BxMxK: Array, right_BxKxN: Array, *, constraint: str | None = "to_output_scale",
           fp8: precision.Fp8 | None = None) -> Array:
  """left @ right / sqrt(K): the library's unit-scaled product of two activations.

  `unit_scaling.functional.matmul`: output scale K^-1/2, left gradient N^-1/2,
  right gradient M^-1/2 (each a sum of that many unit terms), then the
  constraint over all three; its default "to_output_scale" ties both gradients
  to K^-1/2 (the product's inputs are usually not cut edges). Batched over
  leading axes as `jnp.matmul`. fp8 as in `linear`.
  """
  M, K = left_BxMxK.shape[-2:]
  N = right_BxKxN.shape[-1]
  out_scale, left_scale, right_scale = _constrain(constraint, K**-0.5, N**-0.5, M**-0.5)
  left_BxMxK = scale_bwd(left_BxMxK, left_scale)
  right_BxKxN = scale_bwd(right_BxKxN, right_scale)
  if fp8 is not None:
    left_BxMxK, right_BxKxN = fp8.inputs(left_BxMxK), fp8.inputs(right_BxKxN)
  y_BxMxN = jnp.matmul(left_BxMxK, right_BxKxN)
  if fp8 is not None:
    y_BxMxN = fp8.grad(y_BxMxN)
  return scale_fwd(y_BxMxN, out_scale)


def embedding(ids_B: Array, table_VxD: Array) -> Array:
  """table[ids], forward unscaled (the table is initialised N(0, 1)).

  `unit_scaling.functional.embedding`: the table's gradient is scaled by
  sqrt(V / num_tokens), num_tokens = ids.size. Row v's gradient sums the
  cotangents of the tokens equal to v, about num_tokens / V of them for uniform ids,
  so its variance is num_tokens / V.
  """
  num_tokens = ids_B.size
  vocab_size = table_VxD.shape[0]
  table_VxD = scale_bwd(table_VxD, (vocab_size / num_tokens)**0.5)
  return jnp.take(table_VxD, ids_B, axis=0)


def layer_norm(x_BxD: Array, scale_D: Array | None = None, bias_D: Array | None = None,
               eps: float = 1e-5) -> Array:
  """(x - mean) / sqrt(var + eps) * scale + bias over the last axis.

  `unit_scaling.functional.layer_norm`: the output is unit by construction and
  the input gradient is unit for unit-variance x, so only the weight and bias
  gradients (sums over the batch) are scaled, by 1/sqrt(batch_size),
  batch_size = x.size // D. Computed in float32 or wider.
  """
  dtype = x_BxD.dtype
  x_BxD = upcast(x_BxD)
  mean_Bx1 = x_BxD.mean(-1, keepdims=True)
  var_Bx1 = jnp.square(x_BxD - mean_Bx1).mean(-1, keepdims=True)
  y_BxD = (x_BxD - mean_Bx1) * jax.lax.rsqrt(var_Bx1 + eps)
  return _affine(y_BxD, scale_D, bias_D).astype(dtype)


def rms_norm(x_BxD: Array, scale_D: Array | None = None, eps: float = 1e-5) -> Array:
  """x / sqrt(mean(x^2) + eps) * scale over the last axis.

  As `layer_norm` (the library's `rms_norm`, whose eps is 1e-5 as here): only
  the weight gradient is scaled, by 1/sqrt(batch_size).
  """
  dtype = x_BxD.dtype
  x_BxD = upcast(x_BxD)
  y_BxD = x_BxD * jax.lax.rsqrt(jnp.square(x_BxD).mean(-1, keepdims=True) + eps)
  return _affine(y_BxD, scale_D, None).astype(dtype)


def _affine(y_BxD, scale_D, bias_D):
  batch_size = y_BxD.size // y_BxD.shape[-1]
  if scale_D is not None:
    y_BxD = y_BxD * _over_last_axis(scale_bwd(scale_D, batch_size**-0.5), y_BxD.ndim)
  if bias_D is not None:
    y_BxD = y_BxD + _over_last_axis(scale_bwd(bias_D, batch_size**-0.5), y_BxD.ndim)
  return y_BxD


def _over_last_axis(w_D: Array, ndim: int) -> Array:
  """A per-feature vector shaped [1, ..., 1, D] to broadcast over leading axes."""
  return w_D.reshape((1,) * (ndim - 1) + w_D.shape)


@functools.cache
def gelu_scales(mult: float = 1.0) -> tuple[float, float]:
  """(std of g(x), rms of g'(x)) for x ~ N(0, 1), g(x) = gelu(mult x) / mult.

  g is the library's `_unscaled_gelu` (u-muP's input multiplier, divided back
  so that mult -> infinity tends to relu). By 128-point Gauss-Hermite quadrature
  with gelu(u) = u Phi(u) (exact, erf) and g'(x) = Phi(u) + u phi(u), u = mult x.
  At mult = 1: 0.5879 and 0.6752, the constants unit-scaling used before 0.3.0
  (0.588, 0.675: "determined empirically"; the output's mean is 1/(2 sqrt(pi)) =
  0.282, so its RMS is 0.652).
  """
  x, w = np.polynomial.hermite_e.hermegauss(128)
  w = w / w.sum()
  u = mult * x
  cdf = 0.5 * (1.0 + np.array([math.erf(t / math.sqrt(2.0)) for t in u]))
  pdf = np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
  g, dg = u * cdf / mult, cdf + u * pdf
  mean = np.sum(w * g)
  return float(np.sqrt(np.sum(w * g * g) - mean**2)), float(np.sqrt(np.sum(w * dg * dg)))


def library_gelu_scales(mult: float = 1.0) -> tuple[float, float]:
  """(output scale, input-gradient scale) of unit-scaling 0.3.x's `gelu`.

  Its "empirical model of gelu output std given mult": a logarithmic
  interpolation with alpha = 1/(1 + 1/(4 mult^2)) between the mult -> 0 limit
  (g(x) -> x/2: output and gradient scale 2) and the mult -> infinity limit
  (g -> relu: output 1/std = sqrt(2/(1 - 1/pi)), gradient 1/rms = sqrt(2)). At
  mult = 1: 1.7667 and 1.5157, against the exact 1/0.5879 = 1.7010 and
  1/0.6752 = 1.4810 (`gelu_scales`): output std 1.039, gradient RMS 1.023.
  """
  alpha = 1 / (1 + 0.25 / mult**2)
  return (logarithmic_interpolation(alpha, 2.0, (2 / (1 - 1 / math.pi))**0.5),
          logarithmic_interpolation(alpha, 2.0, 2**0.5))


GELU_SCALES = ("exact", "library")


def gelu(x: Array, *, mult: float = 1.0, constraint: str | None = "to_output_scale",
         scales: str = "exact") -> Array:
  """gelu(mult x)/mult times an output scale, its input gradient times another.

  `unit_scaling.functional.gelu` (exact, erf GELU), with one choice: the scales.
  scales="exact" (the default; the unit model's): 1/std and 1/rms of g(x) and
  g'(x) for x ~ N(0, 1) by quadrature (`gelu_scales`), so output std and
  gradient RMS are exactly 1 at init, for any mult. scales="library": unit-scaling
  0.3.x's interpolated model (`library_gelu_scales`), within 4% of unit at mult = 1.
  The exact values are kept as the default because the unit model relies on
  them: its MLP divides by the output's true RMS and restores the branch's
  gradient from the ratio of the two scales. The library's default constraint
  "to_output_scale" uses the output scale backward too (exact: input-gradient
  RMS 0.6752/0.5879 = 1.15); constraint=None makes both unit.
  """
  if scales == "exact":
    out_std, grad_rms = gelu_scales(float(mult))
    out_scale, grad_scale = 1.0 / out_std, 1.0 / grad_rms
  elif scales == "library":
    out_scale, grad_scale = library_gelu_scales(float(mult))
  else:
    raise ValueError(f"scales must be one of {GELU_SCALES}, got {scales!r}")
  out_scale, grad_scale = _constrain(constraint, out_scale, grad_scale)
  x = scale_bwd(x, grad_scale)
  y = jax.nn.gelu(x, approximate=False) if mult == 1 else (
      jax.nn.gelu(mult * x, approximate=False) / mult)
  return scale_fwd(y, out_scale)


def library_silu_scales(mult: float = 1.0) -> tuple[float, float]:
  """(output scale, input-gradient scale) of unit-scaling 0.3.x's `silu`.

  g(x) = x sigmoid(mult x) (= silu(mult x)/mult). Output: interpolation with
  alpha = 1/(1 + 1/(4 mult^2)) between 2 and sqrt(2/(1 - 1/pi)) (GELU's); input
  gradient: alpha = 1/(1 + 1/mult^2) between 2 and sqrt(2).
  """
  out_alpha, grad_alpha = 1 / (1 + 0.25 / mult**2), 1 / (1 + 1 / mult**2)
  return (logarithmic_interpolation(out_alpha, 2.0, (2 / (1 - 1 / math.pi))**0.5),
          logarithmic_interpolation(grad_alpha, 2.0, 2**0.5))


def silu(x: Array, *, mult: float = 1.0, constraint: str | None = "to_output_scale") -> Array:
  """x sigmoid(mult x), output and input gradient scaled by `library_silu_scales`.

  `unit_scaling.functional.silu`: its empirical model (at mult = 1 output scale
  1.767, gradient scale 1.682).
  """
  out_scale, grad_scale = _constrain(constraint, *library_silu_scales(float(mult)))
  x = scale_bwd(x, grad_scale)
  return scale_fwd(x * jax.nn.sigmoid(mult * x), out_scale)


def silu_glu(x: Array, gate: Array, *, mult: float = 1.0) -> Array:
  """x * gate sigmoid(mult gate) (SwiGLU), one scale s forward and on both gradients.

  `unit_scaling.functional.silu_glu`: s = interpolation with alpha =
  1/(1 + 1/mult^2) between 2 and sqrt(2) (1.682 at mult = 1); forward and both
  input gradients share it (the library ties them).
  """
  s = logarithmic_interpolation(1 / (1 + 1 / mult**2), 2.0, 2**0.5)
  x, gate = scale_bwd(x, s), scale_bwd(gate, s)
  return scale_fwd(x * (gate * jax.nn.sigmoid(mult * gate)), s)


def softmax_scales(n: int, mult: float = 1.0) -> tuple[float, float]:
  """(output scale, input-gradient scale) of unit-scaling 0.3.x's softmax over n entries.

  Its empirical model: alpha = 1/(1 + 4/mult^2) interpolates logarithmically
  between the flat limit (mult -> 0: output n, gradient n/mult) and the one-hot
  limit (output sqrt(n), gradient sqrt(n/mult)). The library's tests use
  mult = 1/4 because "the approximation is quite bad at mult=1".
  """
  alpha = 1 / (1 + 4 / mult**2)
  return (logarithmic_interpolation(alpha, n, n**0.5),
          logarithmic_interpolation(alpha, n / mult, (n / mult)**0.5))


def softmax(x: Array, *, axis: int = -1, mult: float = 1.0,
            constraint: str | None = "to_output_scale") -> Array:
  """softmax(mult x) over `axis`, output and input gradient scaled by `softmax_scales`.

  `unit_scaling.functional.softmax` (output RMS about 1: its entries are
  positive, about 1 each, summing to the scale). Computed in float32 or wider,
  returned in x's dtype.
  """
  out_scale, grad_scale = _constrain(constraint, *softmax_scales(x.shape[axis], float(mult)))
  dtype = x.dtype
  x = scale_bwd(upcast(x), grad_scale)
  return scale_fwd(jax.nn.softmax(mult * x, axis=axis), out_scale).astype(dtype)


def softmax_cross_entropy(logits_BxV: Array, labels_B: Array, reduction: str = "mean", *,
                          mult: float = 1.0) -> Array:
  """The real cross-entropy loss of mult * logits; the logits' gradient scaled to unit std.

  `unit_scaling.functional.cross_entropy`: the logits' gradient is scaled by
  V / sqrt(V - 1), then the logits multiplied by u-muP's output multiplier
  `mult` forward only (`scale_fwd`, applied after the gradient scale: the
  gradient carries no factor mult), and a "mean" is taken as
  scale_fwd(sum, 1/batch_size) so the value is the true mean but no 1/batch_size
  reaches the gradient. Why V / sqrt(V - 1): the gradient of one token's loss is
  p - onehot(label); for a near-uniform p its mean square over the V entries is
  ((1 - 1/V)^2 + (V - 1)/V^2)/V = (V - 1)/V^2. Softmax in float32 or wider.
  """
  if reduction not in ("mean", "sum"):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
  vocab_size = logits_BxV.shape[-1]
  logits_BxV = scale_bwd(upcast(logits_BxV), vocab_size / (vocab_size - 1)**0.5)
  if mult != 1.0:
    logits_BxV = scale_fwd(logits_BxV, mult)
  logp_BxV = jax.nn.log_softmax(logits_BxV, axis=-1)
  nll_B = -jnp.take_along_axis(logp_BxV, labels_B[..., None], axis=-1)[..., 0]
  loss = nll_B.sum()
  return scale_fwd(loss, 1.0 / nll_B.size) if reduction == "mean" else loss


# ---------------------------------------------------------------------------
# Residual connections.

RULES = ("umup", "2023")


def residual_weights(tau: float, rule: str = "umup") -> tuple[float, float]:
  """(a, b): the branch and skip weights of y = a f(x) + b x, a^2 + b^2 = 1.

  "umup" (u-muP, Blake et al. 2024; unit-scaling 0.3.5): a = tau/sqrt(1 + tau^2),
  b = 1/sqrt(1 + tau^2), so tau = a/b is the branch's weight relative to the skip.
  "2023" (Blake et al. 2023): a = sqrt(tau), b = sqrt(1 - tau), 0 <= tau <= 1.
  """
  if rule == "umup":
    if not tau >= 0:
      raise ValueError(f"tau must be >= 0, got {tau}")
    return tau / math.sqrt(1 + tau**2), 1 / math.sqrt(1 + tau**2)
  if rule == "2023":
    if not 0 <= tau <= 1:
      raise ValueError(f"rule '2023' takes 0 <= tau <= 1, got {tau}")
    return math.sqrt(tau), math.sqrt(1 - tau)
  raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def residual_split(x: Array, tau: float, rule: str = "umup") -> tuple[Array, Array]:
  """(residual, skip): both equal x forward; backward the branch's gradient is scaled
  by a and the skip's by b (`residual_weights`).

  `unit_scaling.functional.residual_split`. Paired with `residual_add`, whose
  forward applies a and b, dL/dx comes out exactly as plain autodiff.
  """
  a, b = residual_weights(tau, rule)
  return scale_bwd(x, a), scale_bwd(x, b)


def residual_add(residual: Array, skip: Array, tau: float, rule: str = "umup") -> Array:
  """a * residual + b * skip forward (`residual_weights`); gradients pass unscaled.

  `unit_scaling.functional.residual_add`. The branch output receives the
  unscaled cotangent, so weights inside the branch get plain autodiff times 1/a
  (u-muP: sqrt(1 + tau^2)/tau; 2023: 1/sqrt(tau)): harmless under Adam, not SGD.
  """
  a, b = residual_weights(tau, rule)
  return scale_fwd(residual, a) + scale_fwd(skip, b)


def residual_apply(fn: Callable[[Array], Array], x: Array, tau: float,
                   rule: str = "umup") -> Array:
  """y = a fn(x) + b x by `residual_split` then `residual_add`.

  u-muP: y = (tau fn(x) + x)/sqrt(1 + tau^2); 2023: y = sqrt(1 - tau) x + sqrt(tau) fn(x).
  dL/dx is plain autodiff of that formula; fn's own parameters (closed over)
  get plain autodiff times 1/a.
  """
  residual, skip = residual_split(x, tau, rule)
  return residual_add(fn(residual), skip, tau, rule)


def transformer_residual_scaling_rule(residual_mult: float = 1.0,
                                      residual_attn_ratio: float = 1.0
                                      ) -> Callable[[int, int], float]:
  """u-muP's per-branch tau: a function tau(index, num_branches).

  Branches are numbered 0 .. 2L-1, even = attention, odd = MLP
  (num_branches = 2L). u-muP (Blake et al. 2024, residual scaling; the library's
  rule of the same name) weights the branches alpha_attn, alpha_mlp with
      alpha_mlp = residual_mult * sqrt(2 / (1 + residual_attn_ratio^2)),
      alpha_attn = residual_attn_ratio * alpha_mlp
  (so their mean square is residual_mult^2), and
      tau_i = alpha_i / sqrt(L + alpha_attn^2 n_attn(i) + alpha_mlp^2 n_mlp(i)),
  n_attn(i) = ceil(i/2), n_mlp(i) = floor(i/2) the branches before i. With the
  u-muP residual (y = (tau f + x)/sqrt(1 + tau^2)) the stream is then the
  normalised sum of the embedding with weight L and branch i with alpha_i^2: the
  embedding keeps L / (L + 2L residual_mult^2) of the final variance, attention
  and MLP branches split the rest as residual_attn_ratio^2 : 1. With mult = ratio
  = 1: tau_i = 1/sqrt(L + i) (docs/science.md, "Unit scaling and the residual
  rule"). The formula is the library's (unit-scaling v0.3.5,
  `unit_scaling/core/functional.py`, `transformer_residual_scaling_rule`, "Appendix G
  of the u-muP paper"): tests/test_unit_scaling.py transcribes that source and
  compares the two for several mult, ratio and depths, and checks the variance
  shares above. The library does not validate (index, num_branches); this does.
  """
  alpha_mlp = residual_mult * math.sqrt(2 / (1 + residual_attn_ratio**2))
  alpha_attn = residual_attn_ratio * alpha_mlp

  def tau(index: int, num_branches: int) -> float:
    if num_branches % 2 or not 0 <= index < num_branches:
      raise ValueError(f"need an even num_branches and 0 <= index < num_branches, "
                       f"got index={index}, num_branches={num_branches}")
    n_attn, n_mlp = (index + 1) // 2, index // 2
    alpha = alpha_attn if index % 2 == 0 else alpha_mlp
    return alpha / math.sqrt(num_branches / 2 + alpha_attn**2 * n_attn +
                             alpha_mlp**2 * n_mlp)

  return tau


def attention_residual_weight(n: int, *, is_causal: bool = False, logit_std: float = 1.0,
                              rule: str = "umup") -> float:
  """The attention branch's tau so that it enters the stream at sqrt(e/n) of the skip.

  Graphcore Research, "Almost-scaled dot-product attention" (2023): fully
  (unit-)scaled attention trains worse than standard attention, whose output
  has std sqrt(exp(logit_std^2)/n) = sqrt(e/n) for unit q, k, v (docs/science.md,
  "Why the standard output shrinks with n");
  weighting the unit-scaled branch by that ratio against the skip restores the
  baseline's dynamics. The branch/skip ratio a/b is tau under "umup", so
  tau = r = sqrt(exp(logit_std^2) / n_eff); under "2023" sqrt(tau/(1 - tau)) = r,
  tau = r^2/(1 + r^2). Causal: query i sees i + 1 keys, so the baseline's mean
  output variance over positions is e H_n / n (H_n the harmonic number) and
  n_eff = n / H_n. To combine with a depth rule, multiply the depth tau by r.
  """
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  n_eff = n / sum(1.0 / i for i in range(1, n + 1)) if is_causal else float(n)
  r2 = math.exp(logit_std**2) / n_eff
  if rule == "umup":
    return math.sqrt(r2)
  if rule == "2023":
    return r2 / (1 + r2)
  raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


# Unit-scaled attention, the "umup" scaling, lives in the registry
# (attnscale/core/scalings.py) so that every scaling is there without Flax.
UnitScaledAttention = scalings.UnitScaledAttention
