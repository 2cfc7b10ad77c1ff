"""The native CPU LayerNorm: forward and backward in C++ through `jax.ffi`.

    y = (x - mu) r s + b,   mu = mean(x),   r = 1 / sqrt(mean((x - mu)^2) + eps)

over the last axis (Ba et al. 2016, "Layer Normalization", arXiv 1607.06450).
The forward keeps mu and r for the backward, which is the fused one of Apex's
and PyTorch's kernels: with xh = (x - mu) r and g = dy s,

    dx = r (g - mean(g) - xh mean(g xh)),   ds = sum dy xh,   db = sum dy

(sums over every axis but the last). x float32 or bfloat16, y in `dtype`
(float32 or bfloat16), every statistic and sum in float32; the bits are the
same on any number of threads. Under `jax.vmap` (a pack of runs, each with its
own gain) one call takes every run's rows (vmap_method="broadcast_all": x
[R..., rows, D], gains [R..., D]), not a loop of calls. Source: layer_norm.cc;
the build: `build`;
threads and pool as the attention kernel's (ATTNSCALE_NATIVE_THREADS,
ATTNSCALE_NATIVE_POOL). `attnscale.numerics.layer_norm` picks it for the model.

Dimension legend: R rows (every leading axis), D features.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnscale.core.cpu_kernel import build

Array = jax.Array

DTYPES = (jnp.float32, jnp.bfloat16)


def layer_norm(x_RxD: Array, scale_D: Array, bias_D: Array | None = None, eps: float = 1e-6,
               dtype=None) -> Array:
  """LayerNorm of x over its last axis on the native kernel; y in `dtype` (default x's).

  Differentiable in x, scale and bias. Raises if the library did not build
  (`attnscale.core.cpu_kernel.available()` says whether it did).
  """
  if build.load() is None:
    raise RuntimeError("the native CPU LayerNorm is unavailable (see the warning)")
  dtype = jnp.dtype(x_RxD.dtype if dtype is None else dtype)
  if jnp.dtype(x_RxD.dtype) not in DTYPES or dtype not in DTYPES:
    raise ValueError(f"the native LayerNorm takes float32 or bfloat16, got x {x_RxD.dtype}, "
                     f"y {dtype}")
  shape = x_RxD.shape
  x_RD = x_RxD.reshape(-1, shape[-1])  # free: the leading axes are contiguous
  has_bias = bias_D is not None
  bias_D = jnp.zeros((1,), jnp.float32) if bias_D is None else bias_D.astype(jnp.float32)
  y_RD = _layer_norm(x_RD, scale_D.astype(jnp.float32), bias_D, float(eps), dtype, has_bias)
  return y_RD.reshape(shape)


def _attrs() -> dict:
  from attnscale.core import cpu_kernel  # the attention kernel's pool and thread settings
  attrs = cpu_kernel._attrs(False, False)
  return {"pool": attrs["pool"], "threads": attrs["threads"]}


def _forward(x_RD, scale_D, bias_D, eps, dtype, has_bias):
  R, D = x_RD.shape
  out_types = (jax.ShapeDtypeStruct((R, D), dtype), jax.ShapeDtypeStruct((R,), jnp.float32),
               jax.ShapeDtypeStruct((R,), jnp.float32))
  call = jax.ffi.ffi_call("attnscale_layer_norm_fwd", out_types, vmap_method="broadcast_all")
  return call(x_RD, scale_D, bias_D, eps=np.float32(eps), has_bias=np.int64(has_bias),
              **_attrs())


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _layer_norm(x_RD, scale_D, bias_D, eps, dtype, has_bias):
  return _forward(x_RD, scale_D, bias_D, eps, dtype, has_bias)[0]


def _layer_norm_fwd(x_RD, scale_D, bias_D, eps, dtype, has_bias):
  y_RD, mean_R, rstd_R = _forward(x_RD, scale_D, bias_D, eps, dtype, has_bias)
  return y_RD, (x_RD, scale_D, bias_D, mean_R, rstd_R)


def _layer_norm_bwd(eps, dtype, has_bias, residuals, dy_RD):
  x_RD, scale_D, bias_D, mean_R, rstd_R = residuals
  out_types = (jax.ShapeDtypeStruct(x_RD.shape, x_RD.dtype),
               jax.ShapeDtypeStruct(scale_D.shape, jnp.float32),
               jax.ShapeDtypeStruct(scale_D.shape, jnp.float32))
  call = jax.ffi.ffi_call("attnscale_layer_norm_bwd", out_types, vmap_method="broadcast_all")
  dx_RD, dscale_D, dbias_D = call(x_RD, scale_D, mean_R, rstd_R, dy_RD.astype(dtype), **_attrs())
  return dx_RD, dscale_D, dbias_D if has_bias else jnp.zeros_like(bias_D)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
