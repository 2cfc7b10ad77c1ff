"""A notebook's training speed: the default Jupyter kernel, the attnscale kernel, train.py.

    python benchmarks/notebook_kernel.py                  # cpu preset, 150 steps, 2 rounds
    python benchmarks/notebook_kernel.py --steps 300 --rounds 3

A notebook that trains in its kernel (compare_scalings does, through
`train_lib.train_and_evaluate`) runs in a process that never re-executed itself
with glibc's malloc tunables (attnscale/runtime/hostmem.py), unlike train.py.
This starts real Jupyter kernels from two kernelspecs of this interpreter, the
plain one (`python -m ipykernel_launcher`, what "Python 3" starts) and
`hostmem.kernel_spec()` (what `python -m attnscale.runtime.hostmem
install-kernel` installs: the same with GLIBC_TUNABLES in its env), runs the
same `train_and_evaluate` call in each, and runs train.py with the same config;
rounds interleave the three. Steps/s: the run's own `train/steps_per_s` rows
(compilation and evaluation excluded), the first interval dropped (warm-up), the
mean of the rest; the table prints each round and the median. Needs
jupyter_client and ipykernel (the `notebooks` or `test` extra) and the data
(ATTNSCALE_DATA offline).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # attnscale and configs/ from this checkout
from attnscale.runtime import hostmem  # noqa: E402

VARIANTS = ("default kernel", "attnscale kernel", "train.py")
# What a notebook cell runs: the config, then train_and_evaluate in this process.
CELL = """
import sys; sys.path.insert(0, {root!r})
from attnscale.runtime import train_lib
from configs import shakespeare_char
config = shakespeare_char.get_config("preset=cpu")
config.update_from_flattened_dict({overrides!r})
train_lib.train_and_evaluate(config, {workdir!r})
"""


def overrides(steps: int, log_every: int) -> dict:
  """The cpu preset, `steps` long, no checkpoint or evaluation before the end."""
  return {"num_train_steps": steps, "log_every": log_every, "eval_every": steps,
          "checkpoint_every": steps}


def steps_per_s(workdir: str) -> float:
  """The mean of the run's steps/s rows after the first (warm-up) interval."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  speeds = [r["train/steps_per_s"] for r in rows if "train/steps_per_s" in r]
  return statistics.mean(speeds[1:] or speeds)


def run_kernel(spec: dict, code: str, timeout: float) -> None:
  """Starts a Jupyter kernel from `spec` (a kernel.json dict), runs `code`, shuts it down."""
  from jupyter_client import KernelManager
  from jupyter_client.kernelspec import KernelSpecManager
  with tempfile.TemporaryDirectory() as kernels:
    os.makedirs(os.path.join(kernels, "bench"))
    with open(os.path.join(kernels, "bench", "kernel.json"), "w") as f:
      json.dump(spec, f)
    km = KernelManager(kernel_name="bench",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernels]))
    # The kernel inherits this process's environment: drop the tunables it re-executed
    # with, so that only the kernelspec's env decides.
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    km.start_kernel(env=env)
    try:
      kc = km.client()
      kc.start_channels()
      kc.wait_for_ready(timeout=120)
      reply = kc.execute_interactive(code, timeout=timeout, output_hook=lambda msg: None)
      if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the cell failed: {reply['content'].get('evalue')}")
      kc.stop_channels()
    finally:
      km.shutdown_kernel(now=True)


def run_variant(variant: str, workdir: str, args) -> float:
  over = overrides(args.steps, args.log_every)
  if variant == "train.py":
    flags = [f"--config.{k}={v}" for k, v in over.items()]
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}  # it sets its own
    subprocess.run([sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=cpu",
                    f"--workdir={workdir}", *flags], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, timeout=args.timeout)
  else:
    spec = hostmem.kernel_spec() if variant == "attnscale kernel" else {
        **hostmem.kernel_spec(), "env": {}}
    run_kernel(spec, CELL.format(root=ROOT, overrides=over, workdir=workdir), args.timeout)
  return steps_per_s(workdir)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--log_every", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--timeout", type=float, default=1800)
  args = parser.parse_args()
  results = {v: [] for v in VARIANTS}
  start = time.time()
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      for v in VARIANTS:
        workdir = os.path.join(tmp, f"{v.replace(' ', '_')}_{r}")
        results[v].append(run_variant(v, workdir, args))
        print(f"round {r + 1} | {v:16s} | {results[v][-1]:.2f} steps/s", flush=True)
  load = os.getloadavg()
  where = platform.processor() or platform.machine()
  print(f"\ncpu preset, {args.steps} steps, {args.rounds} rounds; {where}, {os.cpu_count()} "
        f"CPUs; load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"{time.time() - start:.0f} s\n")
  print("| " + " | ".join(VARIANTS) + " |")
  print("|" + "---|" * len(VARIANTS))
  print("| " + " | ".join(f"{statistics.median(results[v]):.2f}" for v in VARIANTS)
        + " |  (steps/s, median of the rounds)")
  print("| " + " | ".join(" ".join(f"{x:.2f}" for x in results[v]) for v in VARIANTS)
        + " |  (each round)")


if __name__ == "__main__":
  main()
