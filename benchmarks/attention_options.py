"""Train-step cost of each attention option against standard attention, same model.

    python benchmarks/attention_options.py                      # every option, cpu preset
    python benchmarks/attention_options.py --options "rope:model.positions=rope" --rounds 7

Every option is `label:field=value[;field=value]` on the `cpu` preset's char LM
(4 layers, width 128, 4 heads, seq 128, batch 32; dropout off), timed with the
train step train.py runs (`benchmarks/train_throughput.py`'s `jax_runner`). All
options are compiled first, then timed in interleaved rounds (so machine noise
hits them alike); the table gives the median ms per step and the ratio to the
first option (standard). The target for every addition is 1.15x or less.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import statistics
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_throughput
import train_throughput  # noqa: E402

from attnscale.runtime import configlib, hostmem  # noqa: E402

OPTIONS = (
    "standard:",
    "rope:model.positions=rope",
    "no positions:model.positions=none",
    "log_n (rope):model.scaling=log_n;model.positions=rope",
    "log_n_ratio (rope):model.scaling=log_n_ratio;model.positions=rope",
    "qk_rmsnorm:model.scaling=qk_rmsnorm",
    "inverse_d:model.scaling=inverse_d",
    "logit_softcap 50:model.logit_softcap=50.0",
    "sink zero:model.sink=zero",
    "sink learned:model.sink=learned",
    "gate headwise:model.attn_gate=headwise",
    "gate elementwise:model.attn_gate=elementwise",
    "sigmoid (fused):model.normalizer=sigmoid",
)


def parse_option(text: str) -> tuple[str, dict]:
  label, _, rest = text.partition(":")
  overrides = {}
  for item in filter(None, rest.split(";")):
    key, _, value = item.partition("=")
    overrides[key] = value
  return label, overrides


def _parse(text: str, old):
  """The override's value, typed like the field's current one ("False" is False)."""
  if old is None or isinstance(old, str):
    return text
  value = ast.literal_eval(text)
  return float(value) if isinstance(old, float) else value


def config_for(overrides: dict, args):
  config = train_throughput.get_config("cpu", args)
  with config.unlocked():
    for key, text in overrides.items():
      node, *path = key.split(".")
      parent = config
      for part in [node] + path[:-1]:
        parent = parent[part]
      field = path[-1] if path else node
      if field not in parent:
        raise SystemExit(f"error: --options: unknown field {key!r}")
      old = parent[field]
      parent[field] = _parse(text, old)
  configlib.validate(config)
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--options", nargs="+", default=list(OPTIONS),
                      help="label:field=value;field=value (the first is the baseline)")
  parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--dtype", default=None)
  parser.add_argument("--skip_unknown", action="store_true",
                      help="leave out options whose fields this version lacks")
  args = parser.parse_args()
  hostmem.reexec_with_tunables()

  runners = {}
  for text in args.options:
    label, overrides = parse_option(text)
    try:
      config = config_for(overrides, args)
    except (SystemExit, ValueError, KeyError, AttributeError) as e:
      if args.skip_unknown:
        print(f"skipped {label}: {e}", file=sys.stderr)
        continue
      raise
    task_batches = train_throughput.tasks.get_task(config)
    batches = [task_batches.train_batch(i) for i in range(args.steps)]
    run = train_throughput.jax_runner(config, batches)
    run(2)  # compile and warm up
    runners[label] = (run, [])
  for _ in range(args.rounds):
    for run, times in runners.values():
      start = time.perf_counter()
      run(args.steps)
      times.append((time.perf_counter() - start) / args.steps)

  base = None
  print(f"# {platform.machine()} {jax.devices()[0].device_kind}, JAX {jax.__version__}, "
        f"cpu preset, median of {args.rounds} interleaved rounds of {args.steps} steps")
  print("| option | ms / step | x first |")
  print("|---|---:|---:|")
  for label, (_, times) in runners.items():
    ms = 1000 * statistics.median(times)
    base = base or ms
    print(f"| {label} | {ms:.1f} | {ms / base:.2f} |")


if __name__ == "__main__":
  main()
