"""Train state and device mesh: the state's layout, its shardings (FSDP), its creation.

The train state is a plain dict {"step", "params", "opt_state", "last_losses"}:
params is the model's `nnx.State`, the model's structure (graphdef) stays
outside, so the state is an ordinary pytree that jit can donate and orbax can
save. Randomness (dropout) and data order are functions of (config.seed, step),
so `step` is the whole data position and RNG state: restoring it resumes
bit-for-bit. `last_losses` is the window of the last `LAST_LOSSES` training
losses (the train step pushes each step's), so the final-loss metric
(`loss_last20`) is checkpointed with the step it belongs to and a resumed run
reports the uninterrupted run's value. A checkpoint written before the window
existed restores with an empty one (`Checkpoints.restore`).

The optimizer is built in `attnscale/runtime/optimizers.py`, checkpoints are read
and written by `attnscale/runtime/checkpoints.py`. The functions that build a
model or a state take the run's `RunConfig` (`attnscale.config.run`), or
a ConfigDict, which they read with `run_config.of`.

Parallelism: one `jax.sharding.Mesh` over all devices (of all processes) with
axes `data` x `fsdp` (`config.mesh`; the default puts every device on `data`).
Batches are sharded on both axes, so every device gets its own rows. Params and
optimizer state are sharded on `fsdp` and replicated over `data` (fully sharded
data parallel, as nanodo, big_vision and MaxText do it with NamedSharding): each
weight matrix is split along its largest axis that `fsdp` divides; vectors and
scalars (gains, biases, the step) are replicated. XLA's partitioner inserts the
collectives (all-gathers of the weights, the gradients' reductions). A matrix
that no axis of splits evenly is a one-line error naming config.mesh.fsdp
(`state_shardings`): replicating it instead would quietly give back the memory
FSDP is for.

Dimension legend: W the window of recent losses (`LAST_LOSSES`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attnscale import models
from attnscale.config import run as run_config
from attnscale.core import sharding
from attnscale.runtime import configlib, optimizers
from attnscale.runtime.checkpoints import State

# Graphcore's final training loss is the mean of the last 20 steps' losses.
LAST_LOSSES = 20


MESH_AXES = sharding.MESH_AXES  # ("data", "fsdp")


def make_mesh(config: ml_collections.ConfigDict | None = None, devices=None
              ) -> jax.sharding.Mesh:
  """The `data` x `fsdp` mesh of `config.mesh` over every device of every process.

  None (or a config without `mesh`) puts every device on `data`. `devices`:
  others than `jax.devices()`, e.g. a TPU slice's that `compile.py` compiles for.

  Raises:
    ValueError: config.mesh does not fit the devices (one line, naming the field).
  """
  devices = jax.devices() if devices is None else list(devices)
  return _mesh(*configlib.mesh_shape(config, len(devices)), devices)


def evaluation_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """The mesh to evaluate a run's checkpoint on, with the devices here.

  The run's own mesh when it fits these devices; else the run's fsdp count if
  it divides the device count (the model was sharded because it needed to be),
  or 1, with every other device on `data`. The data count is a throughput
  choice, so a checkpoint trained on 8 devices evaluates on 1 (orbax restores
  across mesh shapes).
  """
  num_devices = jax.device_count()
  try:
    return _mesh(*configlib.mesh_shape(config, num_devices))
  except ValueError:  # trained on another device count
    mesh = getattr(config, "mesh", None)
    fsdp = mesh.fsdp if mesh is not None and mesh.fsdp > 0 else 1
    fsdp = fsdp if num_devices % fsdp == 0 else 1
    return _mesh(num_devices // fsdp, fsdp)


def _mesh(data: int, fsdp: int, devices=None) -> jax.sharding.Mesh:
  # Devices ordered by process: flattening the mesh gives each process one
  # contiguous block of batch rows, so process p's devices hold rows
  # [p * b, (p + 1) * b) of the global batch, the rows `Task.train_batch` gives
  # process p (`jax.make_array_from_process_local_data` places them there).
  devices = sorted(jax.devices() if devices is None else devices,
                   key=lambda d: (d.process_index, d.id))
  return jax.sharding.Mesh(np.asarray(devices).reshape(data, fsdp), MESH_AXES)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Batches: rows sharded on every device (`data` and `fsdp` both split them)."""
  return NamedSharding(mesh, P(MESH_AXES))


def init_model(run, seed=None) -> models.Model:
  """The model `run.model.variant` names (`attnscale.models.VARIANTS`), initialised
  from `seed` (default the run's seed; an array under a packed init's vmap)."""
  run = run_config.of(run)
  return models.build(run.model,
                      rngs=nnx.Rngs(params=run.seed if seed is None else jax.random.key(seed)))


def init_last_losses() -> dict[str, jax.Array]:
  """An empty loss window: {"loss_W": float32 [W], "count": int32 []}, W = LAST_LOSSES.

  The newest loss is loss_W[-1]; only the last `count` entries are losses.
  """
  return {"loss_W": jnp.zeros((LAST_LOSSES,), jnp.float32), "count": jnp.zeros((), jnp.int32)}


def push_loss(last_losses: dict[str, jax.Array], loss) -> dict[str, jax.Array]:
  """The window with `loss` appended (the oldest dropped once it holds W); jittable."""
  loss_W = jnp.roll(last_losses["loss_W"], -1).at[-1].set(jnp.asarray(loss, jnp.float32))
  return {"loss_W": loss_W, "count": jnp.minimum(last_losses["count"] + 1, LAST_LOSSES)}


def mean_last_losses(last_losses) -> float:
  """The mean of the window's losses, oldest to newest in float64 (NaN if empty)."""
  count = int(last_losses["count"])
  if count == 0:
    return float("nan")
  return float(np.mean([float(x) for x in np.asarray(last_losses["loss_W"])[-count:]]))


def fsdp_spec(shape: tuple[int, ...], fsdp: int) -> P | None:
  """The partition spec of an array of `shape` on an fsdp axis of `fsdp` devices.

  big_vision's `fsdp` rule (big_vision/sharding.py): a matrix (ndim >= 2) is
  split along its largest axis that `fsdp` divides (the first of equal ones);
  vectors and scalars are replicated (O(width) bytes, not worth a collective).
  nanodo (nanodo/fsdp.py) instead names each layer's model axis D in a table;
  a rule on shapes alone shards a new model variant without one. None: a matrix
  that no axis of splits evenly (JAX shards only evenly).
  """
  if fsdp == 1 or len(shape) < 2:
    return P()
  for axis in sorted(range(len(shape)), key=lambda i: -shape[i]):
    if shape[axis] % fsdp == 0:
      return P(*(None,) * axis, "fsdp")
  return None


def state_shardings(abstract: State, mesh: jax.sharding.Mesh):
  """The NamedSharding of every leaf of the (abstract) train state on `mesh`.

  Raises:
    ValueError: a parameter matrix that mesh.fsdp divides no axis of; one line
      naming config.mesh.fsdp, the parameter, and the counts that would work.
  """
  fsdp = mesh.shape["fsdp"]
  # Parameters first: the optimizer's moments mirror them, and the parameter's
  # name is the one a user recognises.
  bad = (_unsplittable({"params": abstract["params"]}, fsdp) if "params" in abstract else None
         ) or _unsplittable(abstract, fsdp)
  if bad is not None:
    path, x = bad
    shapes = [leaf.shape for leaf in jax.tree.leaves(abstract)]
    allowed = [f for f in range(1, mesh.size + 1)
               if mesh.size % f == 0 and all(fsdp_spec(s, f) is not None for s in shapes)]
    raise ValueError(f"config.mesh.fsdp={fsdp} divides no axis of {_dotted(path)} "
                     f"{tuple(x.shape)}: with {mesh.size} devices it must be one of {allowed}")
  return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(x.shape, fsdp)), abstract)


def _unsplittable(tree, fsdp: int):
  """(path, leaf) of the first leaf of `tree` that fsdp splits no axis of, or None."""
  return next(((path, x) for path, x in jax.tree_util.tree_leaves_with_path(tree)
               if fsdp_spec(x.shape, fsdp) is None), None)


def _dotted(path) -> str:
  """`blocks.0.attn.q_proj.kernel` for a pytree key path (nnx's `.value` dropped)."""
  names = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
  return ".".join(n for n in names if n != "value")


def create_state(run, mesh) -> tuple[nnx.GraphDef, State, Any]:
  """Initialises the train state directly into its shardings (`state_shardings`).

  Shapes first (`abstract_state`), then shardings, then a jitted init: no device
  ever holds an unsharded copy (big_vision/nanodo style). A start builds these
  once (`attnscale.runtime.startup`); this is the same for a test or a tool.

  Args:
    run: the run's `RunConfig` (or a ConfigDict: `run_config.of`).
    mesh: the device mesh (`make_mesh`).

  Returns:
    (graphdef, state, state_shardings).

  Raises:
    ValueError: mesh.fsdp splits no axis of a parameter matrix (before any
      device work).
  """
  run = run_config.of(run)
  graphdef, shapes = abstract_state(run)
  shardings = state_shardings(shapes, mesh)
  with threefry_kernel_on_gpu():
    state = jax.jit(init_fn(run), out_shardings=shardings)()
  return graphdef, state, shardings


def abstract_state(run, tx=None) -> tuple[nnx.GraphDef, State]:
  """(graphdef, the train state as jax.ShapeDtypeStructs), from one abstract
  initialisation of the model and its optimizer state (`tx`: as `init_fn`'s):
  nothing is allocated."""
  init = init_fn(run, tx)
  shapes = jax.eval_shape(init)
  return init.graphdef, shapes


def graph_def(run) -> nnx.GraphDef:
  """The model's structure (what `nnx.merge` rebuilds it from), from shapes alone."""
  return abstract_state(run)[0]


@contextlib.contextmanager
def threefry_kernel_on_gpu():
  """Lowers jax.random's threefry to JAX's CUDA kernel inside this block, on GPU only.

  Why: with threefry lowered to XLA ops (the default), compiling GPT-2 small's
  `jit(init)` (74 random matrices) took 197 s on one H200, against 3.8 s with the
  kernel (measured 2026-11-26, JAX 0.11.2;
  docs/benchmarks.md). The kernel computes the same threefry2x32 bits, so the
  initial parameters are unchanged (checked on that GPU); what it costs is memory
  for the random bits, which an init holds anyway. The flag is part of jit's cache
  key, and CPU and TPU lowerings ignore it. Left off for the train step, where a
  dropout mask's bits would be materialised instead of fused.
  """
  previous = jax.config.jax_threefry_gpu_kernel_lowering
  jax.config.update("jax_threefry_gpu_kernel_lowering", True)
  try:
    yield
  finally:
    jax.config.update("jax_threefry_gpu_kernel_lowering", previous)


def state_shapes(run) -> State:
  """The train state as jax.ShapeDtypeStructs (`jax.eval_shape`): nothing allocated."""
  return abstract_state(run)[1]


def init_fn(run, tx=None):
  """The function that returns the initial train state (to jit): `init()` from
  the run's seed, `init(seed)` from another (a packed sweep vmaps it over its seeds).
  The optimizer state is `optimizers.build`'s at the run's own numbers (its layout
  does not depend on the traced values). Once traced, `init.graphdef` is the model's
  structure (`abstract_state` reads it). `tx`: the run's optimizer when the caller
  built it (`startup.Start.optimizer`), else built here."""
  run = run_config.of(run)
  tx = optimizers.build(run, run.hparams).tx if tx is None else tx

  def init(seed=None):
    init.graphdef, params = nnx.split(init_model(run, seed), nnx.Param)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": tx.init(params), "last_losses": init_last_losses()}
  return init
