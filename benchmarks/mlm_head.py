"""The MLM head on the selected positions only vs on every position: speed and memory.

    python benchmarks/mlm_head.py                         # cpu and cpu_8k: about a minute
    python benchmarks/mlm_head.py --sizes base --steps 3  # BERT-base's shape (batch 8)

The masked-LM loss needs logits at the P ~ 0.15 T selected positions only.
`MLMTask.loss` gathers the final residual stream there before BERT's head (dense
+ GELU + LN, then the [D, V] tied vocabulary projection; `positions=` of the
model, as BERT's `gather_indexes`); `tasks.mlm.full_head_loss` runs the head on
all T positions and picks the P after. Both give the same loss and gradients
(tests/test_mlm.py). For each size this times the jitted loss + gradient of the
model (the train step without the optimizer's elementwise update) on one fixed
synthetic batch (real-looking rows: 30% padding, the task's masking), median
over --rounds rounds of --steps steps after a warm-up, and reads XLA's
temporary buffer bytes from the compiled program (`memory_analysis()`: the
activations kept for the backward pass, logits included).

Sizes (configs/bert_small.py's shapes): `cpu` (the cpu preset: 4 x 128, 4
heads, seq 128, batch 32, vocabulary 2048), `cpu_8k` (the same with the 8192
vocabulary of the mini preset) and `base` (12 x 768, 12 heads, seq 512,
vocabulary 8192, batch 8: for a host with memory to spare, or a GPU).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
from attnscale import models  # noqa: E402
from attnscale.config import schema  # noqa: E402
from attnscale.data import mlm, tokenizer  # noqa: E402
from attnscale.tasks import mlm as mlm_task  # noqa: E402
from configs import bert_small  # noqa: E402

# size -> (config argument, field overrides)
SIZES = {
    "cpu": ("preset=cpu", {}),
    "cpu_8k": ("preset=cpu", {"model.vocab_size": 8192}),
    "base": ("preset=base", {"batch_size": 8}),
}
MiB = 2**20


def synthetic_batch(config) -> dict:
  """One masked batch of rows with 30% padding (the task's layout and masking)."""
  B, T, V = config.batch_size, config.seq_len, config.model.vocab_size
  rng = np.random.default_rng(0)
  lengths_B = rng.integers(T // 3, T + 1, B)  # ~30% of the positions padded
  tokens_BT = np.full((B, T), tokenizer.PAD_ID, np.int32)
  for b, n in enumerate(lengths_B):
    tokens_BT[b, 0], tokens_BT[b, n - 1] = tokenizer.CLS_ID, tokenizer.SEP_ID
    tokens_BT[b, 1:n - 1] = rng.integers(len(tokenizer.SPECIALS), V, n - 2)
  batch = mlm.mask_tokens(tokens_BT, rng, vocab_size=V, mask_rate=config.mask_rate,
                          max_predictions=config.max_predictions_per_seq)
  return {k: jnp.asarray(v) for k, v in batch.items()}


def measure(size: str, head: str, args) -> dict:
  arg, overrides = SIZES[size]
  config = bert_small.get_config(arg)
  config.update_from_flattened_dict(overrides)
  model = models.build(schema.model_config(config), rngs=nnx.Rngs(params=0))
  graphdef, params = nnx.split(model)
  batch = synthetic_batch(config)

  def loss(params, batch):
    m = nnx.merge(graphdef, params)
    if head == "gathered":
      return mlm_task.MLMTask.loss(None, m, batch)[0]
    total, count = mlm_task.full_head_loss(m, batch)
    return total / jnp.maximum(count, 1.0)

  step = jax.jit(jax.value_and_grad(loss))
  compiled = step.lower(params, batch).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  jax.block_until_ready(compiled(params, batch))  # warm-up
  times = []
  for _ in range(args.rounds):
    start = time.perf_counter()
    for _ in range(args.steps):
      out = compiled(params, batch)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / args.steps)
  ms = 1e3 * statistics.median(times)
  return {"size": size, "head": head, "ms": ms, "temp_mib": temp / MiB,
          "positions": batch["positions"].shape[1], "seq": config.seq_len,
          "vocab": config.model.vocab_size}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="cpu,cpu_8k", help=f"comma-separated: {list(SIZES)}")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args()
  sizes = args.sizes.split(",")
  for s in sizes:
    if s not in SIZES:
      raise SystemExit(f"--sizes must be among {list(SIZES)}, got {s!r}")
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{jax.devices()[0].platform}, JAX {jax.__version__}, load average {load:.1f}")
  print("| size | T | P | V | head | ms / step (loss + grad) | temp MiB |")
  print("|---|---|---|---|---|---|---|")
  for size in sizes:
    rows = [measure(size, head, args) for head in ("gathered", "full")]
    for r in rows:
      print(f"| {size} | {r['seq']} | {r['positions']} | {r['vocab']} | {r['head']} | "
            f"{r['ms']:.1f} | {r['temp_mib']:.1f} |")
    print(f"| {size} | | | | full / gathered | {rows[1]['ms'] / rows[0]['ms']:.2f}x | "
          f"{rows[1]['temp_mib'] / max(rows[0]['temp_mib'], 1e-9):.2f}x |")
  if hasattr(os, "getloadavg"):
    print(f"# load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
