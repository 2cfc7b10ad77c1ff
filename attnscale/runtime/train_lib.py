"""The training loop behind train.py: jit-compiled, data parallel, resumable.

    train_and_evaluate(config, workdir)

* One jitted train step with donated state over a `data` x `fsdp` mesh of all
  devices of all processes (`config.mesh`; `train_state` shards the state).
* Auto-resume from the latest orbax checkpoint in WORKDIR (state, data position
  and RNG: all three are functions of the saved step), periodic and final saves,
  and a save on SIGTERM (preemption) or Ctrl-C, at one step that every process
  agrees on when there are several (`attnscale.runtime.interrupts`). After a hard kill
  (SIGKILL, a lost node) the rerun supersedes what the killed process logged
  past that checkpoint (`MetricsWriter(resume_step=...)`), so each step is
  logged once. A checkpoint that cannot be read (a truncated file) is set aside
  and the run resumes from the newest one that can (`_resume`).
* WORKDIR/LOCK while the run writes there (`attnscale.runtime.run_lock`): a second
  run on the same directory stops at start, naming the first.
* TensorBoard event files, metrics.jsonl and the resolved config.json in WORKDIR,
  a progress line with loss, steps/s and tokens/s, periodic validation loss:
  written and printed by process 0 only (the values are global). Every process
  writes its shards of each checkpoint (orbax), so WORKDIR must be shared.
  Each log also records `loss_last20` (the mean loss of the run's last 20 steps:
  Graphcore's final-loss metric; the window is part of the checkpointed state)
  and `elapsed_s` (training seconds since the run started, continued across
  resumes from the restored step's value), which the sweep tables read.
* A NaN or inf loss (or gradient) stops the run before anything non-finite is
  saved: the last good checkpoint stays.

The steps themselves live in `attnscale.runtime.steps`; their names are re-exported
here (`train_lib.make_train_step`, ...) for the callers that use them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from attnscale import tasks
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import (
  configlib,
  hostmem,
  interrupts,
  metrics_writer,
  optimizers,
  profiling,  # PROFILER (#64)
  provenance,
  run_lock,
)
from attnscale.runtime import train_state as ts
from attnscale.runtime.metrics_writer import MetricsWriter

# Re-exported: tests, notebooks and benchmarks reach the steps through train_lib.
from attnscale.runtime.steps import (  # noqa: F401
  dropout_key,
  evaluate,
  evaluate_sums,
  global_batch,
  make_eval_step,
  make_train_step,
)

# Fields that may change when a run resumes (bookkeeping, not the experiment):
# attnscale/runtime/configlib.py says which and why.
RESUMABLE_CHANGES = configlib.RESUMABLE_CHANGES


LAST_LOSSES = ts.LAST_LOSSES  # Graphcore's final training loss: the mean of the last 20 steps


class NonFiniteLossError(RuntimeError):
  """The loss or gradient became NaN/inf; nothing after the last good step was saved.

  `record`: the bad step's {"step", "loss", "grad_norm"}, which the loop writes
  to the metrics before stopping, so the run reads as diverged afterwards.
  """

  def __init__(self, message: str, record: dict | None = None):
    super().__init__(message)
    self.record = record or {}


def log(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, flush=True)


def save_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes WORKDIR/config.json; refuses to resume a run with another experiment.

  Raises:
    ValueError: the workdir holds a run whose config differs in a field that is
      not bookkeeping (the message lists them). Nothing in WORKDIR is touched.
  """
  path = os.path.join(workdir, "config.json")
  new = json.loads(config.to_json())
  if os.path.exists(path):
    with open(path) as f:
      old = configlib.migrate(json.load(f))  # a run saved before a rename or a new field
    resumable = RESUMABLE_CHANGES + (
        ("num_train_steps",) if config.lr_schedule == "constant" else ())
    diffs = [f"{k}: {old_v!r} -> {new_v!r}" for k, old_v, new_v in configlib.flat_diff(old, new)
             if k.split(".")[0] not in resumable]
    if diffs:
      raise ValueError(f"--workdir {workdir} holds a run with a different config "
                       f"({'; '.join(diffs)}): use a new --workdir to start another run")
  if jax.process_index() == 0:
    with open(path + ".tmp", "w") as f:
      json.dump(new, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


# The loop's signal handling (SIGTERM, Ctrl-C): attnscale/runtime/interrupts.py.
_Preemption = interrupts.Preemption
Interrupted = interrupts.Interrupted


@contextlib.contextmanager
def _workdir_lock(workdir: str, force: bool):
  """Holds WORKDIR/LOCK for the run (`attnscale.runtime.run_lock`); yields the lock.

  Process 0 takes it for all; if it cannot, every process stops (the others
  with a line pointing to process 0's error).

  Raises:
    run_lock.LockedError: another run holds the lock (one line, naming it).
  """
  lock, error = run_lock.RunLock(workdir, force=force, note=log), None
  if jax.process_index() == 0:
    try:
      lock.acquire()
    except run_lock.LockedError as e:
      error = e
  if jax.process_count() > 1:
    taken = multihost_utils.broadcast_one_to_all(np.int32(error is None))
    if not taken and error is None:
      error = run_lock.LockedError(f"process 0 could not lock --workdir {workdir} "
                                   "(its error says why)")
  if error is not None:
    raise error
  try:
    yield lock
  finally:
    lock.release()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       force_lock: bool = False) -> dict[str, float]:
  """Trains (or resumes) the run in `workdir`; returns the final metrics.

  `force_lock`: take WORKDIR/LOCK whoever holds it (train.py's --force_lock).

  Raises:
    Interrupted: Ctrl-C stopped the run, after saving a checkpoint.
    run_lock.LockedError: another run holds WORKDIR/LOCK (nothing is touched).
    ValueError: a bad config, another experiment's workdir, or no checkpoint
      that can be read (one line each).
    NonFiniteLossError: the loss became NaN/inf.
  """
  # Everything that can be wrong with the config fails here, before the
  # workdir is created or touched.
  configlib.validate(config, num_devices=jax.device_count())
  ts.model_config(config)
  task = tasks.get_task(config)
  mesh = ts.make_mesh(config)
  batch_sharding = ts.batch_sharding(mesh)
  tx = optimizers.make_optimizer(config)  # the one optimizer: its state and its updates
  # Before the workdir: a parameter that config.mesh.fsdp cannot split fails here.
  graphdef, state, shardings = ts.create_state(config, mesh, tx)
  os.makedirs(workdir, exist_ok=True)
  with _workdir_lock(workdir, force_lock) as lock:
    save_config(config, workdir)
    return _train(config, workdir, task, mesh, batch_sharding, tx, graphdef, state,
                  shardings, lock)


def provenance_imports(config) -> dict:
  """The "imports" field of a run's provenance record ({} without config.imports)."""
  files = configlib.import_files(config)
  return {"imports": files} if files else {}


def _resume(checkpoints: ckpt.Checkpoints, state: ts.State, shardings, workdir: str):
  """`state` from the newest checkpoint that can be read (unchanged if none).

  Newer ones that cannot be read are set aside (`Checkpoints.set_aside`: moved
  to WORKDIR/damaged_checkpoints, not deleted), with one warning line.
  """
  if checkpoints.latest_step() is None:
    return state
  state, step, damaged = checkpoints.restore_newest_intact(state, shardings)
  for error in damaged:
    checkpoints.set_aside(error.step)
  if damaged:
    log(f"warning: {ckpt.describe_damaged(damaged)}; resuming from step {step}; the "
        f"damaged files are kept in {os.path.join(workdir, ckpt.DAMAGED_DIR)}")
  log(f"resumed from {workdir} at step {step}")
  if int(state["last_losses"]["count"]) == 0:
    log("  (the checkpoint predates the saved loss window: loss_last20 averages "
        "only the steps from here on)")
  return state


def _train(config, workdir, task, mesh, batch_sharding, tx, graphdef, state, shardings,
           lock: run_lock.RunLock) -> dict[str, float]:
  """The training loop of `train_and_evaluate`, in its locked workdir."""
  checkpoints = ckpt.Checkpoints(workdir, config.keep_checkpoints)
  try:
    state = _resume(checkpoints, state, shardings, workdir)
  except BaseException:
    checkpoints.close()
    raise
  # Which code, versions and devices: one record a (re)start that trains (after the
  # resume, so a run that cannot resume leaves its directory as it was), with the
  # files of config.imports, which eval.py imports again from any folder.
  provenance.write(workdir, **provenance_imports(config))
  train_step = make_train_step(graphdef, task, config, shardings, batch_sharding, tx=tx,
                               attn_metrics=False if _stats_on_log_steps(config) else None)
  # The attention metrics cost ~10% of a step (the kernel's extra row reductions):
  # without QK-clip (which needs them every step) only the logged steps compute them,
  # in a second program compiled with the first, so every other step runs the
  # plain one and the interval's speed excludes the compilation.
  log_step = (make_train_step(graphdef, task, config, shardings, batch_sharding, tx=tx)
              if _stats_on_log_steps(config) else None)
  eval_step = make_eval_step(graphdef, task, shardings["params"], batch_sharding)
  step = int(state["step"])
  # What a killed process logged after this checkpoint never happened: the
  # writer drops it, and the running time continues from the checkpoint's row.
  elapsed_before = metrics_writer.value_at(workdir, "train/elapsed_s", step) or 0.0
  writer = MetricsWriter(workdir, resume_step=step)
  num_params = sum(x.size for x in jax.tree.leaves(state["params"]))
  processes = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
  fsdp = f", fsdp {mesh.shape['fsdp']}" if mesh.shape["fsdp"] > 1 else ""
  log(f"{config.task} | {configlib.run_label(config)} | {num_params / 1e6:.2f}M params | "
      f"{jax.device_count()} devices{processes} ({jax.devices()[0].platform}{fsdp}) | "
      f"workdir {workdir}")

  last_good = checkpoints.latest_step()
  start_time = time.perf_counter() - elapsed_before
  pending, summary, first_step, preempted = [], {}, True, False
  tick, tick_step = time.perf_counter(), step
  try:
    with _Preemption(before_exit=lock.release) as preemption:
      while step < config.num_train_steps:
        profiling.at_step(config, workdir, step, state)  # PROFILER (#64): config.profile_steps
        batch = global_batch(task.train_batch(step), batch_sharding)
        logged = log_step is not None and _logs(config, step + 1)
        if first_step:  # report compile time (target: < 10 s for the cpu preset)
          first_step = False
          compile_start = time.perf_counter()
          if log_step is not None:  # compiled now, run as the Compiled object
            log_step = log_step.lower(state, batch).compile()
          state, metrics = (log_step if logged else train_step)(state, batch)
          jax.block_until_ready(metrics)
          log(f"step {step + 1}: compiled and ran in {time.perf_counter() - compile_start:.1f}s")
          hostmem.trim()  # the compiler's memory back to the kernel (attnscale/runtime/hostmem.py)
          tick, tick_step = time.perf_counter(), step + 1  # speed excludes compilation
        else:
          state, metrics = (log_step if logged else train_step)(state, batch)
        step += 1
        pending.append(metrics)
        done = step == config.num_train_steps
        # Asked once: a SIGTERM arriving later in this iteration is handled
        # (saved, then exit) at the next one, never exit-without-save.
        preempted = preemption.reached(step)
        save = done or preempted or step % config.checkpoint_every == 0
        if save or step % config.log_every == 0:
          # Reading the metrics waits for the device; do it only here, and
          # always before a save so that nothing non-finite is ever saved.
          pending = jax.device_get(pending)
          try:
            summary = _summarise(pending, step, last_good, workdir)
          except NonFiniteLossError as e:  # on record: sweeps read the run as diverged
            writer.write(e.record["step"], {f"train/{k}": e.record[k]
                                            for k in ("loss", "grad_norm")})
            raise
          summary.update({"loss_last20": ts.mean_last_losses(pending[-1]["last_losses"]),
                          "elapsed_s": time.perf_counter() - start_time})
          speed = ""
          if step > tick_step:  # else only the (compiling) first step ran
            steps_per_s = (step - tick_step) / (time.perf_counter() - tick)
            summary.update({"steps_per_s": steps_per_s,
                            "tokens_per_s": steps_per_s * task.tokens_per_batch})
            speed = (f" | {steps_per_s:.2f} steps/s | "
                     f"{summary['tokens_per_s'] / 1e3:.1f}k tok/s")
          writer.write(step, {f"train/{k}": v for k, v in summary.items()}
                       | attention_health_row(pending))
          log(f"step {step}/{config.num_train_steps} | loss {summary['loss']:.4f} | "
              f"lr {summary['lr']:.2e}{speed}")
          hostmem.trim()  # what this interval's programs freed: attnscale/runtime/hostmem.py
          pending, tick, tick_step = [], time.perf_counter(), step
        if done or step % config.eval_every == 0:
          val = evaluate(eval_step, state["params"],
                         (task.val_batch(i) for i in range(config.eval_batches)),
                         batch_sharding)
          summary["val_loss"] = val
          writer.write(step, {"val/loss": val})
          log(f"step {step} | val loss {val:.4f}")
          hostmem.trim()
          tick = time.perf_counter()  # validation time is not training speed
        if save:
          # Events up to a checkpoint reach the disk with it: a later hard kill
          # loses only what the rerun supersedes anyway.
          writer.flush()
          checkpoints.save(step, state)
          hostmem.trim()
          last_good = step
        if preempted:
          if preemption.interrupted:
            log(f"Ctrl-C: saved a checkpoint at step {step} in {workdir}; rerunning "
                "the same command resumes from it")
          else:
            log(f"SIGTERM: saved a checkpoint at step {step} in {workdir}; exiting")
          break
      checkpoints.wait()  # the last save, under the handler: Checkpoints.wait
  finally:
    checkpoints.close()
    writer.close()
  if preempted and preemption.interrupted:
    raise Interrupted(f"Ctrl-C: saved a checkpoint at step {step} in {workdir}")
  return {"step": step, **summary}


def _stats_on_log_steps(config) -> bool:
  """Attention metrics on, QK-clip off: the stats only on the logged steps."""
  return bool(config.get("attn_metrics", False)) and not config.get("qk_clip", 0.0)


def _logs(config, step: int) -> bool:
  """Whether the loop writes a log row after `step` (preemption aside: a row
  written on a SIGTERM has no attention entries)."""
  return (step % config.log_every == 0 or step == config.num_train_steps
          or step % config.checkpoint_every == 0)


def attention_health_row(metrics: list[dict]) -> dict[str, float | list[float]]:
  """The attention-health entries of a log row ({} when the step computes none).

  Values of the log step's own forward pass (a snapshot, not a mean over the
  interval), per layer i: train/attn/max_logit/layer_<i> (max over heads) and
  train/attn/entropy/layer_<i> (mean over heads), to TensorBoard and metrics.jsonl;
  train/attn/max_logit_heads/layer_<i> and train/attn/entropy_heads/layer_<i>
  (lists, one per query head) to metrics.jsonl only; with QK-clip,
  train/attn/clipped_heads: the head rescalings summed over the interval.
  """
  last, row = metrics[-1], {}
  if "attn_max_logit" in last:
    for i, (max_N, entropy_N) in enumerate(zip(np.asarray(last["attn_max_logit"]),
                                               np.asarray(last["attn_entropy"]))):
      row[f"train/attn/max_logit/layer_{i}"] = float(np.max(max_N))
      row[f"train/attn/entropy/layer_{i}"] = float(np.mean(entropy_N))
      row[f"train/attn/max_logit_heads/layer_{i}"] = [float(x) for x in max_N]
      row[f"train/attn/entropy_heads/layer_{i}"] = [float(x) for x in entropy_N]
  if "attn_clipped_heads" in last:
    row["train/attn/clipped_heads"] = int(sum(int(m["attn_clipped_heads"]) for m in metrics))
  return row


def _summarise(metrics: list[dict], step: int, last_good: int | None, workdir: str):
  """Means over the logging interval; stops on a non-finite loss or gradient."""
  for i, m in enumerate(metrics):
    if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
      bad_step = step - len(metrics) + i + 1
      kept = (f"the last good checkpoint (step {last_good}) is kept in {workdir}/checkpoints"
              if last_good is not None else "no checkpoint had been saved yet")
      raise NonFiniteLossError(
          f"loss {m['loss']} / grad norm {m['grad_norm']} at step {bad_step}: stopping; "
          f"{kept}. Try a lower config.learning_rate.",
          {"step": bad_step, "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"])})
  return {k: float(np.mean([m[k] for m in metrics])) for k in ("loss", "grad_norm")} | {
      "lr": float(metrics[-1]["lr"])}
