r"""Packed training: R runs that share every shape, trained in one vmapped program.

    train_packed(configs, workdirs, pack_size=R)
    python train.py --pack_size=R \
        --runs='[{"config": "configs/shakespeare_char.py:preset=test",
        "overrides": {"learning_rate": 0.004, "seed": 1}, "workdir": "runs/a"}, ...]'

(train.py's command line with --runs: what `sweep.py --pack=R` starts for each pack,
`packing.command`).

A sweep's small models use a few percent of even one CPU core's vector units
(graphcore_cpu: 4 layers of width 64, 1,024 tokens a step), and well under 1% of
an accelerator. Small-model studies get their grids and seeds by training many
such models at once (Wortsman et al. 2023; muP's and u-muP's sweeps); in JAX that
is `jax.vmap` over the train state. `sweep.py --pack=R` runs its points so.

What may differ between the runs of a pack, and how a sweep groups its points
into packs: attnscale/runtime/packing.py (seed, learning rates, weight decay,
clipping thresholds and bookkeeping; everything else makes the program).

Each run is what `train.py` would make of its config, in its own directory:
config.json, metrics.jsonl (attention health included), TensorBoard events, orbax
checkpoints of its own state (the unpacked layout, so train.py and eval.py read and
resume it as any run) and LOCK (all of the pack's directories are locked before
any is touched). Parameters, optimizer state, the loss window, data order (each
run's task gives its own batch of its own step) and dropout keys are per run; so
is the step: runs resumed from different checkpoints go on together.

The loop is train.py's (`attnscale.runtime.loop`: logs, evaluation, checkpoints,
preemption, the non-finite stop, each run on its own config's cadence); this module
holds only what is particular to packing: `Pack`, the R-slot program (the train
step vmapped over the stacked state with each run's traced hyperparameters and an
active mask), the stacked initialisation and resume, and the command line. A run
whose loss or gradient turns non-finite stops alone, as train.py would (its
metrics record the bad step; its last good checkpoint stays) and its slot is
masked: its state no longer changes and nothing of it is saved again. Ctrl-C and
SIGTERM save every running run at its step (exit 130 after Ctrl-C).

A run is the same run in any pack of one size: vmap keeps the slots apart, so a
run's numbers do not depend on its pack-mates, only on R (tests/test_packed.py).
A sweep therefore trains every point at its pack size R: a short last pack (or a
point resumed alone) gets padding slots, which compute and write nothing, and each
run's provenance records R and its slot (`provenance.write`).

Equality with the unpacked run: vmap batches every product and reduction, which
XLA may evaluate in another order, and the traced hyperparameters round once more
(the cosine's 1 - alpha in float32 instead of float64): the same run packed and
alone agree to float32 rounding at first and drift apart as training amplifies it
(measured: docs/guides/sweeps.md, "Packing"; tests/test_packed.py).

Dimension legend: R runs of the pack (leading axis of every packed array).
"""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attnscale import tasks
from attnscale.config import run as run_config
from attnscale.runtime import (
  loop,
  packing,
  provenance,
  rundir,
  startup,
  steps,
)
from attnscale.runtime import train_state as ts
from attnscale.tasks import losses


def train_packed(configs, workdirs, *, pack_size: int | None = None,
                 force_lock: bool = False) -> list[dict]:
  """Trains (or resumes) each config in its workdir, all in one vmapped program.

  `pack_size`: the program's number of slots R (default: one per config); the
  slots past the configs are padding (masked: computed, never written), so a
  sweep's short last pack trains as its full ones do.

  Returns:
    Each run's final metrics ("step", "status": done | diverged, the last
    summary), in order.

  Raises:
    ValueError: a bad config, runs that cannot share a program, a workdir of
      another experiment, or a checkpoint that cannot be read (one line each;
      nothing is touched when the configs are at fault).
    run_lock.LockedError: a run's directory is in use (nothing is touched).
    Interrupted: Ctrl-C, after every running run saved a checkpoint.
  """
  if len(configs) != len(workdirs) or len(set(map(os.path.abspath, workdirs))) != len(workdirs):
    raise ValueError("train_packed needs one distinct workdir per config")
  pack_size = len(configs) if pack_size is None else pack_size
  if not isinstance(pack_size, int) or pack_size < len(configs):
    raise ValueError(f"the pack size must be an integer >= the {len(configs)} runs of the "
                     f"pack, got {pack_size!r}")
  runs = [run_config.read(c, num_devices=jax.device_count()) for c in configs]
  if any(r.init_from for r in runs):  # one run's start (train_lib), not a pack's
    raise ValueError("config.init_from starts one run (train.py); a packed sweep's runs "
                     "start fresh: sweep without --pack")
  packing.check_packable(configs)
  # Before any workdir: a bad config, or a parameter that config.mesh.fsdp cannot
  # split, fails here. The data is loaded once for the runs that read the same.
  s = startup.start(runs[0])
  loaded = {(s.run.dataset, s.run.data_dir): s.task}
  slots = []
  for r, w in zip(runs, workdirs):
    task = loaded.get((r.dataset, r.data_dir))
    task = task.for_run(r) if task is not None else tasks.task_class(r)(r)
    loaded.setdefault((r.dataset, r.data_dir), task)
    slots.append(loop.Slot(r, w, task))
  slots += [loop.Slot.padding(slots[-1]) for _ in range(pack_size - len(slots))]
  for run in slots[:len(runs)]:
    os.makedirs(run.workdir, exist_ok=True)
  with contextlib.ExitStack() as stack:
    locks = [stack.enter_context(rundir.workdir_lock(w, force_lock)) for w in workdirs]
    for config, workdir in zip(configs, workdirs):
      rundir.save_config(config, workdir)
    try:
      return _train(slots, s, locks)
    finally:
      for slot in slots:
        slot.close()


def _stacked_shardings(shardings, mesh):
  """Each leaf's layout with the pack's axis (unsharded) in front."""
  return jax.tree.map(lambda s: NamedSharding(mesh, P(None, *s.spec)), shardings)


def stacked_hparams(runs) -> dict[str, jax.Array]:
  """The runs' `RunConfig.hparams` as arrays [R]: the seed as int32 (what
  `jax.random.key` makes of a Python int), the rest as float32 (what a Python
  float becomes where it meets a float32 array)."""
  return {k: jnp.asarray(np.asarray([r.hparams[k] for r in runs],
                                    np.int32 if k == "seed" else np.float32))
          for k in packing.TRACED_FIELDS}


def _train(slots: list[loop.Slot], start: startup.Start, locks) -> list[dict]:
  base, shardings, mesh = start.run, start.shardings, start.mesh
  shardings_R = _stacked_shardings(shardings, mesh)
  # Every slot's initial state at once: the init vmapped over the seeds (the only
  # field the init reads that may differ in a pack).
  init = ts.init_fn(base, start.optimizer.tx)
  hparams_R = stacked_hparams([s.run for s in slots])
  with ts.threefry_kernel_on_gpu():  # GPU compile time: its docstring
    state_R = jax.jit(jax.vmap(init), out_shardings=shardings_R)(hparams_R["seed"])
  real = [s for s in slots if s.status != "padding"]
  for k, slot in enumerate(real):
    state = slot.open(_slot(state_R, k), shardings)
    if slot.last_good is not None:  # resumed from its checkpoint
      state_R = _put(state_R, k, state)
  for k, slot in enumerate(real):  # after every resume: which runs shared the program
    provenance.write(slot.workdir, pack=[os.path.abspath(r.workdir) for r in real],
                     pack_size=len(slots), slot=k, attention_kernel=start.attention_kernel,
                     layernorm_kernel=start.layernorm_kernel,
                     **rundir.provenance_imports(slot.config))
  program = Pack(slots[0].task, base, start.graphdef, shardings_R, mesh, hparams_R)
  num_params = sum(x[0].size for x in jax.tree.leaves(state_R["params"]))
  padding = f" (+{len(slots) - len(real)} padding)" if len(slots) > len(real) else ""
  rundir.log(f"{base.task} | a pack of {len(real)} runs{padding} | "
             f"{num_params / 1e6:.2f}M params each | {jax.device_count()} devices "
             f"({jax.devices()[0].platform})")
  for i, slot in enumerate(real):
    rundir.log(f"  [{i}] {slot.run.run_label} | lr {slot.run.learning_rate:g} "
               f"| seed {slot.run.seed} | {slot.workdir} | "
               f"{'done' if not slot.active else f'from step {slot.step}'}")
  loop.train(program, slots, state_R, release=lambda: [lock.release() for lock in locks])
  return [{"step": s.step, "status": s.status, **s.summary} for s in real]


def _slot(state_R, k: int):
  """Run k's state, in the unpacked layout (what its checkpoints hold)."""
  return jax.tree.map(lambda x: x[k], state_R)


@functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
def _put(state_R, k: int, state):
  """`state_R` with run k's slot replaced by `state`."""
  return jax.tree.map(lambda X, x: X.at[k].set(x), state_R, state)


def _stack(batches):
  return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


class Pack:
  """The loop's `Program` for R runs: the train step vmapped over the stacked state,
  with each slot's traced hyperparameters (`hparams_R`) and an active mask."""

  def __init__(self, task, run: run_config.RunConfig, graphdef, shardings_R, mesh, hparams_R):
    self.task, self.hparams_R = task, hparams_R
    self.batch_sharding = NamedSharding(mesh, P(None, ts.MESH_AXES))
    stats_on_logs = loop.attn_stats_on_log_steps(run)

    def packed(attn_metrics):
      step_fn = steps.train_step_fn(graphdef, task, run, attn_metrics=attn_metrics)

      def train_step(state_R, batch_R, hparams_R, active_R):
        new_R, metrics_R = jax.vmap(step_fn)(state_R, batch_R, hparams_R)
        # A stopped slot (finished, diverged or padding) keeps its state: it still
        # computes (the program's shape is fixed), its results are dropped.
        keep = lambda new, old: jnp.where(active_R.reshape((-1,) + (1,) * (new.ndim - 1)),
                                          new, old)
        return jax.tree.map(keep, new_R, state_R), metrics_R

      return jax.jit(steps.under_mesh(mesh)(train_step),
                     in_shardings=(shardings_R, self.batch_sharding, None, None),
                     out_shardings=(shardings_R, None), donate_argnums=0)

    self.train_step = packed(False if stats_on_logs else None)
    self.log_step = packed(None) if stats_on_logs else None
    self.has_log_step = self.log_step is not None

    def eval_step(params_R, batch_R):
      return jax.vmap(lambda p, b: task.loss(nnx.merge(graphdef, p), b)[1])(params_R, batch_R)

    self.eval_step = jax.jit(steps.under_mesh(mesh)(eval_step),
                             in_shardings=(shardings_R["params"], self.batch_sharding))
    self.layer_stats_fn = steps.make_layer_stats(graphdef, task, run, mesh, packed=True)

  def batch(self, host_batches):
    return steps.global_batch(_stack(host_batches), self.batch_sharding)

  def compile(self, state_R, batch, active):
    active_R = jnp.asarray(active)
    self.train_step = self.train_step.lower(state_R, batch, self.hparams_R, active_R).compile()
    if self.log_step is not None:
      self.log_step = self.log_step.lower(state_R, batch, self.hparams_R, active_R).compile()

  def step(self, state_R, batch, active, logged):
    return (self.log_step if logged else self.train_step)(state_R, batch, self.hparams_R,
                                                          jnp.asarray(active))

  def slot_metrics(self, metrics_R, k):
    return jax.tree.map(lambda x: x[k], metrics_R)

  def layer_stats(self, state_R, batch):
    return (None if self.layer_stats_fn is None
            else self.layer_stats_fn(state_R["params"], batch))

  def evaluate(self, state_R, slots, ks):
    """One packed pass serves every slot; each adds only its own eval_batches."""
    num = max(slots[k].config.eval_batches for k in ks)
    totals = {k: {} for k in ks}
    for i in range(num):
      batch = _stack([s.task.val_batch(i) for s in slots])
      sums = jax.device_get(self.eval_step(state_R["params"],
                                           steps.global_batch(batch, self.batch_sharding)))
      for k in ks:
        if i < slots[k].config.eval_batches:
          mine = {name: float(v[k]) for name, v in sums.items()}
          totals[k] = losses.add_sums(totals[k], mine) if totals[k] else mine
    return {k: totals[k].get("loss_sum", 0.0) / max(totals[k].get("count", 0.0), 1.0)
            for k in ks}

  def slot_state(self, state_R, k):
    return _slot(state_R, k)


def lower(config, num_runs: int, target_name: str):
  """The packed train step of `num_runs` runs of `config`, lowered for `target_name`
  (`aot.devices`: a TPU slice or GPUs this machine need not have), and what
  `aot._compile` needs of it; nothing is allocated. For the program train.py's
  unlogged steps run (`aot.lower_steps`' counterpart)."""
  from attnscale.runtime import aot
  devs = aot.devices(target_name)
  s = startup.start(config, devices=devs, data=False)
  run, task, mesh, shapes = s.run, s.task, s.mesh, s.shapes
  shardings_R = _stacked_shardings(s.shardings, mesh)
  hparams_R = {k: jax.ShapeDtypeStruct((num_runs,), v.dtype)
               for k, v in stacked_hparams([run]).items()}
  program = Pack(task, run, s.graphdef, shardings_R, mesh, hparams_R)
  stacked = lambda x, s: jax.ShapeDtypeStruct((num_runs, *x.shape), x.dtype, sharding=s)
  state_R = jax.tree.map(stacked, shapes, shardings_R)
  batch = {k: stacked(x, program.batch_sharding)
           for k, x in type(task).batch_spec(run).items()}
  active_R = jax.ShapeDtypeStruct((num_runs,), np.bool_)
  lowered = program.train_step.lower(state_R, batch, hparams_R, active_R)
  return lowered, {"devices": devs, "model": run.model, "state": state_R,
                   "train_batch": batch}
