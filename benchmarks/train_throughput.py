"""Training throughput: attnscale's char LM against the same model in PyTorch, and MFU.

    python benchmarks/train_throughput.py                    # cpu and nanogpt sizes: minutes
    python benchmarks/train_throughput.py --sizes cpu --rounds 5 --steps 10
    python benchmarks/train_throughput.py --frameworks jax,torch,torch_compile
    python benchmarks/train_throughput.py --malloc system    # glibc's defaults
    python benchmarks/train_throughput.py --sizes cpu --frameworks jax --layernorm xla
    python benchmarks/train_throughput.py --sizes gpt2 --frameworks jax --dtype bfloat16  # GPU

Sizes: `cpu` (the cpu preset: 4 layers, width 128, 4 heads, block 128, batch
32), `nanogpt_cpu` (nanoGPT's README CPU recipe: 4 x 128, 4 heads, block 64,
batch 12), `nanogpt` (6 x 384, 6 heads, block 256, batch 64) and `gpt2` (GPT-2 small's
body: 12 x 768, 12 heads, block 1024, batch 16; for a GPU). The JAX side is the
train step `train.py` runs (`steps.make_train_step`, scaling `standard`,
dropout off on both sides; `jax` on the CPU's default attention kernel, the
native one where it built, `jax_xla` on the XLA kernel; the program of the steps it does not log, so without
the attention metrics, which the PyTorch twin does not compute either); the PyTorch side is `torch_reference.py` (same
shapes, init, AdamW and clipping; eager, or torch.compile). Both get the same
real batches of tiny Shakespeare.

Each framework runs in its own process, one after the other, with a warm-up
(compilation) and then --rounds rounds of --steps steps; the table reports the
median ms per step, tokens/s, attnscale's tokens/s over each framework's, and the
model FLOPs utilisation where the device's peak is known (GPUs, TPUs): FLOPs per
token 6 N + 12 L T D, as PaLM (appendix B) and nanoGPT count them: N the
parameters of the matrix products (12 L D^2, plus V D for the tied readout), and
attention's T x T products without discounting the causal half. Separate processes because
in one process PyTorch's allocations slowed JAX's steps down by 1.5x at
`nanogpt` (--in_process keeps that mode, rounds interleaved).

Like train.py, it re-executes itself with glibc's malloc tunables
(`attnscale/runtime/hostmem.py`; --malloc huge|reuse|system), and every framework runs
under them: XLA's per-step buffers cost page faults without them. Needs `pip
install torch` (a benchmark-only dependency) and the data (`ATTNSCALE_DATA`
offline).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
from attnscale import tasks
from attnscale.runtime import hostmem, steps  # noqa: E402
from attnscale.runtime import train_state as ts  # noqa: E402
from configs import shakespeare_char  # noqa: E402

SIZES = {
    "cpu": ("preset=cpu", {}),
    "nanogpt": ("preset=nanogpt", {}),
    "nanogpt_cpu": ("preset=nanogpt_cpu", {}),
    "gpt2": ("preset=nanogpt", {"model.num_layers": 12, "model.width": 768,
                                "model.num_heads": 12, "model.block_size": 1024,
                                "seq_len": 1024, "batch_size": 16}),
}
FRAMEWORKS = {"jax": "attnscale (JAX)", "jax_xla": "attnscale (JAX), XLA kernel",
              "torch": "PyTorch eager", "torch_compile": "torch.compile"}
# Dense bf16 peak FLOP/s by device_kind prefix (vendor data sheets; no sparsity).
PEAK_BF16 = {"NVIDIA H100 PCIe": 756e12, "NVIDIA H100": 989e12, "NVIDIA H200": 989e12,
             "NVIDIA A100": 312e12, "NVIDIA L4": 121e12, "NVIDIA A10G": 125e12,
             "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
             "TPU v6 lite": 918e12, "TPU v6e": 918e12}


def get_config(size: str, args):
  arg, overrides = SIZES[size]
  config = shakespeare_char.get_config(arg)
  with config.unlocked():
    for key, value in overrides.items():
      parent, _, field = key.rpartition(".")
      setattr(config.model if parent else config, field, value)
    # The reference has none; dropout is not what we time (--dropout: its compile on a GPU).
    config.model.dropout = args.dropout
    if args.dtype:
      config.model.dtype = args.dtype
    if args.layernorm:
      config.model.layernorm_impl = args.layernorm
  return config


def flops_per_token(config) -> float:
  m = config.model
  matmul_params = m.num_layers * 12 * m.width**2 + m.vocab_size * m.width
  return 6 * matmul_params + 12 * m.num_layers * config.seq_len * m.width


def unlogged_step(config, batches_np):
  """(step_fn, state, batches): the program train.py runs on the steps it does not
  log, its initial state and the batches on the mesh. With attn_metrics on and
  QK-clip off, the attention statistics (about 10% of a step) only run on logged
  steps, in a second program (attnscale/runtime/loop.py); the PyTorch twin computes none."""
  mesh = ts.make_mesh()
  batch_sharding = NamedSharding(mesh, P("data"))
  graphdef, state, shardings = ts.create_state(config, mesh)
  task = tasks.get_task(config)
  step_fn = steps.make_train_step(graphdef, task, config, shardings, batch_sharding,
                                      attn_metrics=False if config.get("qk_clip", 0.0) == 0
                                      else None)
  return step_fn, state, [steps.global_batch(b, batch_sharding) for b in batches_np]


def jax_runner(config, batches_np):
  """A function running n train steps of attnscale's train step (what train.py runs)."""
  step_fn, state, batches = unlogged_step(config, batches_np)
  holder = {"state": state}

  def run(n):
    for i in range(n):
      holder["state"], metrics = step_fn(holder["state"], batches[i % len(batches)])
    jax.block_until_ready(metrics["loss"])

  return run


def torch_runner(config, batches_np, compile: bool):
  import torch
  import torch_reference  # beside this file
  torch.manual_seed(config.seed)
  m = config.model
  model = torch_reference.GPT(m.vocab_size, m.block_size, m.num_layers, m.num_heads, m.width)
  step = torch_reference.make_train_step(
      model, learning_rate=config.learning_rate, weight_decay=config.weight_decay,
      b1=config.b1, b2=config.b2, grad_clip=config.grad_clip, compile=compile)
  batches = [(torch.from_numpy(b["inputs"].astype(np.int64)),
              torch.from_numpy(b["targets"].astype(np.int64))) for b in batches_np]

  def run(n):
    for i in range(n):
      loss = step(*batches[i % len(batches)])
    loss.item()

  return run


def make_runner(framework: str, config, args):
  task = tasks.get_task(config)
  batches_np = [task.train_batch(i) for i in range(args.steps)]
  if framework.startswith("jax"):
    if framework == "jax_xla":  # today's XLA attention kernel instead of the CPU default
      config = copy.deepcopy(config)  # the others' config stays as it was
      with config.unlocked():
        config.model.attention_impl = "xla"
    return jax_runner(config, batches_np)
  return torch_runner(config, batches_np, compile=framework == "torch_compile")


def versions(frameworks) -> str:
  text = f"JAX {jax.__version__}"
  if any(f.startswith("torch") for f in frameworks):
    import torch
    text += f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
  return text


def measure_in_process(size, frameworks, args) -> dict:
  """{framework: (warm-up s, [s per step for each round])}, rounds interleaved."""
  config = get_config(size, args)
  runners, out = {}, {}
  for f in frameworks:
    start = time.perf_counter()
    runners[f] = make_runner(f, config, args)
    # Progress on stderr (the parent passes it through), so that a run stopped by a
    # time limit still says which phase it was in.
    print(f"{size} {f}: state and batches built in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    runners[f](2)  # warm-up: compilation, allocator, caches
    hostmem.trim()  # as train.py after its first step (attnscale/runtime/hostmem.py)
    out[f] = (time.perf_counter() - start, [])
    print(f"{size} {f}: compiled and ran 2 steps in {out[f][0]:.1f} s", file=sys.stderr,
          flush=True)
  now = time.process_time if args.clock == "cpu" else time.perf_counter
  for _ in range(args.rounds):
    for f, run in runners.items():
      start = now()
      run(args.steps)
      out[f][1].append((now() - start) / args.steps)
  return out


def measure_in_subprocess(size, framework, args) -> tuple[float, list[float]]:
  """Runs this script for one framework and size (--child); its last line is JSON."""
  cmd = [sys.executable, os.path.abspath(__file__), "--child", "--sizes", size,
         "--frameworks", framework, "--rounds", str(args.rounds), "--steps", str(args.steps),
         "--clock", args.clock]
  if args.dtype:
    cmd += ["--dtype", args.dtype]
  if args.dropout:
    cmd += ["--dropout", str(args.dropout)]
  if args.layernorm:
    cmd += ["--layernorm", args.layernorm]
  if args.malloc:  # else the child picks the default, as this process did
    cmd += ["--malloc", args.malloc]
  # stderr is not captured: the child's progress and errors show as they happen.
  proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
  if proc.returncode:
    sys.exit(f"error: {framework} at size {size} failed (its stderr is above)")
  warmup, times = json.loads(proc.stdout.strip().splitlines()[-1])
  return warmup, times


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="cpu,nanogpt", help=f"comma list of {list(SIZES)}")
  parser.add_argument("--frameworks", default="jax,torch", help=f"comma list of {list(FRAMEWORKS)}")
  parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--dtype", default=None, help="JAX compute dtype (e.g. bfloat16)")
  parser.add_argument("--dropout", type=float, default=0.0,
                      help="attnscale's dropout rate (PyTorch's twin has none: jax only); "
                           "for timing the compile of a train step that draws masks")
  parser.add_argument("--layernorm", choices=("native", "fused_xla", "xla"), default=None,
                      help="model.layernorm_impl of the JAX frameworks (default: the CPU's "
                           "default, native where it built)")
  parser.add_argument("--malloc", choices=list(hostmem.MODES), default=None,
                      help="glibc malloc tunables, as train.py's ATTNSCALE_MALLOC "
                           f"(default {hostmem.DEFAULT}): attnscale/runtime/hostmem.py")
  parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                      help="wall time, or the process's CPU time (cpu: with one thread per "
                           "framework on a shared machine, the work without the waits)")
  parser.add_argument("--in_process", action="store_true",
                      help="all frameworks in this process, rounds interleaved")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  sizes, frameworks = args.sizes.split(","), args.frameworks.split(",")
  for name, values, allowed in (("--sizes", sizes, SIZES), ("--frameworks", frameworks,
                                                            FRAMEWORKS)):
    if any(v not in allowed for v in values):
      parser.error(f"{name} must be a comma list of {list(allowed)}, got {','.join(values)!r}")
  if args.dropout and frameworks != ["jax"]:
    parser.error(f"--dropout {args.dropout} needs --frameworks jax (the PyTorch twin has "
                 "no dropout)")
  hostmem.reexec_with_tunables(args.malloc)  # as train.py does

  if args.child:  # one framework, one size: the parent reads the last line
    print(json.dumps(measure_in_process(sizes[0], frameworks[:1], args)[frameworks[0]]))
    return

  device = jax.devices()[0]
  kind = getattr(device, "device_kind", "") or platform.machine()
  peak = next((v for k, v in PEAK_BF16.items() if kind.startswith(k)), None)
  mode = "one process, interleaved rounds" if args.in_process else "one process per framework"
  print(f"# {device.platform}: {kind} ({platform.machine()}), {versions(frameworks)}, "
        f"{args.dtype or 'float32'}, dropout {args.dropout}, "
        f"LayerNorm {args.layernorm or 'default'}, "
        f"median of {args.rounds} rounds of {args.steps} steps, {args.clock} time "
        f"({mode}), GLIBC_TUNABLES: {os.environ.get('GLIBC_TUNABLES') or 'glibc defaults'}")
  if peak:
    print(f"# MFU against {kind}'s dense bf16 peak, {peak / 1e12:.0f} TFLOP/s")
  print("| size | params | tokens/step | framework | warm-up s | ms/step | tokens/s | MFU "
        "| attnscale / this |")
  print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
  for size in sizes:
    config = get_config(size, args)
    if args.in_process:
      results = measure_in_process(size, frameworks, args)
    else:
      results = {f: measure_in_subprocess(size, f, args) for f in frameworks}
    tokens = config.batch_size * config.seq_len
    m = config.model
    params = m.num_layers * 12 * m.width**2 + (m.vocab_size + m.block_size) * m.width
    ms = {f: statistics.median(t) * 1e3 for f, (_, t) in results.items()}
    ours = ms.get("jax")
    for f, t in ms.items():
      rate = tokens / t * 1e3
      mfu = f"{rate * flops_per_token(config) / peak:.1%}" if peak else "-"
      ratio = f"{t / ours:.2f}" if ours else "-"
      print(f"| {size} | {params / 1e6:.2f}M | {tokens} | {FRAMEWORKS[f]} | "
            f"{results[f][0]:.1f} | {t:.1f} | {rate:,.0f} | {mfu} | {ratio} |", flush=True)


if __name__ == "__main__":
  main()
