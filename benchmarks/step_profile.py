"""Where a train step's time goes: the step's XLA ops, timed and summed by source line.

    python benchmarks/step_profile.py                                   # char LM, cpu preset
    python benchmarks/step_profile.py --config=configs/bert_small.py:preset=cpu
    python benchmarks/step_profile.py --config=configs/shakespeare_char.py:preset=graphcore_cpu \
        --threads 1 --top 30
    python benchmarks/step_profile.py --set model.positions=learned --by op

Builds the program `train.py` runs on the steps it does not log
(`steps.make_train_step`, attention metrics off unless QK-clip needs them),
runs --steps steps under `jax.profiler.trace`, and reads the trace back
(`jax.profiler.ProfileData`): every op the executable ran, with its time. Each op
is mapped to the Python line that made it through the optimized HLO's stack
frames (the innermost frame inside attnscale/, so `Dense.__call__` and the
attention kernel's lines, not jax's), and to its direction from the op name XLA
keeps (`jvp(...)` forward, `transpose(jvp(...))` backward; the optimizer's
update is "update"). The table sums ms per step by (direction, line) (`--by
line`, default), by the line alone (`--by site`), or lists single ops (`--by op`,
with their shapes), largest first, with each row's share of the op time.

The profiler costs time of its own (tens of percent on CPU, more on small ops),
so the totals are larger than a step's: the first line gives the step's
unprofiled CPU and wall time per step (median of --rounds rounds) to compare
with, and the shares are what to read. `--threads 1` runs XLA:CPU on one thread
(`--xla_cpu_multi_thread_eigen=false`, intra-op threads 1), which with `taskset
-c N` gives a step whose CPU time other jobs disturb least (docs/benchmarks.md).
Like train.py it runs under glibc's malloc tunables (`attnscale/runtime/hostmem.py`).
Needs the data (`ATTNSCALE_DATA` offline).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # configs/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_throughput


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/shakespeare_char.py:preset=cpu",
                      help="FILE:ARG, as train.py's --config (a path)")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="a config override, as train.py's --config.FIELD=VALUE (JSON value "
                           "or a string); repeatable")
  parser.add_argument("--steps", type=int, default=5, help="steps profiled (and per round)")
  parser.add_argument("--rounds", type=int, default=3, help="unprofiled rounds timed first")
  parser.add_argument("--threads", type=int, default=0,
                      help="1: XLA:CPU on one thread; 0: its default")
  parser.add_argument("--by", choices=("line", "site", "op"), default="line")
  parser.add_argument("--top", type=int, default=25, help="rows printed")
  parser.add_argument("--dropout", action="store_true", help="keep the preset's dropout "
                      "(default: off, as benchmarks/train_throughput.py)")
  return parser.parse_args(argv)


def overrides(pairs: list[str]) -> dict:
  out = {}
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep:
      raise SystemExit(f"--set takes FIELD=VALUE, got {pair!r}")
    try:
      out[key] = json.loads(value)
    except json.JSONDecodeError:
      out[key] = value
  return out


def cpu_seconds() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


# --- The optimized HLO: op name -> (shape, op_name, stack frame) -------------------

_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+?(?:\{[^}]*\})?) ")


def hlo_index(hlo: str) -> tuple[dict, dict]:
  """({instruction: (shape, op_name, frame id)}, {frame id: [(file, line, function), ...]}).

  Frames run innermost first. The instruction table covers every computation;
  the trace names the executed ones (the entry's and its loops').
  """
  sections = {}
  current = None
  for line in hlo.splitlines():
    if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      current = sections.setdefault(line, {})
      continue
    if current is not None:
      m = re.match(r"^(\d+) (.*)$", line)
      if m:
        current[int(m.group(1))] = m.group(2)
        continue
      current = None
  files = {k: v.strip('"') for k, v in sections.get("FileNames", {}).items()}
  functions = {k: v.strip('"') for k, v in sections.get("FunctionNames", {}).items()}
  locations = {}
  for k, v in sections.get("FileLocations", {}).items():
    f = dict(re.findall(r"(\w+)=(\d+)", v))
    locations[k] = (files.get(int(f.get("file_name_id", 0)), "?"),
                    int(f.get("line", 0)), functions.get(int(f.get("function_name_id", 0)), "?"))
  parents = {}
  for k, v in sections.get("StackFrames", {}).items():
    f = dict(re.findall(r"(\w+)=(\d+)", v))
    parents[k] = (int(f.get("file_location_id", 0)), int(f.get("parent_frame_id", 0)))
  frames = {}
  for k in parents:
    chain, seen, node = [], set(), k
    while node in parents and node not in seen:
      seen.add(node)
      loc, parent = parents[node]
      if loc in locations:
        chain.append(locations[loc])
      node = parent
    frames[k] = chain
  instructions = {}
  for line in hlo.splitlines():
    m = _INSTR.match(line)
    if not m:
      continue
    op_name = re.search(r'op_name="([^"]*)"', line)
    frame = re.search(r"stack_frame_id=(\d+)", line)
    instructions[m.group(1)] = (m.group(2), op_name.group(1) if op_name else "",
                                int(frame.group(1)) if frame else 0)
  return instructions, frames


LIBRARY = "attnscale/"  # the package folder, as it appears in a frame's file path


def site(chain: list[tuple[str, int, str]]) -> str:
  """The innermost frame in attnscale's library, else the innermost one (jax's, flax's).

  XLA keeps a call stack per op, but the stack frames it prints name themselves
  as their parents, so in practice `chain` holds the innermost frame only.
  """
  for file, line, function in chain:
    if LIBRARY in file:
      # The last "attnscale/" is the package: a checkout is itself often a folder
      # named attnscale (git's default), as in /home/me/attnscale/attnscale/core/...
      return f"{file.rsplit(LIBRARY, 1)[-1]}:{line} {function}"
  for file, line, function in chain:
    return f"{file.split('site-packages/', 1)[-1]}:{line} {function}"
  return "(no source line)"


def direction(op_name: str) -> str:
  if "transpose(jvp" in op_name:
    return "backward"
  if "jvp(" in op_name:
    return "forward"
  return "update"


# --- The run ---------------------------------------------------------------------

def main(argv=None):
  """The command line: XLA's thread flags and malloc tunables, then `profile`."""
  args = parse_args(argv)
  if args.threads == 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false"
                               " intra_op_parallelism_threads=1").strip()
  from attnscale.runtime import hostmem
  hostmem.reexec_with_tunables()
  print(profile(args))


def profile(args: argparse.Namespace) -> str:
  """The table (markdown, with two header lines) for the parsed arguments."""
  import jax
  from train_throughput import unlogged_step  # beside this file

  from attnscale import tasks
  from attnscale.runtime import packing

  config_arg = args.config
  path, sep, arg = config_arg.partition(":")
  if not os.path.isfile(path) and os.path.isfile(os.path.join(ROOT, path)):
    config_arg = os.path.join(ROOT, path) + sep + arg
  config = packing.load_config(config_arg, overrides(args.set))
  if not args.dropout:
    with config.unlocked():
      config.model.dropout = 0.0
  task = tasks.get_task(config)
  step_fn, state, batches = unlogged_step(config, [task.train_batch(i)
                                                   for i in range(args.steps)])
  hlo = step_fn.lower(state, batches[0]).compile().as_text()

  def run():
    nonlocal state
    for batch in batches:
      state, metrics = step_fn(state, batch)
    jax.block_until_ready(metrics["loss"])

  run()  # compilation and warm-up
  cpu_ms, wall_ms = [], []
  for _ in range(args.rounds):
    c0, w0 = cpu_seconds(), time.perf_counter()
    run()
    cpu_ms.append((cpu_seconds() - c0) / args.steps * 1e3)
    wall_ms.append((time.perf_counter() - w0) / args.steps * 1e3)
  trace_dir = tempfile.mkdtemp(prefix="step_profile_")
  with jax.profiler.trace(trace_dir):
    run()
  trace = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0]
  trace_data = jax.profiler.ProfileData.from_file(trace)

  instructions, frames = hlo_index(hlo)
  times = collections.Counter()
  for plane in trace_data.planes:
    for line in plane.lines:
      if not line.name.startswith("tf_XLA"):  # XLA's executor threads, not Python's
        continue
      for event in line.events:
        if event.name in instructions:
          times[event.name] += event.duration_ns / 1e6 / args.steps
  total = sum(times.values())

  rows = collections.Counter()
  ops_in = collections.Counter()
  for name, ms in times.items():
    shape, op_name, frame = instructions[name]
    where = site(frames.get(frame, []))
    key = {"line": (direction(op_name), where), "site": ("", where),
           "op": (direction(op_name), f"{name} {shape} <- {where}")}[args.by]
    rows[key] += ms
    ops_in[key] += 1

  m = config.model
  threads = "1" if args.threads == 1 else "default"
  lines = [
      f"# {_cpu_model()}, JAX {jax.__version__}, {jax.devices()[0].platform} "
      f"x{jax.device_count()}, XLA threads: {threads}; {args.config} ({m.num_layers} x "
      f"{m.width}, batch {config.batch_size}, seq {config.seq_len})",
      f"# step unprofiled: {statistics.median(cpu_ms):.1f} ms CPU, "
      f"{statistics.median(wall_ms):.1f} ms wall (median of {args.rounds} rounds of "
      f"{args.steps}); profiled ops: {total:.1f} ms a step in {len(times)} ops",
      "| ms / step | share | ops | direction | where |",
      "|---:|---:|---:|---|---|"]
  for (dir_, where), ms in rows.most_common(args.top):
    lines.append(f"| {ms:.2f} | {ms / total:.1%} | {ops_in[(dir_, where)]} | {dir_ or '-'} "
                 f"| {where} |")
  shown = sum(ms for _, ms in rows.most_common(args.top))
  lines.append(f"| {total - shown:.2f} | {(total - shown) / total:.1%} | | | the other "
               f"{max(0, len(rows) - args.top)} rows |")
  return "\n".join(lines)


def platform_name() -> str:
  import platform
  return platform.processor() or platform.machine()


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform_name()


if __name__ == "__main__":
  main()
