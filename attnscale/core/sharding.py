"""The mesh's axis names, and the one activation layout every model keeps.

attnscale's mesh is `data` x `fsdp` (`train_state.make_mesh`). Both axes split
the batch: `data` replicates the parameters, `fsdp` shards them too (fully
sharded data parallelism, ZeRO-3). So every activation is sharded on its batch
dimension over both axes and is never split along its features: the compiled
step then all-gathers weights and reduce-scatters gradients, and never gathers
or all-to-alls an activation.

XLA's partitioner infers activation layouts from the parameters'. A weight split
on the model axis (an embedding table [V, D] whose largest axis fsdp divides is
D) makes it shard the residual stream on D instead, all-gather the token ids
and every activation, and hold all-to-alls: found by compiling the nanogpt
preset for TPU v5e-8 and 8 H100s at fsdp=8 (`compile.py`). `constrain_batch`
tells it the layout where the residual stream starts, and `gathered` that a
table looked up by token (an embedding, the tied readout) is all-gathered
whole before use, as FSDP does with every weight: left to itself XLA looks up
in the D-sharded table and all-to-alls the result (GPT-2 small on TPU).

Dimension legend: B batch.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp")  # both split the batch (train_state.batch_sharding)


def current_mesh():
  """The mesh the program is traced under (`jax.sharding.use_abstract_mesh`), or None."""
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh.empty else mesh


def constrain_batch(x_B: jax.Array) -> jax.Array:
  """x sharded on its first (batch) axis over every mesh axis, replicated otherwise.

  The identity outside a mesh (a notebook, a test on one device) or where the
  batch does not divide the mesh (sampling a single row).
  """
  mesh = current_mesh()
  if mesh is None or not set(MESH_AXES) <= set(mesh.axis_names):
    return x_B
  if x_B.shape[0] % (mesh.shape["data"] * mesh.shape["fsdp"]):
    return x_B
  spec = P(MESH_AXES, *(None,) * (x_B.ndim - 1))
  return jax.lax.with_sharding_constraint(x_B, jax.sharding.NamedSharding(mesh, spec))


def gathered(w: jax.Array) -> jax.Array:
  """The weight `w` whole on every device where it is used (FSDP's all-gather).

  Its stored layout is unchanged (sharded over `fsdp`); the gradient flows back
  into it reduce-scattered. The identity outside a mesh.
  """
  mesh = current_mesh()
  if mesh is None:
    return w
  return jax.lax.with_sharding_constraint(
      w, jax.sharding.NamedSharding(mesh, P(*(None,) * w.ndim)))
