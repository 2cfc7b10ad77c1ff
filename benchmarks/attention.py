"""Forward+backward time and memory of every scaling on both attention paths.

    python benchmarks/attention.py                      # docs/benchmarks.md's tables
    python benchmarks/attention.py --seq 256,1024 --causal=false --dtype bfloat16
    python benchmarks/attention.py --seq 1024,4096 --scalings= # the kernel options only
    python benchmarks/attention.py --scalings= --options=   # the CPU kernels against torch
    OMP_NUM_THREADS=1 ATTNSCALE_NATIVE_THREADS=1 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false \
      intra_op_parallelism_threads=1" python benchmarks/attention.py --scalings= --options= \
      --clock cpu                                        # one thread each, CPU time

For each sequence length (batch x heads fixed), each scaling and each
implementation ("fused": folded into one kernel call, cuDNN on a GPU with bf16,
`attnscale.core.xla_attention` otherwise; "reference": materialised logits) it times a jitted value-and-grad of the attention output
w.r.t. q, k and v (median over --iters rounds that time every case in turn, after
a warm-up) and reports memory:
the device's peak bytes in use where the backend reports it (GPU/TPU), else the
compiled program's temporary buffers from XLA's memory analysis (CPU). The
ratio columns compare with `standard` on the same path; the target is every
scaling on the fused path within 1.15x of standard. The "kernel" column says
which kernel the fused path compiled to (cuDNN's custom call found in the
compiled program, or XLA): checked, not assumed. A further table compares the fused
standard attention with `jax.nn.dot_product_attention`'s default.

The kernels table (--kernels; "" skips it) times plain causal attention, forward
+ backward, on each CPU kernel: attnscale's native flash-attention kernel
(`attnscale.core.cpu_kernel`), its XLA kernel, and PyTorch's
`F.scaled_dot_product_attention` (its CPU flash kernel; needs `pip install torch`),
at the cpu preset's heads (4 of 32) and tokens per step (B T = 4096, so batch 64
at T = 64 and 1 at T = 4096), --kernel_seq lengths. Memory: the compiled
program's temporaries (JAX); PyTorch's is not measured (no CPU allocator stats).

The kernel-options table (--options; "" skips it) times the fused path, standard
scaling, with each option against plain softmax, same shapes and method: the
sigmoid normaliser (FlashSigmoid's claim: at least as fast as softmax), a logit
soft-cap (c = 50, Gemma 2's) and a per-head attention sink (gpt-oss; its
gradient taken too, as a model learns it). All run on attnscale's XLA kernel,
where jax.nn's cuDNN call cannot take them (the "kernel" column says which).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp

import attnscale
from attnscale.core import scalings

PARAMS = {"cosine": {"temperature": 10.0}, "key_norm_power": {"p": 2.0}}
# The kernel options' rows: `attention` keywords (the sink is made per head below).
OPTIONS = {"softmax": {}, "sigmoid": {"normalizer": "sigmoid"},
           "softcap": {"logit_softcap": 50.0}, "sink": {"sink": "per_head"}}


def _fwd_bwd(name, implementation, is_causal):
  scale_fn = scalings.get(name, **PARAMS.get(name, {}))

  def loss(q, k, v):
    if implementation == "jax_nn":  # jax.nn's own default, standard scaling
      out = jax.nn.dot_product_attention(q, k, v, is_causal=is_causal)
    else:
      out = attnscale.attention(q, k, v, scale_fn=scale_fn, is_causal=is_causal,
                                implementation=implementation)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _fwd_bwd_option(option, is_causal):
  """Value and gradient w.r.t. q, k, v (and the sink logits [N], as a model learns them)."""
  keywords = dict(OPTIONS[option])
  learned_sink = keywords.pop("sink", None) == "per_head"

  def loss(q, k, v, sink_N):
    out = attnscale.attention(q, k, v, is_causal=is_causal,
                              sink=sink_N if learned_sink else None, **keywords)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3) if learned_sink else (0, 1, 2)))


def compile_option(option, seq, args):
  """Like `compile_case` for a kernel-options row: (compiled, its arguments)."""
  dtype = jnp.dtype(args.dtype)
  shape = (args.batch, seq, args.heads, args.head_dim)
  qkv = tuple(jax.random.normal(key, shape, dtype)
              for key in jax.random.split(jax.random.key(0), 3))
  inputs = (*qkv, jnp.zeros((args.heads,), jnp.float32))
  compiled = _fwd_bwd_option(option, args.causal).lower(*inputs).compile()
  jax.block_until_ready(compiled(*inputs))  # warm-up
  return compiled, inputs


def compile_case(name, implementation, seq, args):
  dtype = jnp.dtype(args.dtype)
  shape = (args.batch, seq, args.heads, args.head_dim)
  qkv = tuple(jax.random.normal(key, shape, dtype)
              for key in jax.random.split(jax.random.key(0), 3))
  compiled = _fwd_bwd(name, implementation, args.causal).lower(*qkv).compile()
  jax.block_until_ready(compiled(*qkv))  # warm-up
  return compiled, qkv


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_round_robin(cases, iters, clock="wall"):
  """Median ms per case, timing the cases in turn, `iters` rounds.

  Interleaving spreads a noisy machine's slow spells over every case instead of
  charging them to whichever case happened to be running. clock="cpu" counts the
  process's CPU time instead of the wall's (every thread's): on a shared machine,
  with one thread per framework, the work a call costs without the time it waited.
  """
  now = CLOCKS[clock]
  times = {key: [] for key in cases}
  for _ in range(iters):
    for key, (compiled, qkv) in cases.items():
      t0 = now()
      jax.block_until_ready(compiled(*qkv))
      times[key].append(now() - t0)
  return {key: statistics.median(t) * 1e3 for key, t in times.items()}


def kernel_of(compiled) -> str:
  """"cudnn" or "native" if the compiled program calls cuDNN's fused attention or the
  native CPU kernel, else "xla"."""
  text = compiled.as_text()
  return "cudnn" if "__cudnn$fmha" in text else "native" if "attnscale_flash" in text else "xla"


class _TorchCase:
  """PyTorch's SDPA forward + backward at one shape, called as a compiled JAX case is."""

  def __init__(self, shape, dtype, is_causal):
    import torch
    import torch.nn.functional as F
    self.torch, self.F, self.is_causal = torch, F, is_causal
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    # [B, T, N, H] tensors seen as [B, N, T, H], as nanoGPT's view + transpose.
    self.qkv = [torch.randn(shape, dtype=torch_dtype).transpose(1, 2).requires_grad_()
                for _ in range(3)]

  def __call__(self, *unused):
    q, k, v = self.qkv
    out = self.F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)
    out.float().pow(2).sum().backward()
    for x in self.qkv:
      x.grad = None
    return out


def kernels_table(args, kernels):
  """Plain causal attention forward + backward on each CPU kernel, B T = 4096 tokens."""
  unknown = set(kernels) - {"native", "xla", "torch"}
  if unknown:
    raise ValueError(f"--kernels must be among ['native', 'xla', 'torch'], got {sorted(unknown)}")
  heads, head_dim = 4, 32  # the cpu preset's
  print(f"\n| seq | batch | {' | '.join(f'{k} ms' for k in kernels)} | "
        f"{' | '.join(f'{k} mem MiB' for k in kernels if k != 'torch')} | "
        f"{' | '.join(f'{k} / torch' for k in kernels if k != 'torch' and 'torch' in kernels)} |")
  print("|---:|---:|" + "---:|" * (len(kernels) * 2 - ("torch" in kernels)
                                 + sum(k != "torch" for k in kernels) * ("torch" in kernels)))
  for seq in map(int, args.kernel_seq.split(",")):
    batch = max(1, 4096 // seq)
    case_args = argparse.Namespace(**{**vars(args), "batch": batch, "heads": heads,
                                      "head_dim": head_dim})
    cases = {}
    for kernel in kernels:
      if kernel == "torch":
        case = _TorchCase((batch, seq, heads, head_dim), args.dtype, args.causal)
        case()  # warm-up
        cases[kernel] = (case, ())
      else:
        cases[kernel] = compile_case("standard", kernel, seq, case_args)
    ms = time_round_robin(cases, args.iters, args.clock)
    mems = [f"{_memory_bytes(cases[k][0]) / 2**20:.1f}" for k in kernels if k != "torch"]
    ratios = ([f"{ms[k] / ms['torch']:.2f}" for k in kernels if k != "torch"]
              if "torch" in kernels else [])
    print(f"| {seq} | {batch} | " + " | ".join(f"{ms[k]:.2f}" for k in kernels) + " | "
          + " | ".join(mems + ratios) + " |", flush=True)
    del cases


def _memory_bytes(compiled):
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"]
  analysis = compiled.memory_analysis()
  return analysis.temp_size_in_bytes if analysis is not None else float("nan")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq", default="256,1024,4096")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--causal", type=lambda s: s.lower() in ("1", "true", "yes"), default=True)
  parser.add_argument("--iters", type=int, default=7)
  parser.add_argument("--scalings", default=",".join(scalings.names()))
  parser.add_argument("--implementations", default="fused,reference")
  parser.add_argument("--kernels", default="native,xla,torch",
                      help="kernels-table columns (native, xla, torch); '' skips the table")
  parser.add_argument("--kernel_seq", default="64,128,256,512,1024,2048,4096")
  parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                      help="kernels table: wall time, or the process's CPU time (cpu: "
                           "with one thread per framework, the work without the waits)")
  parser.add_argument("--options", default=",".join(OPTIONS),
                      help="kernel-options rows (fused path, standard scaling); '' skips them")
  args = parser.parse_args(argv)

  device = jax.devices()[0]
  print(f"# {device.platform}: {getattr(device, 'device_kind', '?')} ({platform.processor() or platform.machine()}),"
        f" JAX {jax.__version__}, batch {args.batch} x heads {args.heads}, head_dim {args.head_dim},"
        f" {args.dtype}, causal={args.causal}, median of {args.iters} interleaved rounds")
  kernels = [k for k in args.kernels.split(",") if k]
  if kernels:
    kernels_table(args, kernels)
  if args.scalings:
    scaling_tables(args)
  options = [o for o in args.options.split(",") if o]
  if options:
    options_table(args, options)


def options_table(args, options):
  """Fused forward + backward of each kernel option against plain softmax."""
  unknown = set(options) - set(OPTIONS)
  if unknown:
    raise ValueError(f"--options must be among {list(OPTIONS)}, got {sorted(unknown)}")
  options = ["softmax"] + [o for o in options if o != "softmax"]
  print("\n| seq | option | kernel | fused ms | / softmax | fused mem MiB |")
  print("|---:|---|---|---:|---:|---:|")
  for seq in map(int, args.seq.split(",")):
    cases = {option: compile_option(option, seq, args) for option in options}
    ms = time_round_robin(cases, args.iters)
    for option in options:
      compiled = cases[option][0]
      print(f"| {seq} | {option} | {kernel_of(compiled)} | {ms[option]:.2f} | "
            f"{ms[option] / ms['softmax']:.2f} | {_memory_bytes(compiled) / 2**20:.0f} |",
            flush=True)
    del cases


def scaling_tables(args):
  """The scalings on both paths, and the fused standard against jax.nn's default."""
  print("| seq | scaling | kernel | fused ms | fused / std | fused mem MiB | ref ms | ref / std "
        "| ref mem MiB |")
  print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
  impls = {"fused": None, "reference": "reference"}
  labels = [label for label in impls if label in args.implementations.split(",")]
  names = ["standard"] + [n for n in args.scalings.split(",") if n != "standard"]
  worst, versus_jax_nn = 0.0, []
  for seq in map(int, args.seq.split(",")):
    cases = {(name, label): compile_case(name, impls[label], seq, args)
             for name in names for label in labels}
    if "fused" in labels:
      cases["standard", "jax_nn"] = compile_case("standard", "jax_nn", seq, args)
    ms = time_round_robin(cases, args.iters)
    if "fused" in labels:
      versus_jax_nn.append((seq, ms["standard", "jax_nn"], ms["standard", "fused"]))
    for name in names:
      cells = []
      for label in impls:
        if label not in labels:
          cells += ["-", "-", "-"]
          continue
        ratio = ms[name, label] / ms["standard", label]
        if label == "fused":
          worst = max(worst, ratio)
        mem = _memory_bytes(cases[name, label][0])
        cells += [f"{ms[name, label]:.2f}", f"{ratio:.2f}", f"{mem / 2**20:.0f}"]
      kernel = kernel_of(cases[name, "fused"][0]) if "fused" in labels else "-"
      print(f"| {seq} | {name} | {kernel} | " + " | ".join(cells) + " |", flush=True)
    del cases
  print(f"\nworst fused / standard ratio: {worst:.2f} (target <= 1.15)")
  if versus_jax_nn:
    print("\n| seq | jax.nn.dot_product_attention ms | attnscale fused ms | speed-up |")
    print("|---:|---:|---:|---:|")
    for seq, theirs, ours in versus_jax_nn:
      print(f"| {seq} | {theirs:.2f} | {ours:.2f} | {theirs / ours:.2f} |")


if __name__ == "__main__":
  main()
