"""One run, as train.py trains it: jit-compiled, data parallel, resumable.

    train_and_evaluate(config, workdir)

* The config is read once (`startup.start`: validated and typed, the model config
  converted) and passed down; everything that can be wrong with it fails before
  the workdir is created or touched.
* One jitted train step with donated state over a `data` x `fsdp` mesh of all
  devices of all processes (`config.mesh`; `train_state` shards the state):
  `OneRun`, the one-slot program that the loop (`attnscale.runtime.loop`: the
  cadence of logs, evaluations, checkpoints, preemption and the non-finite stop)
  drives.
* Auto-resume from the latest orbax checkpoint in WORKDIR (state, data position
  and RNG: all three are functions of the saved step), periodic and final saves,
  and a save on SIGTERM (preemption) or Ctrl-C, at one step that every process
  agrees on when there are several (`attnscale.runtime.interrupts`). After a hard kill
  (SIGKILL, a lost node) the rerun supersedes what the killed process logged
  past that checkpoint (`MetricsWriter(resume_step=...)`), so each step is
  logged once. A checkpoint that cannot be read (a truncated file) is set aside
  and the run resumes from the newest one that can (`rundir.resume`).
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
  saved: the last good checkpoint stays (`loop.NonFiniteLossError`).
* `config.init_from=WORKDIR`: a new run starts from that run's parameters
  (`rundir.start_from`: optimizer state fresh, the source in provenance.json).
"""

from __future__ import annotations

import os

import jax
import ml_collections

from attnscale.runtime import loop, provenance, rundir, startup, steps


class OneRun:
  """The loop's `Program` for one run: train.py's step, exactly as it compiles alone.

  With attention metrics and no QK-clip, the logged steps run a second program
  (`loop.attn_stats_on_log_steps`), compiled before the first step and run as
  the Compiled object. The log steps' sink and activation statistics
  (`steps.make_layer_stats`) are a third program, on the state after the step.
  """

  def __init__(self, s: startup.Start):
    run, task, graphdef, shardings = s.run, s.task, s.graphdef, s.shardings
    self.task, self.run, self.batch_sharding = task, run, s.batch_sharding
    batch_sharding = self.batch_sharding
    stats_on_logs = loop.attn_stats_on_log_steps(run)
    self.train_step = steps.make_train_step(graphdef, task, run, shardings, batch_sharding,
                                            attn_metrics=False if stats_on_logs else None,
                                            optimizer=s.optimizer)
    self.log_step = (steps.make_train_step(graphdef, task, run, shardings, batch_sharding,
                                           optimizer=s.optimizer)
                     if stats_on_logs else None)
    self.has_log_step = self.log_step is not None
    self.eval_step = steps.make_eval_step(graphdef, task, shardings["params"], batch_sharding)
    self.layer_stats_fn = steps.make_layer_stats(graphdef, task, run, batch_sharding.mesh)

  def batch(self, host_batches):
    return steps.global_batch(host_batches[0], self.batch_sharding)

  def compile(self, state, batch, active):
    if self.log_step is not None:
      self.log_step = self.log_step.lower(state, batch).compile()

  def step(self, state, batch, active, logged):
    return (self.log_step if logged else self.train_step)(state, batch)

  def slot_metrics(self, metrics, k):
    return metrics

  def layer_stats(self, state, batch):
    return None if self.layer_stats_fn is None else self.layer_stats_fn(state["params"], batch)

  def evaluate(self, state, slots, ks):
    batches = (self.task.val_batch(i) for i in range(self.run.eval_batches))
    return {0: steps.evaluate(self.eval_step, state["params"], batches, self.batch_sharding)}

  def slot_state(self, state, k):
    return state


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       force_lock: bool = False) -> dict[str, float]:
  """Trains (or resumes) the run in `workdir`; returns the final metrics.

  `force_lock`: take WORKDIR/LOCK whoever holds it (train.py's --force_lock).

  Raises:
    interrupts.Interrupted: Ctrl-C stopped the run, after saving a checkpoint.
    run_lock.LockedError: another run holds WORKDIR/LOCK (nothing is touched).
    ValueError: a bad config, another experiment's workdir, or no checkpoint
      that can be read (one line each).
    loop.NonFiniteLossError: the loss became NaN/inf.
  """
  # Before the workdir: a bad config, or a parameter that config.mesh.fsdp cannot
  # split, fails here.
  s = startup.start(config)
  run, mesh = s.run, s.mesh
  state = startup.init_state(s)
  start = {}
  if run.init_from and not rundir.has_checkpoint(workdir):
    # A new run from another's parameters (a resume reads its own checkpoint instead).
    state, source = rundir.start_from(run.init_from, config, state, s.shardings, workdir)
    start = {"init_from": source}
  slot = loop.Slot(run, workdir, s.task)
  os.makedirs(workdir, exist_ok=True)
  with rundir.workdir_lock(workdir, force_lock) as lock:
    rundir.save_config(config, workdir)
    try:
      state = slot.open(state, s.shardings)
      # Which code, versions and devices: one record a (re)start that trains (after
      # the resume, so a run that cannot resume leaves its directory as it was), with
      # the files of config.imports, which eval.py imports again from any folder, the
      # run config.init_from started from and the attention and LayerNorm kernels it
      # trains with.
      provenance.write(workdir, pack_size=1, slot=0, attention_kernel=s.attention_kernel,
                       layernorm_kernel=s.layernorm_kernel, **rundir.provenance_imports(config),
                       **start)
      program = OneRun(s)
      num_params = sum(x.size for x in jax.tree.leaves(state["params"]))
      processes = f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""
      fsdp = f", fsdp {mesh.shape['fsdp']}" if mesh.shape["fsdp"] > 1 else ""
      rundir.log(f"{run.task} | {run.run_label} | "
                 f"{num_params / 1e6:.2f}M params | {jax.device_count()} devices{processes} "
                 f"({jax.devices()[0].platform}{fsdp}) | workdir {workdir}")
      loop.train(program, [slot], state, release=lock.release)
    finally:
      slot.close()
  if slot.error is not None:
    raise slot.error
  return {"step": slot.step, **slot.summary}
