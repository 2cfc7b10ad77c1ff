r"""Packed training: K runs that share every shape, trained in one vmapped program.

    train_packed(configs, workdirs)
    python -m attnscale.runtime.packed --runs='[{"config": "configs/shakespeare_char.py:preset=test",
        "overrides": {"learning_rate": 0.004, "seed": 1}, "workdir": "runs/a"}, ...]'

(the command `sweep.py --pack=K` starts for each pack: `packing.command`).

A sweep's small models use a few percent of even one CPU core's vector units
(graphcore_cpu: 4 layers of width 64, 1,024 tokens a step), and well under 1% of
an accelerator. Small-model studies get their grids and seeds by training many
such models at once (Wortsman et al. 2023; muP's and u-muP's sweeps); in JAX that
is `jax.vmap` over the train state. `sweep.py --pack=K` runs its points so.

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

A run whose loss or gradient turns non-finite stops alone, as train.py would
(its metrics record the bad step; its last good checkpoint stays) and its slot is
masked: its state no longer changes and nothing of it is saved again. Ctrl-C and
SIGTERM save every running run at its step (exit 130 after Ctrl-C).

Equality with the unpacked run: vmap batches every product and reduction, which
XLA may evaluate in another order, and the traced hyperparameters round once more
(the cosine's 1 - alpha in float32 instead of float64): the same run packed and
alone agree to float32 rounding at first and drift apart as training amplifies it
(measured: docs/guides/sweeps.md, "Packing"; tests/test_packed.py).

Dimension legend: K runs of the pack (leading axis of every packed array).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attnscale import tasks
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import (
  configlib,
  hostmem,
  interrupts,
  metrics_writer,
  optimizers,
  packing,
  provenance,
  steps,
  train_lib,
)
from attnscale.runtime import train_state as ts
from attnscale.runtime.metrics_writer import MetricsWriter


@dataclasses.dataclass
class _Run:
  """One run of a pack: its config, directory, data, files and progress."""

  config: ml_collections.ConfigDict
  workdir: str
  task: tasks.Task
  checkpoints: ckpt.Checkpoints | None = None
  writer: MetricsWriter | None = None
  step: int = 0
  last_good: int | None = None
  status: str = "running"  # running | done | diverged
  pending: list = dataclasses.field(default_factory=list)  # host metrics since the last log
  summary: dict = dataclasses.field(default_factory=dict)
  start_time: float = 0.0

  @property
  def active(self) -> bool:
    """Still training: its slot's state changes and it logs, evaluates and saves."""
    return self.status == "running"


def train_packed(configs, workdirs, *, force_lock: bool = False) -> list[dict]:
  """Trains (or resumes) each config in its workdir, all in one vmapped program.

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
  for config in configs:
    configlib.validate(config, num_devices=jax.device_count())
    ts.model_config(config)
  packing.check_packable(configs)
  base = configs[0]
  mesh = ts.make_mesh(base)
  runs = [_Run(c, w, tasks.get_task(c)) for c, w in zip(configs, workdirs)]
  # Before any workdir: a parameter that config.mesh.fsdp cannot split fails here.
  shardings = ts.state_shardings(ts.state_shapes(base), mesh)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: ts.init_model(base)), nnx.Param)
  for run in runs:
    os.makedirs(run.workdir, exist_ok=True)
  with contextlib.ExitStack() as stack:
    locks = [stack.enter_context(train_lib._workdir_lock(r.workdir, force_lock)) for r in runs]
    for run in runs:
      train_lib.save_config(run.config, run.workdir)
    return _train(runs, graphdef, shardings, mesh, locks)


def _stacked_shardings(shardings, mesh):
  """Each leaf's layout with the pack's axis (unsharded) in front."""
  return jax.tree.map(lambda s: NamedSharding(mesh, P(None, *s.spec)), shardings)


def _train(runs: list[_Run], graphdef, shardings, mesh, locks) -> list[dict]:
  base = runs[0].config
  shardings_K = _stacked_shardings(shardings, mesh)
  try:
    # Every run's initial state at once: the init vmapped over the seeds (the only
    # field the init reads that may differ in a pack).
    init = ts.init_fn(base, optimizers.make_optimizer(base))
    seeds_K = jnp.asarray([optimizers.hparams(r.config)["seed"] for r in runs])
    with ts.threefry_kernel_on_gpu():  # GPU compile time: its docstring
      state_K = jax.jit(jax.vmap(init), out_shardings=shardings_K)(seeds_K)
    for k, run in enumerate(runs):
      run.checkpoints = ckpt.Checkpoints(run.workdir, run.config.keep_checkpoints)
      if run.checkpoints.latest_step() is not None:
        state = train_lib._resume(run.checkpoints, _slot(state_K, k), shardings, run.workdir)
        state_K = _put(state_K, k, state)
      run.step = int(state_K["step"][k])
      run.last_good = run.checkpoints.latest_step()
      elapsed = metrics_writer.value_at(run.workdir, "train/elapsed_s", run.step) or 0.0
      run.writer = MetricsWriter(run.workdir, resume_step=run.step)
      run.start_time = time.perf_counter() - elapsed
      if run.step >= run.config.num_train_steps:
        run.status = "done"
    for run in runs:  # after every resume, as train_lib's: which runs shared the program
      provenance.write(run.workdir, pack=[os.path.abspath(r.workdir) for r in runs],
                       **train_lib.provenance_imports(run.config))
    return _loop(runs, graphdef, state_K, shardings_K, mesh, locks)
  finally:
    for run in runs:
      if run.checkpoints is not None:
        run.checkpoints.close()
      if run.writer is not None:
        run.writer.close()


def _slot(state_K, k: int):
  """Run k's state, in the unpacked layout (what its checkpoints hold)."""
  return jax.tree.map(lambda x: x[k], state_K)


@functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
def _put(state_K, k: int, state):
  """`state_K` with run k's slot replaced by `state`."""
  return jax.tree.map(lambda X, x: X.at[k].set(x), state_K, state)


def _programs(task, base, graphdef, shardings_K, mesh):
  """The packed train step (and its attention-metrics twin, or None) and eval step,
  jitted for the stacked layouts, and the stacked batches' sharding."""
  batch_K = NamedSharding(mesh, P(None, ts.MESH_AXES))
  stats_on_logs = train_lib._stats_on_log_steps(base)

  def packed(attn_metrics):
    step_fn = steps.train_step_fn(graphdef, task, base, attn_metrics=attn_metrics)

    def train_step(state_K, batch_K, hparams_K, active_K):
      new_K, metrics_K = jax.vmap(step_fn)(state_K, batch_K, hparams_K)
      # A stopped run (finished or diverged) keeps its state: its slot still
      # computes (the program's shape is fixed), its results are dropped.
      keep = lambda new, old: jnp.where(active_K.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
      return jax.tree.map(keep, new_K, state_K), metrics_K

    return jax.jit(steps._under_mesh(mesh)(train_step),
                   in_shardings=(shardings_K, batch_K, None, None),
                   out_shardings=(shardings_K, None), donate_argnums=0)

  train_step = packed(False if stats_on_logs else None)
  log_step = packed(None) if stats_on_logs else None

  def eval_step(params_K, batch_K):
    return jax.vmap(lambda p, b: task.loss(nnx.merge(graphdef, p), b)[1])(params_K, batch_K)

  eval_step = jax.jit(steps._under_mesh(mesh)(eval_step),
                      in_shardings=(shardings_K["params"], batch_K))
  return train_step, log_step, eval_step, batch_K


def lower(config, num_runs: int, target_name: str):
  """The packed train step of `num_runs` runs of `config`, lowered for `target_name`
  (`aot.devices`: a TPU slice or GPUs this machine need not have), and what
  `aot._compile` needs of it; nothing is allocated. For the program train.py's
  unlogged steps run (`aot.lower_steps`' counterpart)."""
  from attnscale.runtime import aot
  devs = aot.devices(target_name)
  configlib.validate(config, num_devices=len(devs))
  task = tasks.task_class(config).without_data(config)
  mesh = ts.make_mesh(config, devs)
  shapes = ts.state_shapes(config)
  shardings_K = _stacked_shardings(ts.state_shardings(shapes, mesh), mesh)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: ts.init_model(config)), nnx.Param)
  train_step, _, _, batch_K = _programs(task, config, graphdef, shardings_K, mesh)
  stacked = lambda x, s: jax.ShapeDtypeStruct((num_runs, *x.shape), x.dtype, sharding=s)
  state_K = jax.tree.map(stacked, shapes, shardings_K)
  batch = {k: stacked(x, batch_K) for k, x in type(task).batch_spec(config).items()}
  hparams_K = {k: jax.ShapeDtypeStruct((num_runs,), np.asarray(v).dtype)
               for k, v in optimizers.hparams(config).items()}
  active_K = jax.ShapeDtypeStruct((num_runs,), np.bool_)
  lowered = train_step.lower(state_K, batch, hparams_K, active_K)
  return lowered, {"devices": devs, "model": ts.model_config(config), "state": state_K,
                   "train_batch": batch}


def _stack(batches):
  return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


def _loop(runs: list[_Run], graphdef, state_K, shardings_K, mesh, locks) -> list[dict]:
  """The training loop of `train_packed`: `train_lib._train`'s, for each run."""
  base = runs[0].config
  train_step, log_step, eval_step, batch_sharding = _programs(
      runs[0].task, base, graphdef, shardings_K, mesh)
  hparams_K = jax.tree.map(lambda *x: jnp.asarray(np.stack(x)),
                           *[optimizers.hparams(r.config) for r in runs])
  num_params = sum(x[0].size for x in jax.tree.leaves(state_K["params"]))
  train_lib.log(f"{base.task} | a pack of {len(runs)} runs | {num_params / 1e6:.2f}M params "
                f"each | {jax.device_count()} devices ({jax.devices()[0].platform})")
  for i, run in enumerate(runs):
    train_lib.log(f"  [{i}] {configlib.run_label(run.config)} | lr {run.config.learning_rate:g} "
                  f"| seed {run.config.seed} | {run.workdir} | "
                  f"{'done' if not run.active else f'from step {run.step}'}")
  pending, first, iteration, preempted = [], True, 0, False
  # Each run's speed interval: since its last log row (time, step), as train_lib's.
  ticks, tick_steps = [time.perf_counter()] * len(runs), [r.step for r in runs]
  last_batch = [None] * len(runs)  # a stopped run's slot reuses its last batch

  def release_all():
    for lock in locks:
      lock.release()

  with train_lib._Preemption(before_exit=release_all) as preemption:
    while any(r.active for r in runs):
      active = [r.active for r in runs]
      for k, run in enumerate(runs):
        if run.active or last_batch[k] is None:
          last_batch[k] = run.task.train_batch(min(run.step, run.config.num_train_steps - 1))
      batch = train_lib.global_batch(_stack(last_batch), batch_sharding)
      logged = log_step is not None and any(
          r.active and train_lib._logs(r.config, r.step + 1) for r in runs)
      active_K = jnp.asarray(active)
      if first:
        first, start = False, time.perf_counter()
        train_step = train_step.lower(state_K, batch, hparams_K, active_K).compile()
        if log_step is not None:
          log_step = log_step.lower(state_K, batch, hparams_K, active_K).compile()
        state_K, metrics = (log_step if logged else train_step)(state_K, batch, hparams_K,
                                                                 active_K)
        jax.block_until_ready(metrics)
        train_lib.log(f"compiled and ran the first step in {time.perf_counter() - start:.1f}s")
        hostmem.trim()  # the compiler's memory back to the kernel (attnscale/runtime/hostmem.py)
        # Speed excludes compilation: intervals start after the first step.
        ticks = [time.perf_counter()] * len(runs)
        tick_steps = [r.step + a for r, a in zip(runs, active)]
      else:
        state_K, metrics = (log_step if logged else train_step)(state_K, batch, hparams_K,
                                                                 active_K)
      iteration += 1
      for run in runs:
        run.step += run.active
      pending.append((metrics, active))
      preempted = preemption.reached(iteration)
      logs, saves, evals = [], [], []
      for k, run in enumerate(runs):
        if not run.active:
          continue
        done = run.step == run.config.num_train_steps
        save = done or preempted or run.step % run.config.checkpoint_every == 0
        if save or run.step % run.config.log_every == 0:
          logs.append(k)
        if save:
          saves.append(k)
        if done or run.step % run.config.eval_every == 0:
          evals.append(k)
      if logs:
        # Reading the metrics waits for the device: only when some run logs, and
        # always before a save, so that nothing non-finite is ever saved.
        host = jax.device_get([m for m, _ in pending])
        for metrics_K, (_, was_active) in zip(host, pending):
          for k, run in enumerate(runs):
            if was_active[k]:
              run.pending.append(jax.tree.map(lambda x, k=k: x[k], metrics_K))
        pending = []
        now = time.perf_counter()
        for k in logs:
          _log(runs[k], k, now, ticks[k], tick_steps[k])
          ticks[k], tick_steps[k] = now, runs[k].step
        _progress(runs, logs)
        hostmem.trim()  # what this interval's programs freed: attnscale/runtime/hostmem.py
      evals = [k for k in evals if runs[k].active]
      if evals:
        start = time.perf_counter()
        _evaluate(runs, evals, eval_step, state_K["params"], batch_sharding)
        hostmem.trim()
        spent = time.perf_counter() - start  # validation time is not training speed
        ticks = [t + spent for t in ticks]
      for k in saves:
        run = runs[k]
        if not run.active:  # diverged in this interval: its last good checkpoint stays
          continue
        run.writer.flush()
        run.checkpoints.save(run.step, _slot(state_K, k))
        run.last_good = run.step
        if run.step == run.config.num_train_steps:
          run.status = "done"
      if saves:
        hostmem.trim()
      if preempted:
        what = "Ctrl-C" if preemption.interrupted else "SIGTERM"
        train_lib.log(f"{what}: saved a checkpoint of every running run of the pack (steps "
                      f"{sorted({runs[k].step for k in saves})}); rerunning the same command "
                      "resumes them")
        break
    for run in runs:  # the last saves, under the handler: Checkpoints.wait
      if run.checkpoints is not None:
        run.checkpoints.wait()
  if preempted and preemption.interrupted:
    raise interrupts.Interrupted("Ctrl-C: saved a checkpoint of every running run of the pack")
  return [{"step": r.step, "status": r.status, **r.summary} for r in runs]


def _log(run: _Run, k: int, now: float, tick: float, tick_step: int) -> None:
  """Writes `run`'s log row from its pending metrics; a non-finite one stops it."""
  try:
    summary = train_lib._summarise(run.pending, run.step, run.last_good, run.workdir)
  except train_lib.NonFiniteLossError as e:  # on record: sweeps read the run as diverged
    run.writer.write(e.record["step"], {f"train/{k}": e.record[k] for k in ("loss", "grad_norm")})
    run.writer.flush()
    run.status, run.pending = "diverged", []
    print(f"run [{k}] {run.workdir}: {e}", file=sys.stderr, flush=True)
    return
  summary.update({"loss_last20": ts.mean_last_losses(run.pending[-1]["last_losses"]),
                  "elapsed_s": now - run.start_time})
  if run.step > tick_step:
    steps_per_s = (run.step - tick_step) / (now - tick)
    summary.update({"steps_per_s": steps_per_s,
                    "tokens_per_s": steps_per_s * run.task.tokens_per_batch})
  run.writer.write(run.step, {f"train/{k}": v for k, v in summary.items()}
                   | train_lib.attention_health_row(run.pending))
  run.summary.update(summary)
  run.pending = []


def _progress(runs: list[_Run], logs: list[int]) -> None:
  """One line for the runs that just logged: their step, losses and the pack's speed."""
  logged = [runs[k] for k in logs if runs[k].status != "diverged"]
  if not logged:
    return
  steps = sorted({r.step for r in logged})
  losses = " ".join(f"{r.summary['loss']:.3f}" for r in logged)
  speed = logged[0].summary.get("steps_per_s")
  speed = f" | {speed:.2f} steps/s x {len(runs)} runs" if speed else ""
  train_lib.log(f"step {'/'.join(map(str, steps))}/{logged[0].config.num_train_steps} | "
                f"loss {losses}{speed}")


def _evaluate(runs: list[_Run], evals: list[int], eval_step, params_K, batch_sharding) -> None:
  """Validation loss of the runs in `evals` (one packed pass serves them all)."""
  num = max(runs[k].config.eval_batches for k in evals)
  totals = [{} for _ in runs]
  for i in range(num):
    batch = _stack([r.task.val_batch(i) for r in runs])
    sums = jax.device_get(eval_step(params_K, train_lib.global_batch(batch, batch_sharding)))
    for k in evals:
      if i < runs[k].config.eval_batches:
        for name, v in sums.items():
          totals[k][name] = totals[k].get(name, 0.0) + float(v[k])
  for k in evals:
    val = totals[k].get("loss_sum", 0.0) / max(totals[k].get("count", 0.0), 1.0)
    runs[k].summary["val_loss"] = val
    runs[k].writer.write(runs[k].step, {"val/loss": val})
  train_lib.log(f"step {'/'.join(sorted({str(runs[k].step) for k in evals}))} | val loss "
                + " ".join(f"{runs[k].summary['val_loss']:.4f}" for k in evals))


# ---------------------------------------------------------------------------
# The command line sweep.py starts for a pack.

def main(argv) -> None:
  from absl import flags

  from attnscale.runtime import cli
  del argv
  try:
    specs = json.loads(flags.FLAGS.runs)
    configs = [packing.load_config(s["config"], s.get("overrides", {})) for s in specs]
    for s in specs:
      cli.check_workdir(s["workdir"])
    results = train_packed(configs, [s["workdir"] for s in specs],
                           force_lock=flags.FLAGS.force_lock)
  except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
    cli.fail(str(e))
  except interrupts.Interrupted:
    sys.exit(130)
  except KeyboardInterrupt:  # start-up or compilation: nothing to save
    cli.stop_after_early_ctrl_c("from the last checkpoints on disk")
  diverged = [s["workdir"] for s, r in zip(specs, results) if r["status"] == "diverged"]
  if diverged:
    cli.fail(f"{len(diverged)} of {len(specs)} runs of the pack stopped on a non-finite loss: "
             + ", ".join(diverged))


if __name__ == "__main__":
  from absl import app, flags, logging

  from attnscale.runtime import cli, hostmem
  flags.DEFINE_string("runs", None, "The pack's runs as JSON: a list of {\"config\": "
                      "\"FILE:ARG\", \"overrides\": {field: value}, \"workdir\": DIR}.")
  flags.DEFINE_bool("force_lock", False, "Take every run's LOCK whoever holds it.")
  flags.mark_flags_as_required(["runs"])
  logging.set_verbosity(logging.WARNING)
  try:
    hostmem.reexec_with_tunables()  # as train.py: attnscale/runtime/hostmem.py
  except ValueError as e:
    sys.exit(f"error: {e}")
  app.run(main, flags_parser=cli.parse_flags)
