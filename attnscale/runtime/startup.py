"""One start-up for every program that runs a model: `start(config)`.

    s = startup.start(config)                        # train.py: read, task, mesh, shapes
    s = startup.start(config, devices=aot.devices(t), data=False)   # compile.py
    state = startup.init_state(s)                    # the initial state, into its shardings

What train.py, a packed sweep, compile.py, eval.py and the coordinate check each
need before their first program: the config read once (`attnscale.config.read`:
validated, typed; or given as a `RunConfig`), the task (its data loaded, or
without data for a compile), the device mesh, the optimizer and its schedule at
the run's numbers, the model's structure (graphdef) and the train state's shapes
and shardings, from one abstract initialisation (`train_state.abstract_state`). Everything that can be wrong with the config
fails here, before a run directory is touched or data is read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding

from attnscale import tasks
from attnscale.config import run as run_config
from attnscale.models import base as models_base
from attnscale.runtime import optimizers
from attnscale.runtime import train_state as ts


@dataclasses.dataclass(frozen=True)
class Start:
  """What a start builds once, for the programs it then compiles."""

  run: run_config.RunConfig
  task: tasks.Task
  mesh: jax.sharding.Mesh
  # The optimizer and schedule at the run's own numbers: the optimizer state's layout,
  # and a single run's step (a pack's step builds it from its traced numbers).
  optimizer: optimizers.Optimizer
  graphdef: nnx.GraphDef
  shapes: Any  # the train state as jax.ShapeDtypeStructs
  shardings: Any  # the train state's NamedShardings on `mesh`

  @property
  def batch_sharding(self) -> NamedSharding:
    return ts.batch_sharding(self.mesh)

  @property
  def attention_kernel(self) -> str:
    """The attention kernel the run's programs use on its mesh's platform ("native",
    "xla", "splash", "cudnn", ...): what its provenance records."""
    with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
      return models_base.attention_kernel(self.run.model)

  @property
  def layernorm_kernel(self) -> str:
    """The LayerNorm kernel the run's programs use ("native", "fused_xla", "xla")."""
    with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
      return models_base.layernorm_kernel(self.run.model)


def start(config, *, devices=None, mesh: jax.sharding.Mesh | None = None,
          data: bool = True, task: tasks.Task | None = None) -> Start:
  """Reads `config` and builds what its programs need (see the module docstring).

  Args:
    config: the run's ConfigDict (read and validated here for the devices), or
      a `RunConfig` already read.
    devices: the devices to run or compile for (default `jax.devices()`: a TPU
      slice's or GPUs' for compile.py, `aot.devices`).
    mesh: a mesh of those devices instead of the config's (eval.py's
      `train_state.evaluation_mesh`: a checkpoint evaluates on other devices).
    data: load the task's data (False: it traces the loss, makes no batches).
    task: the task, when the caller already built it (a pack's slots share one).

  Raises:
    ValueError: a bad config, or a parameter that config.mesh.fsdp cannot split
      (one line; before any device work).
  """
  devices = jax.devices() if devices is None else list(devices)
  run = (config if isinstance(config, run_config.RunConfig)
         else run_config.read(config, num_devices=len(devices)))
  if task is None:
    cls = tasks.task_class(run)
    task = cls(run) if data else cls.without_data(run)
  mesh = ts.make_mesh(run, devices) if mesh is None else mesh
  optimizer = optimizers.build(run, run.hparams)
  graphdef, shapes = ts.abstract_state(run, optimizer.tx)
  return Start(run, task, mesh, optimizer, graphdef, shapes, ts.state_shardings(shapes, mesh))


def init_state(s: Start):
  """The initial train state of `s.run`, initialised directly into its shardings
  (no device ever holds an unsharded copy)."""
  with ts.threefry_kernel_on_gpu():
    return jax.jit(ts.init_fn(s.run, s.optimizer.tx), out_shardings=s.shardings)()
