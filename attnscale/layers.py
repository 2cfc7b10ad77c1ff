"""Linear layers as 2-D matrix products, the layout XLA's CPU backend runs fast.

`x_BTD @ W_DF` with a rank-3 x makes XLA's CPU backend transpose the [B, T, F]
gradient before the weight gradient's product (a contraction over both B and T),
and that transpose, fused with the elementwise op before it, cost more than the
products: a GELU MLP's forward + backward at B=32, T=128, D=128 took 39 ms as
rank 3 and 11 ms as [B*T, D] @ [D, F] (2 CPU cores, JAX 0.10). Reshaping the
leading axes away is free (a bitcast); on GPU and TPU it changes nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array


def matmul(x_BxI: Array, w_IxO: Array, **kwargs) -> Array:
  """x @ w over x's last axis, computed as one [prod(batch), I] @ [I, O] product."""
  y_MO = jnp.matmul(x_BxI.reshape(-1, x_BxI.shape[-1]), w_IxO, **kwargs)
  return y_MO.reshape(*x_BxI.shape[:-1], w_IxO.shape[-1])


class Dense(nnx.Linear):
  """`nnx.Linear` (same parameters, init and dtype handling) over flattened leading axes."""

  def __call__(self, inputs: Array, out_sharding=None) -> Array:
    y_MO = super().__call__(inputs.reshape(-1, inputs.shape[-1]), out_sharding=out_sharding)
    return y_MO.reshape(*inputs.shape[:-1], y_MO.shape[-1])
