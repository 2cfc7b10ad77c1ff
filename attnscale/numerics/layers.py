"""Linear layers as 2-D matrix products, the layout XLA's CPU backend runs fast.

`x_BTD @ W_DF` with a rank-3 x makes XLA's CPU backend transpose the [B, T, F]
gradient before the weight gradient's product (a contraction over both B and T),
and that transpose, fused with the elementwise op before it, cost more than the
products: a GELU MLP's forward + backward at B=32, T=128, D=128 took 39 ms as
rank 3 and 11 ms as [B*T, D] @ [D, F] (2 CPU cores, JAX 0.10). Reshaping the
leading axes away is free (a bitcast); on GPU and TPU it changes nothing.

Every matrix product of both model variants goes through `matmul` (the unit
model's `unit_scaling.linear` and the tied readouts) or `Dense`, so these are
where simulated fp8 rounds a product's operands and gradient (`fp8=`,
`attnscale.numerics.precision.Fp8`) and where scale tracking taps its input "x" and
output "y" (`precision.tap`). With fp8=None and no tracking, both run exactly
the code they ran before either existed.

Dimension legend: B leading axes (flattened to M), I fan-in, O fan-out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attnscale.numerics import precision

Array = jax.Array


def matmul(x_BxI: Array, w_IxO: Array, *, fp8: precision.Fp8 | None = None,
           **kwargs) -> Array:
  """x @ w over x's last axis, computed as one [prod(batch), I] @ [I, O] product.

  fp8: round x and w to e4m3 forward and the gradient arriving at the product
  to e5m2 backward (`precision.Fp8`). kwargs go to `jnp.matmul`
  (e.g. preferred_element_type).
  """
  x_MI = precision.tap(x_BxI.reshape(-1, x_BxI.shape[-1]), "x")
  if fp8 is not None:
    x_MI, w_IxO = fp8.inputs(x_MI), fp8.inputs(w_IxO)
  y_MO = jnp.matmul(x_MI, w_IxO, **kwargs)
  if fp8 is not None:
    y_MO = fp8.grad(y_MO)
  y_MO = precision.tap(y_MO, "y")
  return y_MO.reshape(*x_BxI.shape[:-1], w_IxO.shape[-1])


class Dense(nnx.Linear):
  """`nnx.Linear` (same parameters, init and dtype handling) over flattened leading axes.

  dtype may also be "fp8" (a model.dtype): float32 arithmetic with the product
  rounded as `fp8` says (default `precision.Fp8()`: no per-tensor scaling).
  """

  def __init__(self, *args, dtype=None, fp8: precision.Fp8 | None = None, **kwargs):
    if isinstance(dtype, str) and dtype == "fp8":
      dtype, fp8 = precision.compute_dtype("fp8"), fp8 or precision.Fp8()
    super().__init__(*args, dtype=dtype, **kwargs)
    self.fp8 = fp8

  def __call__(self, inputs: Array, out_sharding=None) -> Array:
    x_MI = inputs.reshape(-1, inputs.shape[-1])
    if self.fp8 is None:
      x_MI = precision.tap(x_MI, "x")
      y_MO = precision.tap(super().__call__(x_MI, out_sharding=out_sharding), "y")
    else:
      kernel = self.kernel[...]
      bias = self.bias[...] if self.bias is not None else None
      x_MI, kernel, bias = self.promote_dtype((x_MI, kernel, bias), dtype=self.dtype)
      y_MO = matmul(x_MI, kernel, fp8=self.fp8, precision=self.precision)
      if bias is not None:
        y_MO = y_MO + bias[None, :]
    return y_MO.reshape(*inputs.shape[:-1], y_MO.shape[-1])
