"""Evaluation of a trained run: whole-split metrics, samples, attention diagnostics.

Task-agnostic: the task (`attnscale.tasks`) decides the metrics
(`task.eval_metrics`: the char LM's val_loss, bits_per_char and val_tokens; the
masked LM's val_loss, perplexity, accuracy and val_masked_tokens), its lines of
the printed summary, whether it samples (`task.sampler`: the char LM does) and
how its attention is masked for the per-layer diagnostics
(`diagnostics.task_attention_stats`, the same function the trained study uses).
"""

from __future__ import annotations

import json
import math
import os
import sys

import jax
import ml_collections
from flax import nnx

from attnscale import tasks
from attnscale.config import imports as config_imports
from attnscale.config import migration
from attnscale.config import run as run_config
from attnscale.evaluation import diagnostics, length_eval
from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import provenance, startup, steps
from attnscale.runtime import train_state as ts


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's saved config, in today's field names (`migration.migrate`), with
  the modules it names in `imports` imported (`config_imports.import_modules`), as
  train.py imported them: by name or path from here, else from the files train.py
  recorded in WORKDIR/provenance.json (so from any folder)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isdir(workdir):
    raise ValueError(f"--workdir {workdir} does not exist (from {os.getcwd()}): give a "
                     "train.py run directory")
  if not os.path.exists(path):
    raise ValueError(f"--workdir {workdir} has no config.json: is it a train.py run directory?")
  with open(path) as f:
    config = ml_collections.ConfigDict(migration.migrate(json.load(f)))
  config_imports.import_modules(config, recorded=provenance.import_files(workdir))
  return config


def restore(config, workdir, step=None, *, start: startup.Start | None = None):
  """(model, step, mesh) from the checkpoint `step` of `workdir`.

  By default the newest checkpoint that can be read: newer ones that cannot (a
  truncated file) get one warning line on stderr and stay where they are
  (evaluating changes no checkpoint; train.py's rerun sets them aside). The state
  parameters alone are read, into their shapes (nothing is initialised first; the
  optimizer state is neither read nor needed, so damage there does not stop an
  evaluation).

  Args:
    config: the run's config (`load_config`), or None with `start`.
    start: the run's start-up on the evaluation mesh (`evaluation_start`), when the
      caller already made it.

  Raises:
    ValueError: no checkpoint (that can be read), or `step` cannot be read;
      one line (the latter naming the steps that can).
  """
  s = evaluation_start(config, data=False) if start is None else start
  state = s.shapes
  checkpoints = ckpt.Checkpoints(workdir, s.run.keep_checkpoints)
  try:
    if step is None:
      if checkpoints.latest_step() is None:
        raise ValueError(f"--workdir {workdir} has no checkpoint to evaluate")
      state, step, damaged = checkpoints.restore_newest_intact(state, s.shardings,
                                                               only=("params",))
      if damaged and jax.process_index() == 0:
        print(f"warning: {ckpt.describe_damaged(damaged)}; evaluating step {step}",
              file=sys.stderr, flush=True)
    else:
      try:
        state = checkpoints.restore(state, s.shardings, step, only=("params",))
      except ckpt.DamagedCheckpointError as e:
        intact = [k for k in checkpoints.intact_steps(state, s.shardings, only=("params",))
                  if k != step]
        raise ValueError(f"--step={step}: {e}; steps that can be read: "
                         f"{', '.join(map(str, intact)) or 'none'}") from None
  finally:
    checkpoints.close()
  return nnx.merge(s.graphdef, state["params"]), step, s.mesh


def evaluation_start(config, *, data: bool = True, workdir: str | None = None
                     ) -> startup.Start:
  """The run's start-up for evaluating it here: its config read and checked once
  (not against these devices: a checkpoint trained on 8 evaluates on 1; its imports
  from the files `workdir`'s provenance records), on `train_state.evaluation_mesh`."""
  recorded = provenance.import_files(workdir) if workdir else None
  run = run_config.read(config, num_devices=None, recorded=recorded)
  return startup.start(run, mesh=ts.evaluation_mesh(run), data=data)


def evaluate_run(workdir: str, *, config: ml_collections.ConfigDict | None = None,
                 step: int | None = None, prompt: str = "\n",
                 sample_length: int = 300, temperature: float = 0.8, top_k: int | None = 200,
                 seed: int = 0, lengths: list[int] | None = None,
                 whole_split: bool = False) -> dict:
  """Evaluates the run in `workdir`, writes WORKDIR/eval.json, returns its contents.

  `lengths`: also the loss at each of these context lengths and by position in
  the window (`attnscale.evaluation.length_eval`), under eval.json's "lengths" key.
  `whole_split`: a config that scores only the first `eval_tokens` validation
  targets (the token LM) scores all of them. `config`: the run's (`load_config`),
  when the caller read it already.
  """
  config = load_config(workdir) if config is None else config
  if whole_split and "eval_tokens" in config:
    config.eval_tokens = 0
  s = evaluation_start(config, workdir=workdir)
  task = s.task
  if lengths:  # a length the model cannot take fails before any work
    length_eval.check_lengths(s.run.model, task, lengths)
  model, step, mesh = restore(None, workdir, step, start=s)
  sharding = ts.batch_sharding(mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  eval_step = steps.make_eval_step(graphdef, task, None, sharding)
  sums = steps.evaluate_sums(eval_step, params, task.eval_batches(), sharding)
  result = {
      "workdir": workdir,
      "step": int(step),
      "scaling": s.run.run_label,
      **task.eval_metrics(sums),
      # On the whole first batch: each process holds only its rows of it.
      "attention": diagnostics.task_attention_stats(
          model, task, steps.global_batch(next(iter(task.eval_batches())), sharding)),
  }
  if lengths:
    result["lengths"] = length_eval.evaluate_lengths(model, task, lengths, mesh=mesh)
  if task.sampler is not None:
    result["sample"] = {
        "prompt": prompt, "length": sample_length, "temperature": temperature,
        "top_k": top_k, "seed": seed,
        "text": task.sampler(model, prompt=prompt, length=sample_length,
                             temperature=temperature, top_k=top_k, seed=seed)}
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "eval.json"), "w") as f:
      json.dump(result, f, indent=2)
  return result


def format_summary(result: dict, config: ml_collections.ConfigDict | None = None) -> str:
  """eval.py's printout of `result` (eval.json): header, the task's lines, the
  per-layer attention table.

  Args:
    result: what `evaluate_run` returned (or eval.json holds).
    config: the run's config; None = read from result["workdir"], which says
      which task's lines to print.
  """
  config = load_config(result["workdir"]) if config is None else config
  lines = [f"{result['workdir']} @ step {result['step']} ({result['scaling']})"]
  lines += tasks.task_class(config).format_summary(result)
  lines.append("  layer | attn output std | entropy (nats) | max logit | first-key weight | "
               "top-key weight | sink heads | max/median act | kurtosis")
  for i, layer in enumerate(result["attention"]):
    # Runs evaluated before the sink and activation measures lack them.
    extra = (f" | {layer['sink_rate']:16.3f} | {layer.get('top_key_weight', math.nan):14.3f}"
             f" | {layer['sink_heads']:10.2f} | {layer['act_ratio']:14.1f} | "
             f"{layer['kurtosis']:8.2f}" if "act_ratio" in layer else "")
    lines.append(f"  {i:5d} | {layer['output_std']:15.3f} | {layer['entropy']:14.3f} | "
                 f"{layer['max_logit']:9.2f}{extra}")
  groups = [k.removeprefix("sink_rate_") for k in result["attention"][0]
            if k.startswith("sink_rate_")] if result["attention"] else []
  if groups:  # the task's query groups (the trigger task's trigger / no-trigger rows)
    lines.append("  layer | rows | first-key weight (uniform) | top-key weight | row mass | "
                 "|v_0| / mean |v|")
    for i, layer in enumerate(result["attention"]):
      for g in groups:
        lines.append(f"  {i:5d} | {g} | {layer[f'sink_rate_{g}']:.3f} "
                     f"({layer[f'uniform_sink_rate_{g}']:.3f}) | "
                     f"{layer[f'top_key_weight_{g}']:.3f} | {layer[f'row_mass_{g}']:.3f} | "
                     f"{layer['first_value_ratio']:.3f}")
  if "lengths" in result:
    lines += length_eval.format_table(result["lengths"])
  return "\n".join(lines)
