"""Unit scaling, the functional layer: ops whose outputs and gradients have unit scale.

Blake et al. 2023, "Unit Scaling: Out-of-the-Box Low-Precision Training" (arXiv
2303.11257), and Blake et al. 2024, "u-muP: The Unit-Scaled Maximal Update
Parametrization" (arXiv 2407.17465). The reference design is Graphcore's
`unit-scaling` library (0.3.5), `unit_scaling/functional.py`: each op multiplies its
output by one factor in the forward pass (`scale_fwd`) and its input/weight
gradients by others in the backward pass (`scale_bwd`), chosen so that at
initialisation, with unit-variance inputs, N(0, 1) weights and a unit-variance
cotangent, everything has std about 1. Each docstring states its rule and where
the constant comes from. Constants are computed for N(0, 1) inputs and do not
track the data: unit scale holds at init, not throughout training.

Importing this module registers the attention scaling "umup" (formerly "unit_scaled").

Dimension legend: B batch (all leading axes, flattened), I fan-in, O fan-out,
V vocabulary, D model/feature width; for attention as in `attnscale.attention`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attnscale import layers, scalings
from attnscale.visibility import upcast

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


CONSTRAINTS = (None, "to_output_scale", "to_grad_input_scale", "gmean")


def _constrain(constraint: str | None, output_scale: float,
               grad_input_scale: float) -> tuple[float, float]:
  """The library's `constraints`: tie the forward and input-gradient scales.

  Blake et al. 2023, section 5.2: an op whose input is not a "cut edge" of the
  graph needs the same scale forward and backward, or dL/dx is no longer a
  multiple of the true gradient. None keeps them separate (both exactly unit);
  "to_output_scale" (the library's default) uses the forward scale for both.
  """
  if constraint is None:
    return output_scale, grad_input_scale
  if constraint == "to_output_scale":
    return output_scale, output_scale
  if constraint == "to_grad_input_scale":
    return grad_input_scale, grad_input_scale
  if constraint == "gmean":
    s = math.sqrt(output_scale * grad_input_scale)
    return s, s
  raise ValueError(f"constraint must be one of {CONSTRAINTS}, got {constraint!r}")


# ---------------------------------------------------------------------------
# Unit-scaled ops.


def linear(x_BxI: Array, w_IxO: Array, b_O: Array | None = None, *,
           constraint: str | None = "to_output_scale", preferred_element_type=None) -> Array:
  """y = x @ w / sqrt(fan_in) (+ b), for weights initialised N(0, 1).

  `unit_scaling.functional.linear`: output scale 1/sqrt(fan_in); input gradient
  1/sqrt(fan_out) (a sum of fan_out unit terms); weight and bias gradients
  1/sqrt(batch_size), batch_size = x.size // fan_in (sums over the batch). The
  library's default constraint "to_output_scale" makes the input gradient use
  1/sqrt(fan_in) too (exactly unit only when fan_in == fan_out, else its std is
  sqrt(fan_out / fan_in)); constraint=None gives the separate, both-unit scales.
  preferred_element_type: the product's accumulation and output dtype (e.g.
  float32 from bfloat16 inputs).
  """
  fan_in, fan_out = w_IxO.shape
  batch_size = x_BxI.size // fan_in
  out_scale, grad_x_scale = _constrain(constraint, fan_in**-0.5, fan_out**-0.5)
  x_BxI = scale_bwd(x_BxI, grad_x_scale)
  w_IxO = scale_bwd(w_IxO, batch_size**-0.5)
  y_BxO = scale_fwd(layers.matmul(x_BxI, w_IxO, preferred_element_type=preferred_element_type),
                    out_scale)
  if b_O is not None:
    y_BxO = y_BxO + _over_last_axis(scale_bwd(b_O, batch_size**-0.5), y_BxO.ndim)
  return y_BxO


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


def rms_norm(x_BxD: Array, scale_D: Array | None = None, eps: float = 1e-6) -> Array:
  """x / sqrt(mean(x^2) + eps) * scale over the last axis.

  As `layer_norm` (the library's `rms_norm`): only the weight gradient is
  scaled, by 1/sqrt(batch_size).
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


@functools.lru_cache(maxsize=None)
def gelu_scales(mult: float = 1.0) -> tuple[float, float]:
  """(std of gelu(mult x), rms of d/dx gelu(mult x)) for x ~ N(0, 1).

  By 128-point Gauss-Hermite quadrature, with gelu(u) = u Phi(u) (exact, erf) and
  gelu'(u) = Phi(u) + u phi(u). At mult = 1: 0.5879 and 0.6752, the 0.588 and
  0.675 of the unit-scaling library's scaled GELU (mean 1/(2 sqrt(pi)) = 0.282,
  so the RMS of the output is 0.652).
  """
  x, w = np.polynomial.hermite_e.hermegauss(128)
  w = w / w.sum()
  u = mult * x
  cdf = 0.5 * (1.0 + np.array([math.erf(t / math.sqrt(2.0)) for t in u]))
  pdf = np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
  g, dg = u * cdf, mult * (cdf + u * pdf)
  mean = np.sum(w * g)
  return float(np.sqrt(np.sum(w * g * g) - mean**2)), float(np.sqrt(np.sum(w * dg * dg)))


def gelu(x: Array, *, mult: float = 1.0,
         constraint: str | None = "to_output_scale") -> Array:
  """gelu(mult x) / std, input gradient divided by rms(d/dx gelu(mult x)).

  The scaled GELU of the unit-scaling library (output scale 1/0.588, input
  gradient scale 1/0.675 at mult = 1; `gelu_scales` computes them for any mult,
  the u-muP input multiplier). The library's default constraint
  "to_output_scale" uses 1/0.588 backward too, so the input gradient has std
  0.675/0.588 = 1.15; constraint=None makes both exactly unit. Exact (erf) GELU.
  """
  out_std, grad_rms = gelu_scales(float(mult))
  out_scale, grad_scale = _constrain(constraint, 1.0 / out_std, 1.0 / grad_rms)
  x = scale_bwd(x, grad_scale)
  return scale_fwd(jax.nn.gelu(mult * x, approximate=False), out_scale)


def softmax_cross_entropy(logits_BxV: Array, labels_B: Array,
                          reduction: str = "mean") -> Array:
  """The real cross-entropy loss; the logits' gradient scaled to unit std.

  `unit_scaling.functional.cross_entropy`: the logits' gradient is scaled by
  V / sqrt(V - 1), and a "mean" is taken as scale_fwd(sum, 1/batch_size) so the
  value is the true mean but no 1/batch_size reaches the gradient. Why V /
  sqrt(V - 1): the gradient of one token's loss is p - onehot(label); for a
  near-uniform p its mean square over the V entries is ((1 - 1/V)^2 + (V - 1)/V^2)/V
  = (V - 1)/V^2. Softmax in float32 or wider.
  """
  if reduction not in ("mean", "sum"):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
  vocab_size = logits_BxV.shape[-1]
  logits_BxV = scale_bwd(upcast(logits_BxV), vocab_size / (vocab_size - 1)**0.5)
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
  rule"). The general formula was checked against the library's 0.3.5 source
  (`transformer_residual_scaling_rule`); the mult = ratio = 1 case and the
  variance shares above are tested.
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


# ---------------------------------------------------------------------------
# Unit-scaled attention, as a scaling for `attnscale.attention`.


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
  """

  mult: float = 1.0

  def __call__(self, q, k, keys):
    d = q.shape[-1]
    e_var = math.exp(self.mult**2 / d)
    n_BTN = jnp.maximum(keys.count(), 1.0)  # n = 0 rows are zeroed by `attention`.
    c_BTN = n_BTN * jax.lax.rsqrt(1.0 + (n_BTN - 1.0) * e_var)
    return scalings.Scaled(q, k, logit_scale=self.mult / d, output_scale=c_BTN)

  def init_logit_scale(self, head_dim: int) -> float:
    return self.mult / head_dim


scalings.register("umup")(UnitScaledAttention)
