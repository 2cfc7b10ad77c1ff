"""Runs per hour of a sweep: K points packed into one program against one train.py a point.

    python benchmarks/sweep_throughput.py                  # graphcore_cpu and cpu: ~25 min
    python benchmarks/sweep_throughput.py --presets graphcore_cpu --packs 1,8 --steps 100
    python benchmarks/sweep_throughput.py --targets gpu-h100x1,tpu-v5e-1 --packs 0   # compiled

CPU rows: each configuration runs as a sweep runs it, as real processes on
temporary run directories: `python -m attnscale.commands.train --runs=...` for a pack of K
runs (what `sweep.py --pack=K` starts: seeds 0 ... K-1 at one learning rate), and
today's `sweep.py --jobs=2`: two `train.py` processes at once, each pinned to one
core (`--jobs=2 --pack=K` pins two packs the same way). Each trains --steps
steps. From each run's metrics.jsonl (its log rows' elapsed time, which
excludes compilation, from the first log row to the last) the steady step time;
from the process's wall time less those steps, the start-up (imports, data,
compilation, the end's evaluation and checkpoint). A whole run of the preset
(num_train_steps: graphcore_cpu 1500, cpu 1000) then takes start-up + steps x
step time, and runs per hour = 3600 x runs at once / that. The last column is
against `--jobs=2`, measured in the same invocation.

Accelerator rows (--targets; needs JAX 0.12 with libtpu and the CUDA plugin, as
compile.py): the packed train step compiled for one H100 or one TPU v5e chip
without the hardware (`attnscale.runtime.packed.lower`, `attnscale.runtime.aot`),
at K = 1 and --probe_pack: memory per device, the roofline step time (a lower
bound: max(FLOPs / peak, bytes / bandwidth); on GPUs the FLOPs' alone, XLA's GPU
compiler gives no byte count) and the runs x steps per second it bounds. Memory
is linear in K, so the two give the largest K that fits, which is compiled too.
Compiled, not run: a tiny model's real step on a GPU is bound by its kernels'
launches (a few microseconds each, hundreds a step), far above this roofline,
which is what packing amortises.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # configs/, attnscale/ from a checkout
from attnscale.runtime import hostmem, metrics_writer, packing  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "shakespeare_char.py")
# The rate the sweeps' packs train at: every run of a pack trains here (the speed
# does not depend on it); graphcore_cpu's best for standard attention.
LEARNING_RATE = 2.0**-9


def run_config(preset: str, seed: int, steps: int) -> dict:
  """One run's spec for `packing.command`: the preset at --steps steps, logging as the
  preset does, one evaluation and one checkpoint at the end (as a run's last steps)."""
  config = packing.load_config(f"{CONFIG}:preset={preset}")
  log_every = min(config.log_every, max(steps // 5, 1))
  return {"config": f"{CONFIG}:preset={preset},seed={seed}",
          "overrides": {"learning_rate": LEARNING_RATE, "num_train_steps": steps,
                        "log_every": log_every, "eval_every": steps,
                        "checkpoint_every": steps},
          "full_steps": config.num_train_steps}


def measure(preset: str, pack: int, jobs: int, steps: int, tmp: str) -> dict:
  """Runs `jobs` processes at once (pinned to their own cores when jobs > 1), each
  training `pack` runs; returns the per-process step time and start-up (medians)."""
  procs, specs = [], []
  cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
  for j in range(jobs):
    runs = [run_config(preset, seed, steps) | {"workdir": os.path.join(tmp, f"seed{seed}")}
            for seed in range(j * pack, (j + 1) * pack)]
    spec = [{k: r[k] for k in ("config", "overrides", "workdir")} for r in runs]
    command = (packing.command(spec, sys.executable) if pack > 1 else
               [sys.executable, "train.py", f"--config={spec[0]['config']}",
                f"--workdir={spec[0]['workdir']}"]
               + [f"--config.{k}={v}" for k, v in spec[0]["overrides"].items()])
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if jobs > 1 and len(cpus) >= jobs:
      os.sched_setaffinity(proc.pid, set(cpus[j::jobs]))
    procs.append((proc, start))
    specs.append(runs)
  walls = []
  for proc, start in procs:
    _, err = proc.communicate()
    if proc.returncode:
      raise RuntimeError(f"{preset} pack {pack} jobs {jobs}: exit {proc.returncode}: "
                         f"{err[-2000:]}")
    walls.append(time.perf_counter() - start)
  step_s, startup_s = [], []
  for runs, wall in zip(specs, walls):
    rows = [r for r in metrics_writer.read_rows(runs[0]["workdir"]) if "train/elapsed_s" in r]
    first, last = rows[0], rows[-1]
    per_step = ((last["train/elapsed_s"] - first["train/elapsed_s"])
                / (last["step"] - first["step"]))
    step_s.append(per_step)
    startup_s.append(wall - per_step * steps)
  return {"step_s": statistics.median(step_s), "startup_s": statistics.median(startup_s),
          "full_steps": specs[0][0]["full_steps"]}


def cpu_rows(args) -> None:
  print(f"# {platform.machine()}, {os.cpu_count()} CPUs, {_versions()}, {args.steps} steps "
        f"a measurement, GLIBC_TUNABLES: {os.environ.get('GLIBC_TUNABLES') or 'defaults'}, "
        f"load before: {os.getloadavg()[0]:.1f}")
  print("| preset | runs a process (K) | processes (--jobs) | ms / step | start-up s "
        "| s / run | runs / hour | x --jobs=2 |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  configs = [(1, 2)] + [(k, 1) for k in args.packs if k] + [(k, 2) for k in args.packs_jobs2]
  for preset in args.presets:
    baseline = None
    for pack, jobs in configs:
      tmp = tempfile.mkdtemp(prefix="sweep_throughput_")
      try:
        m = measure(preset, pack, jobs, args.steps, tmp)
      finally:
        shutil.rmtree(tmp, ignore_errors=True)
      run_s = m["startup_s"] + m["full_steps"] * m["step_s"]
      per_hour = 3600 * pack * jobs / run_s
      baseline = baseline or per_hour
      print(f"| {preset} | {pack} | {jobs} | {m['step_s'] * 1e3:.1f} | {m['startup_s']:.1f} "
            f"| {run_s:.0f} | {per_hour:.0f} | {per_hour / baseline:.2f} |", flush=True)


def accelerator_row(preset: str, config, name: str, k: int) -> dict:
  """Compiles the packed step of `k` runs for target `name`, prints its row and
  returns its memory (`aot._compile`'s)."""
  import jax

  from attnscale.runtime import aot, packed
  t = aot.target(name)
  lowered, info = packed.lower(config, k, name)
  state, cfg = info["state"], info["model"]
  fixed = {"parameters": aot._sharded_bytes(state["params"]),
           "optimizer_state": aot._sharded_bytes(state["opt_state"]),
           "batch": aot._sharded_bytes(info["train_batch"])}
  one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), state["params"])
  num_params = sum(x.size for x in jax.tree.leaves(one))
  analytic = k * aot.analytic_flops(cfg, num_params, aot._position_params(one),
                                    config.batch_size * config.seq_len, train=True)
  r = aot._compile(lowered, t, fixed, t.memory_bytes, analytic, one, info["train_batch"], 1,
                   (cfg.num_heads, cfg.kv_heads, cfg.head_dim))
  bound = r.get("roofline", {}).get("step_s_lower_bound")
  print(f"| {preset} | {name} | {r.get('kernel', '-')} | {k} | "
        f"{r['memory']['total'] / 2**30:.2f} GiB | {'yes' if r['memory']['fits'] else 'no'} "
        f"| {f'{bound * 1e3:.3f} ms' if bound else '-'} "
        f"| {f'{k / bound:,.0f}' if bound else '-'} |", flush=True)
  return r["memory"]


def accelerator_rows(args) -> None:
  import jax

  from attnscale.runtime import aot
  print(f"# compiled without the hardware (JAX {jax.__version__}): the packed train step of "
        "K runs on one device; not run")
  print("| preset | target | kernel | K | memory / device | fits | step >= (roofline) "
        "| runs x steps / s <= |")
  print("|---|---|---|---:|---:|---|---:|---:|")
  for preset in args.presets:
    config = packing.load_config(f"{CONFIG}:preset={preset}")
    for name in args.targets:
      # Memory grows linearly in K (each run its own state and activations): two
      # compiles give the line, a third checks the largest K it predicts.
      small = accelerator_row(preset, config, name, 1)
      large = accelerator_row(preset, config, name, args.probe_pack)
      per_run = (large["total"] - small["total"]) / (args.probe_pack - 1)
      fixed_bytes = small["total"] - per_run
      memory = aot.target(name).memory_bytes
      largest = int((memory - fixed_bytes) // per_run) if per_run > 0 else None
      fits = (largest is not None and largest > args.probe_pack
              and accelerator_row(preset, config, name, largest)["fits"])
      print(f"# {preset} on {name}: {per_run / 2**20:.1f} MiB a run, the largest K that fits "
            f"is about {largest} ({'compiled and fits' if fits else 'not confirmed'})")


def _versions() -> str:
  import jax
  return f"JAX {jax.__version__}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--presets", default="graphcore_cpu,cpu")
  parser.add_argument("--packs", default="1,2,4,8,16",
                      help="K of one packed process each (0 or empty: no CPU rows)")
  parser.add_argument("--packs_jobs2", default="8", help="K of two pinned packed processes")
  parser.add_argument("--steps", type=int, default=100, help="steps a measurement")
  parser.add_argument("--targets", default="", help="compile targets (aot.TARGETS), e.g. "
                      "gpu-h100x1,tpu-v5e-1")
  parser.add_argument("--probe_pack", type=int, default=16,
                      help="the second K compiled for the memory line (the first is 1)")
  args = parser.parse_args()
  args.presets = args.presets.split(",")
  args.packs = [int(k) for k in args.packs.split(",") if k]
  args.packs_jobs2 = [int(k) for k in args.packs_jobs2.split(",") if k]
  args.targets = [t for t in args.targets.split(",") if t]
  if args.targets:  # compiled, never run: the host's CPU is the only backend needed (compile.py)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  hostmem.reexec_with_tunables()  # as train.py, so its children inherit the tunables
  if any(args.packs):
    cpu_rows(args)
  if args.targets:
    accelerator_rows(args)


if __name__ == "__main__":
  main()
