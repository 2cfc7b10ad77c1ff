"""The cost of attention health in the train step: config.attn_metrics on and off.

    python benchmarks/attn_metrics.py                      # cpu preset: about a minute
    python benchmarks/attn_metrics.py --rounds 9 --steps 20
    python benchmarks/attn_metrics.py --preset graphcore_cpu --qk_clip 30

The train step `train.py` runs (`steps.make_train_step`), at a preset of
configs/shakespeare_char.py, built three ways: attn_metrics off (the program
train.py runs on every step it does not log), on (the per-layer max logit and
entropy from the fused kernel: the program of a logged step), and on with QK-clip
(`--qk_clip` tau; it needs the stats and rescales on every step, whether or not a
head is clipped). The last line is what train.py pays with attn_metrics on: one
logged step in `log_every` (the preset's) runs the metrics program. All three take the same real batches, in one process, rounds
interleaved (so a load change on the machine hits all of them alike); the table
reports the median ms per step and the overhead over "off". Like train.py it runs
under glibc's malloc tunables (`attnscale/runtime/hostmem.py`). Needs the data
(`ATTNSCALE_DATA` offline). Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/
from train_throughput import jax_runner as runner  # noqa: E402  (train.py's step, n at a time)

from attnscale import tasks  # noqa: E402
from attnscale.runtime import hostmem  # noqa: E402
from configs import shakespeare_char  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--preset", default="cpu", help="configs/shakespeare_char.py's preset")
  parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--qk_clip", type=float, default=30.0, help="tau of the third variant")
  args = parser.parse_args()
  hostmem.reexec_with_tunables(None)  # as train.py does

  variants = {"off": dict(attn_metrics=False), "attn_metrics": dict(attn_metrics=True),  # a logged step
              f"attn_metrics + qk_clip={args.qk_clip:g}": dict(attn_metrics=True,
                                                               qk_clip=args.qk_clip)}
  base = shakespeare_char.get_config(f"preset={args.preset}")
  task = tasks.get_task(base)
  batches_np = [task.train_batch(i) for i in range(args.steps)]
  runs, times = {}, {}
  for name, fields in variants.items():
    config = shakespeare_char.get_config(f"preset={args.preset}")
    config.update(fields)
    runs[name] = runner(config, batches_np)
    runs[name](2)  # compile and warm up
    times[name] = []
  for _ in range(args.rounds):
    for name, run in runs.items():
      start = time.perf_counter()
      run(args.steps)
      times[name].append((time.perf_counter() - start) / args.steps)

  off = statistics.median(times["off"])
  print(f"train step at preset={args.preset}, JAX {jax.__version__}, "
        f"{jax.devices()[0].platform} ({os.cpu_count()} cores), median of {args.rounds} "
        f"rounds of {args.steps} steps")
  print(f"| {'variant':<28} | ms/step | overhead |")
  print(f"|{'-' * 30}|--------:|---------:|")
  for name, values in times.items():
    ms = statistics.median(values)
    print(f"| {name:<28} | {1e3 * ms:7.1f} | {100 * (ms / off - 1):+7.1f}% |")
  every = base.log_every
  on = statistics.median(times["attn_metrics"])
  mean = ((every - 1) * off + on) / every
  label = f"train.py (log_every={every})"
  print(f"| {label:<28} | {1e3 * mean:7.1f} | {100 * (mean / off - 1):+7.1f}% |")


if __name__ == "__main__":
  main()
