"""Evaluation of a trained run: whole-split metrics, samples, attention diagnostics.

The task decides the metrics (`task.eval_metrics`): the char LM reports
val_loss, bits_per_char and val_tokens; the masked LM val_loss, perplexity,
accuracy (of the masked tokens) and val_masked_tokens. Every run gets per-layer
attention diagnostics (with the padding mask where there is padding), and a
causal LM a sample.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from attnscale import diagnostics, tasks
from attnscale import train_lib
from attnscale import train_state as ts


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise ValueError(f"--workdir {workdir} has no config.json: is it a train.py run directory?")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def restore(config, workdir, step=None):
  """(model, step) from the checkpoint `step` (default latest) of `workdir`."""
  mesh = ts.make_mesh()
  graphdef, state, shardings = ts.create_state(config, mesh)
  checkpoints = ts.Checkpoints(workdir, config.keep_checkpoints)
  step = checkpoints.latest_step() if step is None else step
  if step is None:
    raise ValueError(f"--workdir {workdir} has no checkpoint to evaluate")
  state = checkpoints.restore(state, shardings, step)
  checkpoints.close()
  return nnx.merge(graphdef, state["params"]), step, mesh


def sample(model, encode, decode, *, prompt: str, length: int, temperature: float,
           top_k: int | None, seed: int) -> str:
  """nanoGPT-style sampling: crop to the last block_size tokens, temperature, top-k.

  The window is right-padded to block_size so one compiled forward serves every
  step; causal attention keeps the padding invisible to the real tokens.
  """
  if temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")
  T = model.cfg.block_size

  @jax.jit
  def next_token(window_1T, last, key):
    logits_V = model(window_1T)[0, last] / temperature
    if top_k:
      kth = jax.lax.top_k(logits_V, min(top_k, logits_V.shape[-1]))[0][-1]
      logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
    return jax.random.categorical(key, logits_V)

  tokens = list(encode(prompt))
  key = jax.random.key(seed)
  for i in range(length):
    context = tokens[-T:]
    window = np.zeros((1, T), np.int32)
    window[0, :len(context)] = context
    tokens.append(int(next_token(window, len(context) - 1, jax.random.fold_in(key, i))))
  return decode(tokens[len(prompt):])


def evaluate_run(workdir: str, *, step: int | None = None, prompt: str = "\n",
                 sample_length: int = 300, temperature: float = 0.8, top_k: int | None = 200,
                 seed: int = 0) -> dict:
  """Evaluates the run in `workdir`, writes WORKDIR/eval.json, returns its contents."""
  config = load_config(workdir)
  task = tasks.get_task(config)
  model, step, mesh = restore(config, workdir, step)
  sharding = NamedSharding(mesh, P("data"))
  graphdef, params = nnx.split(model, nnx.Param)
  eval_step = train_lib.make_eval_step(graphdef, task, None, sharding)
  sums = train_lib.evaluate_sums(eval_step, params, task.eval_batches(), sharding)
  first = next(task.eval_batches())
  result = {
      "workdir": workdir,
      "step": int(step),
      "scaling": config.model.scaling,
      **task.eval_metrics(sums),
      "attention": diagnostics.model_attention_stats(model, jnp.asarray(first["inputs"]),
                                                     **task.attention_masks(first)),
  }
  if model.cfg.causal:  # only a causal LM generates
    result["sample"] = {
        "prompt": prompt, "length": sample_length, "temperature": temperature,
        "top_k": top_k, "seed": seed,
        "text": sample(model, task.data.encode, task.data.decode, prompt=prompt,
                       length=sample_length, temperature=temperature, top_k=top_k, seed=seed)}
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "eval.json"), "w") as f:
      json.dump(result, f, indent=2)
  return result


def format_summary(result: dict) -> str:
  lines = [f"{result['workdir']} @ step {result['step']} ({result['scaling']})"]
  if "bits_per_char" in result:
    lines.append(f"  validation loss {result['val_loss']:.4f} | {result['bits_per_char']:.4f} "
                 f"bits/char over all {result['val_tokens']:,} validation targets")
  else:
    lines.append(f"  validation MLM loss {result['val_loss']:.4f} | perplexity "
                 f"{result['perplexity']:.2f} | masked-token accuracy {result['accuracy']:.4f} "
                 f"over all {result['val_masked_tokens']:,} masked validation tokens")
  lines.append("  layer | attn output std | entropy (nats) | max logit")
  for i, layer in enumerate(result["attention"]):
    lines.append(f"  {i:5d} | {layer['output_std']:15.3f} | {layer['entropy']:14.3f} | "
                 f"{layer['max_logit']:9.2f}")
  if "sample" in result:
    s = result["sample"]
    lines += [f"  sample (temperature {s['temperature']}, top-k {s['top_k']}, seed {s['seed']}):",
              "  " + "-" * 60, s["prompt"] + s["text"], "  " + "-" * 60]
  return "\n".join(lines)
