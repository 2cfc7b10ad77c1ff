"""Forward+backward time and memory of every scaling on both attention paths.

    python benchmarks/attention.py                      # the README's table
    python benchmarks/attention.py --seq 256,1024 --causal=false --dtype bfloat16

For each sequence length (batch x heads fixed), each scaling and each
implementation ("fused": folded into `jax.nn.dot_product_attention`; "reference":
materialised logits) it times a jitted value-and-grad of the attention output
w.r.t. q, k and v (median over --iters runs after a warm-up) and reports memory:
the device's peak bytes in use where the backend reports it (GPU/TPU), else the
compiled program's temporary buffers from XLA's memory analysis (CPU). The
ratio columns compare with `standard` on the same path; the target is every
scaling on the fused path within 1.15x of standard.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp

import attnscale
from attnscale import scalings

PARAMS = {"cosine": {"temperature": 10.0}, "key_norm_power": {"p": 2.0}}


def _fwd_bwd(name, implementation, is_causal):
  scale_fn = scalings.get(name, **PARAMS.get(name, {}))

  def loss(q, k, v):
    out = attnscale.attention(q, k, v, scale_fn=scale_fn, is_causal=is_causal,
                              implementation=implementation)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def measure(name, implementation, seq, args):
  dtype = jnp.dtype(args.dtype)
  shape = (args.batch, seq, args.heads, args.head_dim)
  q, k, v = (jax.random.normal(key, shape, dtype)
             for key in jax.random.split(jax.random.key(0), 3))
  fn = _fwd_bwd(name, implementation, args.causal)
  compiled = fn.lower(q, k, v).compile()
  jax.block_until_ready(compiled(q, k, v))  # warm-up
  times = []
  for _ in range(args.iters):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(q, k, v))
    times.append(time.perf_counter() - t0)
  return statistics.median(times) * 1e3, _memory_bytes(compiled)


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
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--scalings", default=",".join(scalings.names()))
  parser.add_argument("--implementations", default="fused,reference")
  args = parser.parse_args(argv)

  device = jax.devices()[0]
  print(f"# {device.platform}: {getattr(device, 'device_kind', '?')} ({platform.processor() or platform.machine()}),"
        f" JAX {jax.__version__}, batch {args.batch} x heads {args.heads}, head_dim {args.head_dim},"
        f" {args.dtype}, causal={args.causal}, median of {args.iters}")
  print("| seq | scaling | fused ms | fused / std | fused mem MiB | ref ms | ref / std | ref mem MiB |")
  print("|---:|---|---:|---:|---:|---:|---:|---:|")
  impls = {"fused": None, "reference": "reference"}
  chosen = args.implementations.split(",")
  worst = 0.0
  for seq in map(int, args.seq.split(",")):
    base = {}
    for name in ["standard"] + [n for n in args.scalings.split(",") if n != "standard"]:
      cells = []
      for label in ("fused", "reference"):
        if label not in chosen:
          cells += ["-", "-", "-"]
          continue
        ms, mem = measure(name, impls[label], seq, args)
        base.setdefault(label, ms)
        ratio = ms / base[label]
        if label == "fused":
          worst = max(worst, ratio)
        cells += [f"{ms:.2f}", f"{ratio:.2f}", f"{mem / 2**20:.0f}"]
      print(f"| {seq} | {name} | " + " | ".join(cells) + " |", flush=True)
  print(f"\nworst fused / standard ratio: {worst:.2f} (target <= 1.15)")


if __name__ == "__main__":
  main()
