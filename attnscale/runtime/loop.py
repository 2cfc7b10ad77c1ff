"""The training loop: one cadence for one run (train.py) or a pack of R runs (sweep.py).

    loop.train(program, slots, state, release=lock.release)

The loop owns what happens when; a `Program` owns how a step runs. train.py's
program (`train_lib`) has one slot and is the single-run step, compiled as it
is alone; a pack's (`packed`) vmaps that step over R slots. Each slot is one
run (`Slot`: its config, directory, files and progress), and for each running
slot, on its own config's cadence:

* a log row every `log_every` steps (and on every save): the interval's mean loss
  and gradient norm, the learning rate, `loss_last20`, `elapsed_s` (training
  seconds, continued across resumes), the speed, the attention health
  (`attention_health_row`), the output logits' health and z-loss
  (`output_logits_row`) and each layer's sinks and massive activations
  (`layer_stats_row`: one extra forward pass, outside the speed), to metrics.jsonl
  and TensorBoard (`metric_keys` names every key); a progress line, with the time
  elapsed and left (`_times`);
* validation every `eval_every` steps and at the end;
* a checkpoint every `checkpoint_every` steps and at the end (events flushed
  first: a later hard kill loses only what the rerun supersedes);
* a NaN or inf loss or gradient stops the slot before anything non-finite is
  saved: its row records the bad step (`NonFiniteLossError`), its last good
  checkpoint stays, its state no longer changes, and the others go on;
* SIGTERM (preemption) or Ctrl-C: every running slot saves at one step that every
  process agrees on (`attnscale.runtime.interrupts`), then the loop stops
  (`Interrupted` after Ctrl-C).

Reading the metrics waits for the device, so the loop does it only when a slot
logs, and always before a save. A stopped slot (finished, diverged, or padding:
a masked slot that fills a short pack) still computes, since the program's shape
is fixed, and the program keeps its state; nothing of it is written.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Protocol

import jax
import numpy as np

from attnscale import tasks
from attnscale.config.run import RunConfig
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import hostmem, interrupts, metrics_writer, profiling, run_summary, rundir
from attnscale.runtime import metric_keys as keys
from attnscale.runtime import train_state as ts
from attnscale.runtime.metrics_writer import MetricsWriter


class NonFiniteLossError(RuntimeError):
  """The loss or gradient became NaN/inf; nothing after the last good step was saved.

  `record`: the bad step's {"step", "loss", "grad_norm"}, which the loop writes
  to the metrics before stopping, so the run reads as diverged afterwards.
  """

  def __init__(self, message: str, record: dict | None = None):
    super().__init__(message)
    self.record = record or {}


@dataclasses.dataclass
class Slot:
  """One run the loop trains: its config, directory, data, files and progress.

  A padding slot (`padding`) fills a short pack: it has a config and a task (a
  real run's, for its batches) but no directory, and never runs.
  """

  run: RunConfig
  workdir: str | None
  task: tasks.Task
  checkpoints: ckpt.Checkpoints | None = None
  writer: MetricsWriter | None = None
  step: int = 0
  last_good: int | None = None
  status: str = "running"  # running | done | diverged | padding
  pending: list = dataclasses.field(default_factory=list)  # host metrics since the last row
  summary: dict = dataclasses.field(default_factory=dict)  # the last row's values, val_loss
  start_time: float = 0.0
  error: NonFiniteLossError | None = None  # why a diverged slot stopped

  @classmethod
  def padding(cls, like: Slot) -> Slot:
    """A masked slot with `like`'s config and task."""
    return cls(like.run, None, like.task, status="padding")

  @property
  def active(self) -> bool:
    """Still training: its state changes and it logs, evaluates and saves."""
    return self.status == "running"

  @property
  def config(self) -> RunConfig:
    return self.run

  def open(self, state: ckpt.State, shardings) -> ckpt.State:
    """Opens the slot's checkpoints and writer; returns `state` (the slot's, in the
    unpacked layout) resumed from its newest readable checkpoint, if any."""
    self.checkpoints = ckpt.Checkpoints(self.workdir, self.config.keep_checkpoints)
    if self.checkpoints.latest_step() is not None:
      state = rundir.resume(self.checkpoints, state, shardings, self.workdir)
    self.step = int(state["step"])
    self.last_good = self.checkpoints.latest_step()
    # What a killed process logged after this checkpoint never happened: the
    # writer drops it, and the running time continues from the checkpoint's row.
    elapsed = metrics_writer.value_at(self.workdir, keys.ELAPSED_S, self.step) or 0.0
    self.writer = MetricsWriter(self.workdir, resume_step=self.step,
                                loggers=self.run.logger_names)
    self.start_time = time.perf_counter() - elapsed
    if self.step >= self.config.num_train_steps:
      self.status = "done"
    return state

  def close(self) -> None:
    if self.checkpoints is not None:
      self.checkpoints.close()
    if self.writer is not None:
      self.writer.close()


class Program(Protocol):
  """How the loop's steps run, for R slots over one state (R = 1 for train.py).

  `has_log_step`: whether the logged steps run a second program (the attention
  metrics, `attn_stats_on_log_steps`). `state` is the program's own (one run's
  train state, or R stacked); the loop only hands it back.
  """

  has_log_step: bool

  def batch(self, host_batches: list[dict[str, np.ndarray]]) -> Any:
    """The device batch of one step from each slot's host batch."""

  def compile(self, state, batch, active: list[bool]) -> None:
    """Compiles ahead of the first step what is run as a Compiled object."""

  def step(self, state, batch, active: list[bool], logged: bool) -> tuple[Any, Any]:
    """(state, metrics) after one step of every slot; inactive slots keep theirs."""

  def slot_metrics(self, metrics, k: int) -> dict:
    """Slot k's metrics of one step, from `metrics` read to the host."""

  def layer_stats(self, state, batch) -> Any:
    """Each slot's per-layer sink and activation statistics after a step, on `batch`
    (`steps.make_layer_stats`; slot k's: `slot_metrics`), or None when
    config.sink_metrics_rows is 0."""

  def evaluate(self, state, slots: list[Slot], ks: list[int]) -> dict[int, float]:
    """The validation loss of each slot in `ks`."""

  def slot_state(self, state, k: int) -> ckpt.State:
    """Slot k's train state in the unpacked layout (what its checkpoints hold)."""


def attn_stats_on_log_steps(run: RunConfig) -> bool:
  """Attention metrics on, QK-clip off: the stats only on the logged steps.

  The attention metrics cost ~10% of a step (the kernel's extra row reductions):
  without QK-clip (which needs them every step) only the logged steps compute
  them, in a second program compiled with the first, so every other step runs the
  plain one and the interval's speed excludes the compilation.
  """
  return run.attn_metrics and not run.qk_clip


def logs_after(config, step: int) -> bool:
  """Whether the loop writes a log row after `step` (preemption aside: a row
  written on a SIGTERM has no attention entries)."""
  return (step % config.log_every == 0 or step == config.num_train_steps
          or step % config.checkpoint_every == 0)


def train(program: Program, slots: list[Slot], state, *, release=None):
  """Trains every running slot to its config's num_train_steps; returns the state.

  The slots end as "done" or "diverged" (`Slot.error` says why), or still
  "running" after SIGTERM. `release`: called before a second Ctrl-C exits at once
  (the run directories' locks: `os._exit` runs no `finally`).

  Raises:
    interrupts.Interrupted: Ctrl-C, after every running slot saved a checkpoint.
  """
  many = len(slots) > 1
  pending, first, iteration, preempted = [], True, 0, False
  # Each slot's speed interval: since its last log row (time, step).
  ticks, tick_steps = [time.perf_counter()] * len(slots), [s.step for s in slots]
  last_batch = [None] * len(slots)  # a stopped slot reuses its last batch
  # config.profile_steps: one run's steps (a pack is not traced).
  profile = None if many else slots[0].run.profile_window
  with interrupts.Preemption(before_exit=release) as preemption:
    while any(s.active for s in slots):
      if profile is not None:
        profiling.at_step(profile, slots[0].workdir, slots[0].step, state)
      active = [s.active for s in slots]
      for k, s in enumerate(slots):
        if s.active or last_batch[k] is None:
          last_batch[k] = s.task.train_batch(min(s.step, s.config.num_train_steps - 1))
      batch = program.batch(last_batch)
      logged = program.has_log_step and any(
          s.active and logs_after(s.config, s.step + 1) for s in slots)
      if first:  # report compile time (target: < 10 s for the cpu preset)
        first, start = False, time.perf_counter()
        program.compile(state, batch, active)
        state, metrics = program.step(state, batch, active, logged)
        jax.block_until_ready(metrics)
        rundir.log(f"step {_steps(s.step + 1 for s in slots if s.active)}: compiled and ran "
                   f"in {time.perf_counter() - start:.1f}s")
        hostmem.trim()  # the compiler's memory back to the kernel (attnscale/runtime/hostmem.py)
        # Speed excludes compilation: intervals start after the first step.
        ticks = [time.perf_counter()] * len(slots)
        tick_steps = [s.step + a for s, a in zip(slots, active)]
      else:
        state, metrics = program.step(state, batch, active, logged)
      iteration += 1
      for s in slots:
        s.step += s.active
      pending.append((metrics, active))
      # Asked once: a SIGTERM arriving later in this iteration is handled
      # (saved, then exit) at the next one, never exit-without-save.
      preempted = preemption.reached(iteration)
      logs, saves, evals = [], [], []
      for k, s in enumerate(slots):
        if not s.active:
          continue
        done = s.step == s.config.num_train_steps
        save = done or preempted or s.step % s.config.checkpoint_every == 0
        if save or s.step % s.config.log_every == 0:
          logs.append(k)
        if save:
          saves.append(k)
        if done or s.step % s.config.eval_every == 0:
          evals.append(k)
      if logs:
        # Reading the metrics waits for the device: only when some slot logs, and
        # always before a save, so that nothing non-finite is ever saved.
        host = jax.device_get([m for m, _ in pending])
        for metrics_R, (_, was_active) in zip(host, pending):
          for k, s in enumerate(slots):
            if was_active[k]:
              s.pending.append(program.slot_metrics(metrics_R, k))
        pending, now, rows = [], time.perf_counter(), {}
        # The state after this step on its batch: an extra pass, outside the speed.
        layers = jax.device_get(program.layer_stats(state, batch))
        for k in logs:
          extra = {} if layers is None else layer_stats_row(program.slot_metrics(layers, k))
          rows[k] = _write_row(slots[k], k, now, ticks[k], tick_steps[k], many, extra)
          ticks[k], tick_steps[k] = now, slots[k].step
        spent = time.perf_counter() - now
        ticks = [t + spent for t in ticks]
        _progress(slots, {k: row for k, row in rows.items() if row is not None})
        hostmem.trim()  # what this interval's programs freed: attnscale/runtime/hostmem.py
      evals = [k for k in evals if slots[k].active]
      if evals:
        start = time.perf_counter()
        vals = program.evaluate(state, slots, evals)
        for k, val in vals.items():
          slots[k].summary["val_loss"] = val
          slots[k].writer.write(slots[k].step, {keys.VAL_LOSS: val})
        rundir.log(f"step {_steps(slots[k].step for k in evals)} | val loss "
                   + " ".join(f"{vals[k]:.4f}" for k in evals))
        hostmem.trim()
        spent = time.perf_counter() - start  # validation time is not training speed
        ticks = [t + spent for t in ticks]
      saves = [k for k in saves if slots[k].active]  # a diverged one keeps its last good
      for k in saves:
        s = slots[k]
        s.writer.flush()  # events up to a checkpoint reach the disk with it
        s.checkpoints.save(s.step, program.slot_state(state, k))
        s.last_good = s.step
        if s.step == s.config.num_train_steps:
          s.status = "done"
      if saves:
        hostmem.trim()
      if preempted:
        _say_preempted(slots, saves, preemption.interrupted)
        break
    for s in slots:  # the last saves, under the handler: Checkpoints.wait
      if s.checkpoints is not None:
        s.checkpoints.wait()
  if preempted and preemption.interrupted:
    where = (f"at step {slots[0].step} in {slots[0].workdir}" if not many
             else "of every running run of the pack")
    raise interrupts.Interrupted(f"Ctrl-C: saved a checkpoint {where}")
  return state


def _steps(steps) -> str:
  """'3' or '3/7': the distinct steps of the slots a line reports."""
  return "/".join(str(s) for s in sorted(set(steps)))


def _write_row(s: Slot, k: int, now: float, tick: float, tick_step: int,
               many: bool, extra: dict) -> dict | None:
  """Writes slot `s`'s log row from its pending metrics (and `extra` entries) and
  returns its values; None when one is non-finite, which stops the slot
  (`NonFiniteLossError`)."""
  try:
    summary = summarise(s.pending, s.step, s.last_good, s.workdir)
  except NonFiniteLossError as e:  # on record: sweeps read the run as diverged
    s.writer.write(e.record["step"], {keys.LOSS: e.record["loss"],
                                      keys.GRAD_NORM: e.record["grad_norm"]})
    s.writer.flush()
    s.status, s.pending, s.error = "diverged", [], e
    if many:  # one run alone raises it (train_lib): a pack's others go on
      print(f"run [{k}] {s.workdir}: {e}", file=sys.stderr, flush=True)
    return None
  summary.update({"loss_last20": ts.mean_last_losses(s.pending[-1]["last_losses"]),
                  "elapsed_s": now - s.start_time})
  if s.step > tick_step:  # else only the (compiling) first step ran
    steps_per_s = (s.step - tick_step) / (now - tick)
    summary.update({"steps_per_s": steps_per_s,
                    "tokens_per_s": steps_per_s * s.task.tokens_per_batch})
  s.writer.write(s.step, {keys.train(name): v for name, v in summary.items()}
                 | attention_health_row(s.pending) | output_logits_row(s.pending) | extra)
  s.summary.update(summary)
  s.pending = []
  return summary


def _progress(slots: list[Slot], rows: dict[int, dict]) -> None:
  """One line for the slots that just logged: their step, losses, speed and time
  (`_times`)."""
  if not rows:
    return
  first = rows[min(rows)]
  speed = first.get("steps_per_s")
  num_steps = slots[min(rows)].config.num_train_steps
  times = _times(first, num_steps - slots[min(rows)].step)
  if len(slots) == 1:
    speed = (f" | {speed:.2f} steps/s | {first['tokens_per_s'] / 1e3:.1f}k tok/s"
             if speed else "")
    rundir.log(f"step {slots[0].step}/{num_steps} | loss {first['loss']:.4f} | "
               f"lr {first['lr']:.2e}{speed}{times}")
    return
  speed = f" | {speed:.2f} steps/s x {len(slots)} runs" if speed else ""
  losses = " ".join(f"{row['loss']:.3f}" for row in rows.values())
  rundir.log(f"step {_steps(slots[k].step for k in rows)}/{num_steps} | loss {losses}{speed}"
             f"{times}")


def _times(row: dict, steps_left: int) -> str:
  """" | 1 min 05 s elapsed, 3 min 10 s left": the run's training time so far
  (`elapsed_s`, across resumes) and the steps left at the interval's rate (which
  excludes compilation and validation); without a rate (only the compiling step
  ran), the elapsed time alone."""
  out = f" | {run_summary.duration(row['elapsed_s'])} elapsed"
  if row.get("steps_per_s") and steps_left > 0:
    out += f", {run_summary.duration(steps_left / row['steps_per_s'])} left"
  return out


def _say_preempted(slots: list[Slot], saves: list[int], interrupted: bool) -> None:
  what = "Ctrl-C" if interrupted else "SIGTERM"
  if len(slots) == 1:
    s = slots[0]
    rundir.log(f"{what}: saved a checkpoint at step {s.step} in {s.workdir}; " + (
        "rerunning the same command resumes from it" if interrupted else "exiting"))
  else:
    rundir.log(f"{what}: saved a checkpoint of every running run of the pack (steps "
               f"{sorted({slots[k].step for k in saves})}); rerunning the same command "
               "resumes them")


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
      row[keys.attention_key(keys.MAX_LOGIT, i)] = float(np.max(max_N))
      row[keys.attention_key(keys.ENTROPY, i)] = float(np.mean(entropy_N))
      row[keys.attention_key(keys.MAX_LOGIT_HEADS, i)] = [float(x) for x in max_N]
      row[keys.attention_key(keys.ENTROPY_HEADS, i)] = [float(x) for x in entropy_N]
  if "attn_clipped_heads" in last:
    row[keys.CLIPPED_HEADS] = int(sum(int(m["attn_clipped_heads"]) for m in metrics))
  return row


def output_logits_row(metrics: list[dict]) -> dict[str, float]:
  """The output logits' entries of a log row, over the interval's steps ({} for a
  task without them): train/out/max_logit (the largest output logit of any step),
  train/out/log_z (the mean of the steps' mean log Z) and, with config.z_loss > 0,
  train/z_loss (the mean of the z-loss term added to each step's loss)."""
  if "out_max_logit" not in metrics[-1]:
    return {}
  row = {keys.OUT_MAX_LOGIT: float(np.max([m["out_max_logit"] for m in metrics])),
         keys.OUT_LOG_Z: float(np.mean([m["out_log_z"] for m in metrics]))}
  if "z_loss" in metrics[-1]:
    row[keys.Z_LOSS] = float(np.mean([m["z_loss"] for m in metrics]))
  return row


def layer_stats_row(layers: list[dict]) -> dict[str, float | list[float]]:
  """The sink and massive-activation entries of a log row, per layer i, from
  `layer_stats.layer_stats` (read to the host) on the log step's batch:
  train/attn/{sink_rate, sink_heads, top_key_weight, max_act, act_ratio,
  kurtosis, first_value_ratio}/layer_<i> and, for each query group g of the task,
  train/attn/{sink_rate, top_key_weight, uniform_sink_rate, row_mass}_<g>/layer_<i> to
  TensorBoard and metrics.jsonl, train/attn/sink_rate_heads/layer_<i> (one per
  query head) to metrics.jsonl only."""
  row = {}
  for i, layer in enumerate(layers):
    for prefix, name in keys.LAYER_STATS.items():
      row[keys.attention_key(prefix, i)] = float(layer[name])
    for name in keys.group_stats(layer):  # the task's query groups (trigger / no-trigger)
      row[keys.attention_key(keys.group_prefix(name), i)] = float(layer[name])
    row[keys.attention_key(keys.SINK_RATE_HEADS, i)] = [
        float(x) for x in np.asarray(layer["heads"]["sink_rate"])]
  return row


def summarise(metrics: list[dict], step: int, last_good: int | None, workdir: str):
  """Means over the logging interval; stops on a non-finite loss or gradient.

  Raises:
    NonFiniteLossError: a step's loss or gradient norm is NaN/inf.
  """
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
