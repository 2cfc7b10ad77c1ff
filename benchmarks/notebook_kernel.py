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
rounds interleave the three. Per run: steps/s, the run's own
`train/steps_per_s` rows (compilation and evaluation excluded) after the first
(warm-up) interval, averaged; and the process's CPU time a step, user + system,
from /proc between the metric rows of the first and the last logged step (the
tunables save system time: page faults; and a process's own CPU time is far less
disturbed than its wall time when other jobs share the cores). The table gives
the median over the rounds. Needs Linux (/proc),
jupyter_client and ipykernel (the `notebooks` or `test` extra) and the data
(ATTNSCALE_DATA offline).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
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
  speeds = [r["train/steps_per_s"] for r in _rows(workdir) if "train/steps_per_s" in r]
  return statistics.mean(speeds[1:] or speeds)


def _rows(workdir: str) -> list[dict]:
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return [json.loads(line) for line in f if line.endswith("\n")]
  except OSError:
    return []


def cpu_s(pid: int) -> tuple[float, float]:
  """(user, system) CPU seconds of process `pid` so far, all its threads (/proc/PID/stat)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  tick = os.sysconf("SC_CLK_TCK")
  return int(fields[11]) / tick, int(fields[12]) / tick


def watch_cpu(pid: int, workdir: str, first: int, last: int, running) -> tuple[float, float]:
  """CPU ms per step (user, system) of `pid` between the metric rows of steps `first`
  and `last`: the process's own time, which other jobs on the machine disturb far
  less than its wall time."""
  marks = {}
  while len(marks) < 2 and running():
    logged = {r["step"] for r in _rows(workdir) if "train/loss" in r}
    for step in (first, last):
      if step in logged and step not in marks:
        marks[step] = cpu_s(pid)
    time.sleep(0.05)
  if len(marks) < 2:
    return math.nan, math.nan
  return tuple(1e3 * (b - a) / (last - first) for a, b in zip(marks[first], marks[last]))


def run_variant(variant: str, workdir: str, args) -> tuple[float, float, float]:
  """(steps/s, user ms a step, system ms a step) of one run of `variant`."""
  over = overrides(args.steps, args.log_every)
  first, last = args.log_every, args.steps  # the first interval is warm-up
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}  # each sets its own
  if variant == "train.py":
    flags = [f"--config.{k}={v}" for k, v in over.items()]
    proc = subprocess.Popen(
        [sys.executable, "train.py", "--config=configs/shakespeare_char.py:preset=cpu",
         f"--workdir={workdir}", *flags], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    user, system = watch_cpu(proc.pid, workdir, first, last, lambda: proc.poll() is None)
    if proc.wait(args.timeout) != 0:
      raise RuntimeError(f"train.py failed in {workdir}")
    return steps_per_s(workdir), user, system
  from jupyter_client import KernelManager
  from jupyter_client.kernelspec import KernelSpecManager
  spec = hostmem.kernel_spec() if variant == "attnscale kernel" else {
      **hostmem.kernel_spec(), "env": {}}
  with tempfile.TemporaryDirectory() as kernels:
    os.makedirs(os.path.join(kernels, "bench"))
    with open(os.path.join(kernels, "bench", "kernel.json"), "w") as f:
      json.dump(spec, f)
    km = KernelManager(kernel_name="bench",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernels]))
    km.start_kernel(env=env, stderr=subprocess.DEVNULL)  # its start-up warnings
    try:
      kc = km.client()
      kc.start_channels()
      kc.wait_for_ready(timeout=120)
      msg_id = kc.execute(CELL.format(root=ROOT, overrides=over, workdir=workdir))
      pid = km.provisioner.process.pid
      replies = []

      def running():
        try:
          replies.append(kc.get_shell_msg(timeout=0.01))
        except queue.Empty:
          pass
        return not any(r["parent_header"].get("msg_id") == msg_id for r in replies)

      user, system = watch_cpu(pid, workdir, first, last, running)
      while running():
        pass
      reply = next(r for r in replies if r["parent_header"].get("msg_id") == msg_id)
      if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the cell failed: {reply['content'].get('evalue')}")
      kc.stop_channels()
    finally:
      km.shutdown_kernel(now=True)
  return steps_per_s(workdir), user, system


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
        speed, user, system = results[v][-1]
        print(f"round {r + 1} | {v:16s} | {speed:.2f} steps/s | CPU {user:.0f} + {system:.0f} "
              "ms a step (user + sys)", flush=True)
  load = os.getloadavg()
  where = platform.processor() or platform.machine()
  print(f"\ncpu preset, {args.steps} steps (the rows after step {args.log_every}), "
        f"{args.rounds} rounds interleaved; {where}, {os.cpu_count()} CPUs; load average at "
        f"the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {time.time() - start:.0f} s\n")
  print("| median of the rounds | " + " | ".join(VARIANTS) + " |")
  print("|---|" + "---:|" * len(VARIANTS))
  print("| steps/s (wall) | " + " | ".join(
      f"{statistics.median(x[0] for x in results[v]):.2f}" for v in VARIANTS) + " |")
  print("| CPU ms a step, user + sys | " + " | ".join(
      f"{statistics.median(x[1] for x in results[v]):.0f} + "
      f"{statistics.median(x[2] for x in results[v]):.0f}" for v in VARIANTS) + " |")


if __name__ == "__main__":
  main()
