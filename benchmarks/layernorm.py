"""LayerNorm forward + backward on each CPU kernel, at the char LM presets' shapes.

    python benchmarks/layernorm.py                      # docs/benchmarks.md's table
    python benchmarks/layernorm.py --clock cpu --iters 51 --dtype bfloat16
    python benchmarks/layernorm.py --shapes cpu --step cpu   # and the whole train step
    python benchmarks/layernorm.py --pack 4                  # vmapped over 4 runs

Times one jitted LayerNorm (width D, a gain, no bias: the model's blocks') that
returns y and the gradients of x and the gain for a given dy (a `jax.vjp`), on
each kernel of `attnscale.numerics.layer_norm`: "xla" (flax's nnx.LayerNorm
under autodiff, as the model ran it), "fused_xla" (flax's forward with the fused
backward as a custom_vjp) and "native" (`attnscale.core.cpu_kernel.norms`, C++
through jax.ffi), and PyTorch's `F.layer_norm` forward + backward (eager; needs
`pip install torch`). Shapes: the `cpu` preset's B T = 32 x 128 rows and
`nanogpt_cpu`'s 12 x 64 (configs/shakespeare_char.py), width 128, under
train.py's malloc tunables (attnscale/runtime/hostmem.py). The median of
--iters rounds that time every case in turn (a noisy machine's slow spells
spread over every case); "x 9" is the cost at the cpu preset's 9 LayerNorms a
step (2 per layer, 4 layers, and the final one).

Inside a whole train step XLA may fuse a LayerNorm with its neighbours, which a
custom call cannot: --step SIZE (a size of benchmarks/train_throughput.py, e.g.
`cpu`) also times train.py's step at that size with each JAX kernel as
`model.layernorm_impl`, the programs built in this process and their rounds
interleaved (--step_rounds rounds of --step_steps steps; needs the data,
ATTNSCALE_DATA). `train_throughput.py --layernorm` times one kernel's step
against PyTorch's.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_throughput
from attnscale import tasks  # noqa: E402
from attnscale.numerics import layer_norm  # noqa: E402
from attnscale.runtime import hostmem  # noqa: E402

SHAPES = {"cpu": (32, 128, 128), "nanogpt_cpu": (12, 64, 128)}  # B, T, D
KERNELS = ("xla", "fused_xla", "native", "torch")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
PER_STEP = 9  # LayerNorms a step at the cpu preset: 2 per layer x 4, and the final one


def jax_case(kernel, shape, dtype, pack=1):
  """(a function of no arguments that runs the case, its compiled HLO text); pack > 1:
  `jax.vmap` over that many runs' parameters and inputs, as a packed sweep runs them."""
  from flax import nnx
  B, T, D = shape
  ln = layer_norm.LayerNorm(D, use_bias=False, dtype=dtype, implementation=kernel,
                            rngs=nnx.Rngs(0))
  graph, params = nnx.split(ln)

  def fwd_bwd(params, x_BTD, dy_BTD):
    y_BTD, vjp = jax.vjp(lambda p, x: nnx.merge(graph, p)(x), params, x_BTD)
    dparams, dx_BTD = vjp(dy_BTD.astype(y_BTD.dtype))
    return y_BTD, dx_BTD, dparams

  keys = jax.random.split(jax.random.key(0), 2)
  runs = (pack,) if pack > 1 else ()
  x_BTD = jax.random.normal(keys[0], runs + shape, jnp.float32) * 2.0 + 0.5
  dy_BTD = jax.random.normal(keys[1], runs + shape, jnp.float32)
  if pack > 1:
    params = jax.tree.map(lambda p: jnp.stack([p] * pack), params)
    fwd_bwd = jax.vmap(fwd_bwd)
  compiled = jax.jit(fwd_bwd).lower(params, x_BTD, dy_BTD).compile()
  run = lambda: jax.block_until_ready(compiled(params, x_BTD, dy_BTD))
  run()  # warm-up
  return run, compiled.as_text()


def torch_case(shape, dtype):
  import torch
  import torch.nn.functional as F
  D = shape[-1]
  x = (torch.randn(shape) * 2.0 + 0.5).requires_grad_()
  weight = torch.ones(D, requires_grad=True)
  dy = torch.randn(shape, dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
  # A bfloat16 model's LayerNorm takes the float32 residual stream and returns bfloat16
  # (torch.autocast runs layer_norm in float32 and the next product casts).
  cast = dtype == "bfloat16"

  def run():
    y = F.layer_norm(x, (D,), weight, None, 1e-6)
    (y.to(torch.bfloat16) if cast else y).backward(dy)
    x.grad = weight.grad = None
  run()
  return run


def step_table(size, kernels, args):
  """train.py's step at `size` with each kernel as model.layernorm_impl, interleaved."""
  import train_throughput  # beside this file
  base = train_throughput.get_config(size, argparse.Namespace(dropout=0.0, dtype=None,
                                                              layernorm=None))
  if args.dtype != "float32":
    with base.unlocked():
      base.model.dtype = args.dtype
  batches_np = [tasks.get_task(base).train_batch(i) for i in range(args.step_steps)]
  runners = {}
  for kernel in kernels:
    config = copy.deepcopy(base)
    with config.unlocked():
      config.model.layernorm_impl = kernel
    runners[kernel] = train_throughput.jax_runner(config, batches_np)
    runners[kernel](2)  # warm-up: compilation, allocator, caches
  hostmem.trim()
  now = CLOCKS[args.clock]
  times = {kernel: [] for kernel in kernels}
  for _ in range(args.step_rounds):
    for kernel, run in runners.items():
      t0 = now()
      run(args.step_steps)
      times[kernel].append((now() - t0) / args.step_steps)
  ms = {kernel: statistics.median(t) * 1e3 for kernel, t in times.items()}
  print(f"\n| `{size}` train step | model.layernorm_impl | ms/step | / xla |")
  print("|---|---|---:|---:|")
  for kernel in kernels:
    ratio = f"{ms[kernel] / ms['xla']:.3f}" if "xla" in ms else "-"
    print(f"| {size} | {kernel} | {ms[kernel]:.1f} | {ratio} |", flush=True)


def time_round_robin(cases, iters, clock):
  now = CLOCKS[clock]
  times = {key: [] for key in cases}
  for _ in range(iters):
    for key, run in cases.items():
      t0 = now()
      run()
      times[key].append(now() - t0)
  return {key: statistics.median(t) * 1e3 for key, t in times.items()}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {list(SHAPES)}")
  parser.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of {KERNELS}")
  parser.add_argument("--dtype", default="float32",
                      help="y's dtype (x, the residual stream, is float32): float32 | bfloat16")
  parser.add_argument("--iters", type=int, default=31)
  parser.add_argument("--pack", type=int, default=1,
                      help="R > 1: each JAX case vmapped over R runs (a packed sweep's step); "
                           "PyTorch is left out")
  parser.add_argument("--step", default="",
                      help="also time train.py's step at this size (e.g. cpu) on each JAX kernel")
  parser.add_argument("--step_rounds", type=int, default=5)
  parser.add_argument("--step_steps", type=int, default=10)
  parser.add_argument("--malloc", choices=list(hostmem.MODES), default=None,
                      help=f"glibc malloc tunables, as train.py's (default {hostmem.DEFAULT})")
  parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                      help="wall time, or the process's CPU time (every thread's; on a shared "
                           "machine, the work without the waits)")
  args = parser.parse_args(argv)
  kernels = args.kernels.split(",")
  if args.pack > 1:
    kernels = [k for k in kernels if k != "torch"]
  if any(k not in KERNELS for k in kernels):
    parser.error(f"--kernels must be a comma list of {KERNELS}, got {args.kernels!r}")
  dtype = jnp.dtype(args.dtype)
  hostmem.reexec_with_tunables(args.malloc)  # as train.py: XLA's buffers cost no page faults

  device = jax.devices()[0]
  torch_text = ""
  if "torch" in kernels:
    import torch
    torch_text = f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
  print(f"# {device.platform}: {platform.processor() or platform.machine()}, JAX "
        f"{jax.__version__}{torch_text}, x float32 -> y {args.dtype}, pack {args.pack}, "
        f"median of {args.iters} "
        f"interleaved rounds, {args.clock} time, GLIBC_TUNABLES: "
        f"{os.environ.get('GLIBC_TUNABLES') or 'glibc defaults'}")
  print("| shape | rows x D | kernel | ran | ms | x 9 ms | / torch |")
  print("|---|---|---|---|---:|---:|---:|")
  for name in [s for s in args.shapes.split(",") if s]:
    shape = SHAPES[name]
    cases, ran = {}, {}
    for kernel in kernels:
      if kernel == "torch":
        cases[kernel], ran[kernel] = torch_case(shape, args.dtype), "torch"
        continue
      cases[kernel], text = jax_case(kernel, shape, dtype, args.pack)
      ran[kernel] = "native" if "attnscale_layer_norm" in text else "xla"
    ms = time_round_robin(cases, args.iters, args.clock)
    for kernel in kernels:
      ratio = f"{ms[kernel] / ms['torch']:.2f}" if "torch" in ms else "-"
      print(f"| {name} | {shape[0] * shape[1]} x {shape[2]} | {kernel} | {ran[kernel]} | "
            f"{ms[kernel]:.3f} | {ms[kernel] * PER_STEP:.2f} | {ratio} |", flush=True)
    del cases
  if args.step:
    step_table(args.step, [k for k in kernels if k != "torch"], args)


if __name__ == "__main__":
  main()
