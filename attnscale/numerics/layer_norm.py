"""The model's LayerNorm, on the kernel `model.layernorm_impl` names.

    y = (x - mu) r s + b,   mu = mean(x),   r = 1 / sqrt(var(x) + eps)

over the last axis (Ba et al. 2016, "Layer Normalization", arXiv 1607.06450),
statistics in float32 whatever x's dtype, y in the layer's `dtype`. Its
backward, with xh = (x - mu) r and g = dy s,

    dx = r (g - mean(g) - xh mean(g xh)),   ds = sum dy xh,   db = sum dy,

is the fused backward of Apex's and PyTorch's LayerNorm kernels. Kernels:

* "native": `attnscale.core.cpu_kernel.norms` (C++ through jax.ffi, forward and
  backward one pass each over a row; two-pass variance);
* "fused_xla": `layer_norm_xla` below, flax's forward with that backward as a
  `jax.custom_vjp` (mu and r kept, not re-derived through autodiff);
* "xla": `flax.nnx.LayerNorm` itself (autodiff of its forward).

None picks "native" in a program for one CPU device where the library built,
"xla" elsewhere (`kernel_for`, the one rule). Every kernel keeps flax's
parameters (`scale`, `bias`), so checkpoints move between them.

Dimension legend: B leading axes, D features.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array

IMPLEMENTATIONS = (None, "native", "fused_xla", "xla")


def kernel_for(implementation: str | None, dtype, out_dtype) -> str:
  """The kernel a LayerNorm runs: "native", "fused_xla" or "xla" (see the module).

  "native" and None get the native kernel where `native_refusal` names no
  reason (a build that failed has warned once), "xla" otherwise.
  """
  if implementation in ("xla", "fused_xla"):
    return implementation
  return "native" if native_refusal(dtype, out_dtype) is None else "xla"


def native_refusal(dtype, out_dtype) -> str | None:
  """Why the native LayerNorm cannot run a call, or None where it can: float32 or
  bfloat16 in and out, in a program for one CPU device (XLA cannot partition a
  custom call over a mesh's axes), the library built."""
  from attnscale.core import cpu_kernel, fused
  program = fused.native_program_refusal()
  if program is not None:
    return program
  from attnscale.core.cpu_kernel import norms
  if any(jnp.dtype(d) not in norms.DTYPES for d in (dtype, out_dtype)):
    return f"dtypes {jnp.dtype(dtype).name} -> {jnp.dtype(out_dtype).name} (float32, bfloat16)"
  if not cpu_kernel.available():
    return "the native library did not build"
  return None


def layer_norm_xla(x_BxD: Array, scale_D: Array | None, bias_D: Array | None,
                   eps: float = 1e-6, dtype=None) -> Array:
  """LayerNorm with flax's forward (E[x^2] - mu^2, clipped at 0) and the fused backward."""
  dtype = jnp.dtype(x_BxD.dtype if dtype is None else dtype)
  D = x_BxD.shape[-1]
  scale_D = jnp.ones((D,), jnp.float32) if scale_D is None else scale_D
  has_bias = bias_D is not None
  bias_D = jnp.zeros((D,), jnp.float32) if bias_D is None else bias_D
  return _layer_norm(x_BxD, scale_D, bias_D, float(eps), dtype, has_bias)


def _stats(x_BxD, eps):
  x_BxD = x_BxD.astype(jnp.promote_types(x_BxD.dtype, jnp.float32))
  mean_Bx1 = jnp.mean(x_BxD, -1, keepdims=True)
  var_Bx1 = jnp.maximum(0.0, jnp.mean(x_BxD * x_BxD, -1, keepdims=True) - mean_Bx1 * mean_Bx1)
  return x_BxD, mean_Bx1, jax.lax.rsqrt(var_Bx1 + eps)


def _features(v_D, ndim):
  """[D] -> [1, ..., 1, D], to multiply a rank-`ndim` array explicitly."""
  return v_D.reshape((1,) * (ndim - 1) + v_D.shape)


def _forward(x_BxD, scale_D, bias_D, eps, dtype, has_bias):
  x32_BxD, mean_Bx1, rstd_Bx1 = _stats(x_BxD, eps)
  # flax's order of operations, so that the forward's bits are flax's.
  y_BxD = (x32_BxD - mean_Bx1) * (rstd_Bx1 * _features(scale_D, x_BxD.ndim))
  if has_bias:
    y_BxD = y_BxD + _features(bias_D, x_BxD.ndim)
  return y_BxD.astype(dtype), (mean_Bx1, rstd_Bx1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _layer_norm(x_BxD, scale_D, bias_D, eps, dtype, has_bias):
  return _forward(x_BxD, scale_D, bias_D, eps, dtype, has_bias)[0]


def _layer_norm_fwd(x_BxD, scale_D, bias_D, eps, dtype, has_bias):
  y_BxD, (mean_Bx1, rstd_Bx1) = _forward(x_BxD, scale_D, bias_D, eps, dtype, has_bias)
  return y_BxD, (x_BxD, scale_D, bias_D, mean_Bx1, rstd_Bx1)


def _layer_norm_bwd(eps, dtype, has_bias, residuals, dy_BxD):
  x_BxD, scale_D, bias_D, mean_Bx1, rstd_Bx1 = residuals
  xh_BxD = (x_BxD.astype(mean_Bx1.dtype) - mean_Bx1) * rstd_Bx1
  dy_BxD = dy_BxD.astype(mean_Bx1.dtype)
  g_BxD = dy_BxD * _features(scale_D, x_BxD.ndim)
  dx_BxD = rstd_Bx1 * (g_BxD - jnp.mean(g_BxD, -1, keepdims=True)
                       - xh_BxD * jnp.mean(g_BxD * xh_BxD, -1, keepdims=True))
  D = x_BxD.shape[-1]
  dscale_D = jnp.sum((dy_BxD * xh_BxD).reshape(-1, D), axis=0).astype(scale_D.dtype)
  dbias_D = (jnp.sum(dy_BxD.reshape(-1, D), axis=0).astype(bias_D.dtype) if has_bias
             else jnp.zeros_like(bias_D))
  return dx_BxD.astype(x_BxD.dtype), dscale_D, dbias_D


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nnx.LayerNorm):
  """`flax.nnx.LayerNorm` over the last axis (its parameters, init and defaults), run
  on the kernel `implementation` names (`kernel_for`)."""

  def __init__(self, num_features: int, *, implementation: str | None = None, **kwargs):
    super().__init__(num_features, **kwargs)
    if implementation not in IMPLEMENTATIONS:
      raise ValueError(f"LayerNorm implementation must be one of {IMPLEMENTATIONS}, "
                       f"got {implementation!r}")
    self.implementation = implementation

  def __call__(self, x, *, mask=None):
    if mask is not None or self.reduction_axes != -1 or self.feature_axes != -1 or (
        self.axis_name is not None):
      return super().__call__(x, mask=mask)
    out_dtype = self.dtype or jnp.result_type(x, *(p[...] for p in (self.scale, self.bias)
                                                     if p is not None))
    kernel = kernel_for(self.implementation, x.dtype, out_dtype)
    if kernel == "xla":
      return super().__call__(x)
    scale_D = None if self.scale is None else self.scale[...]
    bias_D = None if self.bias is None else self.bias[...]
    if kernel == "fused_xla":
      return layer_norm_xla(x, scale_D, bias_D, self.epsilon, out_dtype)
    from attnscale.core.cpu_kernel import norms
    if scale_D is None:
      scale_D = jnp.ones((x.shape[-1],), jnp.float32)
    return norms.layer_norm(x, scale_D, bias_D, self.epsilon, out_dtype)
