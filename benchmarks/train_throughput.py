"""Training throughput: attnscale's char LM against the same model in PyTorch.

    python benchmarks/train_throughput.py                    # both sizes, 2 CPU cores: minutes
    python benchmarks/train_throughput.py --sizes cpu --rounds 5 --steps 10
    python benchmarks/train_throughput.py --torch_compile    # adds torch.compile
    python benchmarks/train_throughput.py --malloc system    # glibc's defaults

Sizes: `cpu` (the cpu preset: 4 layers, width 128, 4 heads, block 128, batch 32)
and `nanogpt` (6 x 384, 6 heads, block 256, batch 64). The JAX side is the train
step `train.py` runs (`train_lib.make_train_step`, scaling `standard`, dropout
off on both sides); the PyTorch side is `torch_reference.py` (same shapes,
init, AdamW and clipping; eager, and compiled with --torch_compile). Both get
the same real batches of tiny Shakespeare. Frameworks are timed in interleaved
rounds (this 2-core machine is noisy) after a warm-up; the table reports the
median ms per step, tokens/s, and attnscale's tokens/s over each PyTorch
variant's. Needs `pip install torch` (a benchmark-only dependency) and the data
(`ATTNSCALE_DATA` offline).

Like train.py, it re-executes itself with glibc's malloc tunables
(`attnscale/hostmem.py`; --malloc huge|reuse|system), and both frameworks run
under them: XLA's per-step buffers cost page faults without them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
from attnscale import hostmem, tasks, train_lib  # noqa: E402
from attnscale import train_state as ts  # noqa: E402
from configs import shakespeare_char  # noqa: E402

SIZES = {"cpu": "preset=cpu", "nanogpt": "preset=nanogpt"}


def jax_runner(size: str, args):
  """(step function taking a batch index, description) for attnscale's train step."""
  config = shakespeare_char.get_config(SIZES[size])
  with config.unlocked():
    config.model.dropout = 0.0  # the reference has none; dropout is not what we time
    if args.dtype:
      config.model.dtype = args.dtype
  mesh = ts.make_mesh()
  batch_sharding = NamedSharding(mesh, P("data"))
  graphdef, state, shardings = ts.create_state(config, mesh)
  task = tasks.get_task(config)
  step_fn = train_lib.make_train_step(graphdef, task, config, shardings, batch_sharding)
  batches = [train_lib.global_batch(task.train_batch(i), batch_sharding)
             for i in range(args.steps)]
  holder = {"state": state}

  def run(n):
    for i in range(n):
      holder["state"], metrics = step_fn(holder["state"], batches[i % len(batches)])
    jax.block_until_ready(metrics["loss"])

  return run, config, task


def torch_runner(config, task, args, compile: bool):
  import torch
  import torch_reference  # beside this file
  torch.manual_seed(config.seed)
  m = config.model
  model = torch_reference.GPT(m.vocab_size, m.block_size, m.num_layers, m.num_heads, m.width)
  step = torch_reference.make_train_step(
      model, learning_rate=config.learning_rate, weight_decay=config.weight_decay,
      b1=config.b1, b2=config.b2, grad_clip=config.grad_clip, compile=compile)
  batches = []
  for i in range(args.steps):
    b = task.train_batch(i)
    batches.append((torch.from_numpy(b["inputs"].astype(np.int64)),
                    torch.from_numpy(b["targets"].astype(np.int64))))

  def run(n):
    for i in range(n):
      loss = step(*batches[i % len(batches)])
    loss.item()

  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="cpu,nanogpt")
  parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--torch_compile", action="store_true")
  parser.add_argument("--no_torch", action="store_true", help="attnscale only")
  parser.add_argument("--dtype", default=None, help="JAX compute dtype (e.g. bfloat16)")
  parser.add_argument("--malloc", choices=list(hostmem.MODES), default=None,
                      help="glibc malloc tunables for both frameworks, as train.py's "
                           "ATTNSCALE_MALLOC (default huge): attnscale/hostmem.py")
  args = parser.parse_args()
  hostmem.reexec_with_tunables(args.malloc)  # as train.py does
  malloc = os.environ.get("GLIBC_TUNABLES") or "glibc defaults"

  versions = f"JAX {jax.__version__}"
  runners_by_size = {}
  for size in args.sizes.split(","):
    run, config, task = jax_runner(size, args)
    runners = {"attnscale (JAX)": run}
    if not args.no_torch:
      import torch
      versions += "" if "torch" in versions else f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
      runners["PyTorch eager"] = torch_runner(config, task, args, compile=False)
      if args.torch_compile:
        runners["torch.compile"] = torch_runner(config, task, args, compile=True)
    for name, r in runners.items():  # warm-up: compilation, allocator, caches
      start = time.perf_counter()
      r(2)
      print(f"# {size} {name}: warm-up (incl. compile) {time.perf_counter() - start:.1f}s",
            flush=True)
    runners_by_size[size] = (runners, config)

  print(f"# {jax.devices()[0].platform} ({platform.machine()}), {versions}, "
        f"median of {args.rounds} interleaved rounds of {args.steps} steps, GLIBC_TUNABLES: {malloc}")
  print("| size | params | tokens/step | framework | ms/step | tokens/s | attnscale / this |")
  print("|---|---:|---:|---|---:|---:|---:|")
  for size, (runners, config) in runners_by_size.items():
    times = {name: [] for name in runners}
    for _ in range(args.rounds):
      for name, r in runners.items():
        start = time.perf_counter()
        r(args.steps)
        times[name].append((time.perf_counter() - start) / args.steps)
    tokens = config.batch_size * config.seq_len
    m = config.model
    params = m.num_layers * 12 * m.width**2 + (m.vocab_size + m.block_size) * m.width
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    ours = ms["attnscale (JAX)"]
    for name, t in ms.items():
      print(f"| {size} | {params / 1e6:.2f}M | {tokens} | {name} | {t:.1f} | "
            f"{tokens / t * 1e3:,.0f} | {t / ours:.2f} |", flush=True)


if __name__ == "__main__":
  main()
