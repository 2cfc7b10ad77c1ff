"""Ahead-of-time compilation for accelerators this machine does not have.

    report = aot.compile_report(config, "tpu-v5e-8")     # what compile.py prints

JAX compiles for targets it does not have. A TPU slice's devices come from
libtpu's topology description (`jax.experimental.topologies.get_topology_desc`,
what MaxText's train_compile.py does), H100s' from the CUDA plugin with a GPU
target config (`targets/h100_sxm.txtpb`); `jax.jit(step).lower(shapes with
shardings).compile()` then runs the real XLA (libtpu or CUDA) compiler on the
real train and eval steps (`attnscale.runtime.steps`, the functions train.py runs), over
the config's `mesh.data` x `mesh.fsdp` mesh of the target's devices. The
compiled program answers what a run would need without running it: per-device
memory (`memory_analysis`), FLOPs and bytes (`cost_analysis`), the attention
kernel and the collectives (its HLO).

What this verifies is compilation, kernel choice and memory; not numerics or
speed on the chip, nor collectives at run time. The roofline step time
(max(FLOPs / peak, bytes / bandwidth) per device) is a lower bound, an estimate.

Install: libtpu (`pip install -e ".[tpu]"`) for the TPU targets, the CUDA
plugin and cuDNN (`".[cuda12]"`) for the GPU ones; both need JAX 0.12
(Python >= 3.12). A missing one is a one-line error naming the install.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import tempfile
from typing import Any

import jax
import numpy as np

from attnscale.runtime import checkpoints as ckpt
from attnscale.runtime import startup, steps
from attnscale.runtime.aot_report import GiB, format_bytes
from attnscale.runtime.hlo import activation_collectives, attention_kernel, count_collectives

TARGET_DIR = os.path.join(os.path.dirname(__file__), "targets")


@dataclasses.dataclass(frozen=True)
class Target:
  """A compile target: its devices' description and the chip's published numbers.

  Attributes:
    platform: "tpu", "gpu" or "cpu".
    topology: libtpu's topology name ("v5e:2x4"), or the GPU topology ("1x1x8").
    memory_bytes: HBM per device.
    peak_flops: dense bf16 FLOP/s per device.
    bandwidth: HBM bytes/s per device.
    wrap: the TPU torus' wrap-around links per axis.
    gpu_config: the GPU target config file in `targets/`.
    host_bounds: chips per TPU host (a slice smaller than one host: its own shape).
    chip: what one device is, as its maker names it ("TPU v5p", "H100 SXM").
    cores_per_chip: TensorCores per TPU chip. Cloud TPU names count them
      (v5p-128 is 64 chips of 2), JAX makes one device of each chip (megacore).
  """

  platform: str
  topology: str = ""
  memory_bytes: float = 0.0
  peak_flops: float = 0.0
  bandwidth: float = 0.0
  wrap: tuple[bool, bool, bool] = (False, False, False)
  gpu_config: str = ""
  host_bounds: tuple[int, int, int] = (2, 2, 1)
  chip: str = ""
  cores_per_chip: int = 1


# Published per-chip figures (Google Cloud TPU system architecture pages; NVIDIA's
# H100 SXM5 datasheet): HBM, dense bf16 FLOP/s, HBM bandwidth. A TPU target's name
# counts TensorCores as Cloud TPU names them (v4-8 and v5p-128: 2 per chip).
_V4 = dict(memory_bytes=32 * GiB, peak_flops=275e12, bandwidth=1228e9, chip="TPU v4",
           cores_per_chip=2)
_V5E = dict(memory_bytes=16 * GiB, peak_flops=197e12, bandwidth=819e9, chip="TPU v5e")
_V5P = dict(memory_bytes=95 * GiB, peak_flops=459e12, bandwidth=2765e9, chip="TPU v5p",
            cores_per_chip=2)
_V6E = dict(memory_bytes=32 * GiB, peak_flops=918e12, bandwidth=1640e9, chip="TPU v6e")
_H100 = dict(memory_bytes=84978434048, peak_flops=989e12, bandwidth=3.35e12,
             gpu_config="h100_sxm.txtpb", chip="H100 SXM")
TARGETS: dict[str, Target] = {
    "tpu-v4-8": Target("tpu", "v4:2x2x1", **_V4),
    "tpu-v5e-1": Target("tpu", "v5e:1x1", host_bounds=(1, 1, 1), **_V5E),  # one chip
    "tpu-v5e-8": Target("tpu", "v5e:2x4", **_V5E),
    "tpu-v5e-256": Target("tpu", "v5e:16x16", wrap=(True, True, False), **_V5E),
    "tpu-v5p-8": Target("tpu", "v5p:2x2x1", **_V5P),
    "tpu-v5p-128": Target("tpu", "v5p:4x4x4", wrap=(True, True, True), **_V5P),
    "tpu-v6e-8": Target("tpu", "v6e:2x4", **_V6E),
    "tpu-v6e-64": Target("tpu", "v6e:8x8", **_V6E),
    "gpu-h100x1": Target("gpu", "1x1x1", **_H100),
    "gpu-h100x8": Target("gpu", "1x1x8", **_H100),
    "cpu": Target("cpu"),
}


def target(name: str) -> Target:
  """The target `name`; a one-line ValueError listing the known ones."""
  if name not in TARGETS:
    raise ValueError(f"--target must be one of {list(TARGETS)}, got {name!r}")
  return TARGETS[name]


def devices(name: str) -> list:
  """The devices of target `name`: compile-only descriptions for TPUs and GPUs."""
  t = target(name)
  if t.platform == "cpu":
    return jax.devices("cpu")
  from jax.experimental import topologies
  # libtpu takes a machine-wide lock file to guard a TPU; compiling opens none,
  # so several compiling processes (pytest workers, a benchmark) may share it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    with _stderr_without(_EVERY_LINE):
      topo = _topology(t, topologies)
  except Exception as e:  # noqa: BLE001 - the plugin is missing or too old
    extra = "tpu" if t.platform == "tpu" else "cuda12"
    raise ValueError(f"--target={name} needs {'libtpu' if extra == 'tpu' else 'the CUDA plugin'}"
                     f" (pip install -e \".[{extra}]\", JAX 0.12 on Python >= 3.12): "
                     f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
  return list(topo.devices)


def _topology(t: Target, topologies):
  if t.platform == "tpu":
    return topologies.get_topology_desc(
        platform="tpu", topology_name=t.topology, chip_config_name="default",
        chips_per_host_bounds=t.host_bounds, num_slices=1, wrap=t.wrap)
  with open(os.path.join(TARGET_DIR, t.gpu_config)) as f:
    return topologies.get_topology_desc(platform="cuda", target_config=f.read(),
                                        topology=t.topology)


# What libtpu prints when it loads on a machine that is not a TPU VM ("E0000 ...
# INVALID_ARGUMENT: Error: unexpected worker hostname", "could not determine TPU
# accelerator type": it looks for a TPU VM's metadata, which compiling does not
# need). A load that works says nothing else worth keeping: every line goes; a
# load that fails keeps them all.
_EVERY_LINE = re.compile("")
# XLA's GPU compiler, given a program larger than the device, logs it as an error
# of its own ("The byte size of input/output arguments (...) exceeds the base
# limit (...). This indicates an error in the calculation!") and a warning that
# rematerialization could not bring it down, then compiles it: the report's row
# says that it does not fit and by how much, so these lines go.
_COMPILE_NOISE = re.compile(r"This indicates an error in the calculation!|"
                            r"Can't reduce memory use below .* by rematerialization")


@contextlib.contextmanager
def _stderr_without(noise: re.Pattern, handled=lambda error: False):
  """Runs the block with file descriptor 2 (C++ libraries' logs) captured; then
  writes back the lines that do not match `noise`. If the block raises, every
  line is written back, or none if `handled(error)` (the caller reports it).

  libtpu and XLA log from C++ straight to the file descriptor, before and
  outside Python's logging: only the descriptor itself can be filtered.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  ok = False
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
      ok = True
    except Exception as e:
      if handled(e):
        noise = _EVERY_LINE
        ok = True
      raise
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      lines = captured.read().decode(errors="replace").splitlines(keepends=True)
      kept = [line for line in lines if not (ok and noise.search(line))]
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def _sharded_bytes(tree) -> int:
  """Bytes one device holds of `tree` (ShapeDtypeStructs with shardings)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape)
    total += math.prod(shard) * np.dtype(x.dtype).itemsize
  return total


def lower_steps(config, target_name: str):
  """(train, eval) lowered for `target_name`, and what the report needs of the state.

  The train step of `steps.make_train_step` and the eval step of
  `steps.make_eval_step`, lowered with ShapeDtypeStructs: nothing is allocated.
  The train step is the program train.py runs on the steps it does not log
  (without the attention metrics; with QK-clip, which needs them every step, the
  clipping program): the logged steps' program adds forward-only statistics
  (on splash and cuDNN, a stats-only XLA pass: docs/guides/training.md).
  """
  devs = devices(target_name)
  s = startup.start(config, devices=devs, data=False)
  run, task, mesh, graphdef, shardings = s.run, s.task, s.mesh, s.graphdef, s.shardings
  state = ckpt.abstract_state(s.shapes, shardings)
  batch_sharding = s.batch_sharding
  train_spec = type(task).batch_spec(run)
  train_batch = ckpt.abstract_state(train_spec, {k: batch_sharding for k in train_spec})
  eval_spec = type(task).batch_spec(run, train=False)
  eval_batch = ckpt.abstract_state(eval_spec, {k: batch_sharding for k in eval_spec})
  train_step = steps.make_train_step(graphdef, task, run, shardings, batch_sharding,
                                     attn_metrics=False, optimizer=s.optimizer)
  eval_step = steps.make_eval_step(graphdef, task, shardings["params"], batch_sharding)
  lowered = {"train_step": train_step.lower(state, train_batch),
             "eval_step": eval_step.lower(state["params"], eval_batch)}
  info = {"mesh": dict(mesh.shape), "devices": devs, "run": run, "model": run.model,
          "state": state, "train_batch": train_batch, "eval_batch": eval_batch}
  return lowered, info


def compile_report(config, target_name: str) -> dict[str, Any]:
  """Compiles `config`'s train and eval steps for `target_name`; the report as a dict.

  A program that does not fit the device is a row with fits=False (TPU: XLA's
  compile-time out-of-memory; GPU: XLA does not refuse, so the memory analysis
  is compared with the device's memory here), not an exception.
  """
  t = target(target_name)
  lowered, info = lower_steps(config, target_name)
  devs, cfg = info["devices"], info["model"]
  params = info["state"]["params"]
  num_params = sum(x.size for x in jax.tree.leaves(params))
  memory_bytes = t.memory_bytes or _host_memory()
  report = {
      "target": target_name, "platform": t.platform,
      "device_kind": devs[0].device_kind, "num_devices": len(devs), "mesh": info["mesh"],
      "chip": t.chip or devs[0].device_kind, "cores_per_chip": t.cores_per_chip,
      "label": info["run"].run_label, "dtype": cfg.dtype, "remat": cfg.remat,
      "num_params": num_params, "device_memory_bytes": memory_bytes,
      "peak_flops": t.peak_flops, "bandwidth": t.bandwidth,
  }
  run = info["run"]
  tokens = {"train_step": run.batch_size * run.seq_len,
            "eval_step": run.batch_size * run.seq_len}
  for name, low in lowered.items():
    fixed = {"parameters": _sharded_bytes(params),
             "optimizer_state": (_sharded_bytes(info["state"]["opt_state"])
                                 if name == "train_step" else 0),
             "batch": _sharded_bytes(info["train_batch" if name == "train_step"
                                          else "eval_batch"])}
    analytic = analytic_flops(cfg, num_params, _position_params(params), tokens[name],
                              train=name == "train_step") / len(devs)
    batch = info["train_batch" if name == "train_step" else "eval_batch"]
    # XLA's cost analysis counts a loop's body once: the accumulated train step's
    # micro-batch loop runs grad_accum_steps times.
    trips = run.grad_accum_steps if name == "train_step" else 1
    report[name] = _compile(low, t, fixed, memory_bytes, analytic, params, batch, len(devs),
                            (cfg.num_heads, cfg.kv_heads, cfg.head_dim), loop_trips=trips)
  report["fits"] = all(report[name]["memory"]["fits"] for name in lowered)
  return report


def not_fitting(report: dict[str, Any]) -> str:
  """One line: which steps of `report` do not fit, by how much, and why."""
  parts = [f"{name} needs {format_bytes(report[name]['memory']['total'])} per device, "
           f"{format_bytes(report[name]['memory']['over_by'])} more than its "
           f"{format_bytes(report['device_memory_bytes'])} ({report[name]['why']})"
           for name in ("train_step", "eval_step") if not report[name]["memory"]["fits"]]
  return f"{report['label']} does not fit {report['target']}: " + "; ".join(parts)


def _host_memory() -> float:
  try:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  except (ValueError, OSError, AttributeError):
    return 0.0


def _position_params(params) -> int:
  return sum(x.size for path, x in jax.tree_util.tree_leaves_with_path(params)
             if "pos_embed" in jax.tree_util.keystr(path))


def analytic_flops(cfg, num_params: int, position_params: int, tokens: int, *,
                   train: bool) -> float:
  """FLOPs of one step: (6N + 12 L T D) per token to train, a third of it to evaluate.

  N excludes the position table (a lookup, no multiply); 12 L T D is attention's
  q.k and p.v (forward 2 x 2 L T D per token, times 3 with the backward),
  Kaplan et al. 2020 and nanoGPT's MFU estimate. Causal attention does half of
  the T x T work, which this count, as theirs, ignores.
  """
  per_token = 6 * (num_params - position_params) + 12 * cfg.num_layers * cfg.block_size * cfg.width
  return per_token * tokens / (1 if train else 3)


def _compile(lowered, t: Target, fixed: dict[str, int], memory_bytes: float,
             analytic_per_device: float, params, batch, num_devices: int,
             model_dims, loop_trips: int = 1) -> dict[str, Any]:
  row: dict[str, Any] = {"memory": dict(fixed)}
  try:
    # An out-of-memory is the report's row, which says why: its log line goes.
    with _stderr_without(_COMPILE_NOISE, handled=lambda e: _oom_bytes(str(e)) is not None):
      compiled = lowered.compile()
  except Exception as e:  # noqa: BLE001 - XLA's out-of-memory, reported as a row
    used = _oom_bytes(str(e))
    if used is None:
      raise
    # XLA names the temporaries it could not place; the state and batch come on top.
    total = used + sum(fixed.values())
    row["memory"].update({"temporaries": used, "total": total, "fits": False,
                          "over_by": total - memory_bytes})
    row["error"] = str(e).splitlines()[0][:300]
    # libtpu: "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory ...
    # (49.18G) exceeds available HBM (15.75G). HLO module: jit_traced."
    why = re.sub(r"^[A-Z_]+: (E\d+: )?", "", row["error"]).split(" HLO module:")[0]
    row["why"] = f"XLA's compile-time out-of-memory: {why.rstrip('.')}"
    return row
  mem = compiled.memory_analysis()
  temp = int(getattr(mem, "temp_size_in_bytes", 0))
  total = int(mem.argument_size_in_bytes + mem.output_size_in_bytes
              - mem.alias_size_in_bytes + temp)
  fits = total <= memory_bytes if memory_bytes else True
  row["memory"].update({"temporaries": temp, "total": total, "fits": fits,
                        "over_by": max(0, total - memory_bytes) if memory_bytes else 0})
  if not fits:  # a GPU (or CPU) program: XLA compiles it whatever its size
    row["why"] = "XLA compiled it; its memory analysis exceeds the device's memory"
  hlo = compiled.as_text()
  row["kernel"] = attention_kernel(hlo)
  row["collectives"] = count_collectives(hlo)
  row["activation_collectives"] = activation_collectives(hlo, params, batch, num_devices,
                                                         model_dims)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  # x loop_trips: the gradient-accumulation loop's body counted as often as it runs (and
  # the optimizer's update after it as often too: an overcount of the state's bytes,
  # small where the micro-batches' activations dominate).
  flops = float(cost.get("flops", 0.0)) * loop_trips or None
  bytes_accessed = float(cost.get("bytes accessed", 0.0)) * loop_trips or None
  row["flops"] = {"compiled_per_device": flops, "analytic_per_device": analytic_per_device}
  row["bytes_accessed_per_device"] = bytes_accessed
  if t.peak_flops:
    # The GPU compiler gives no cost analysis: there the bound is the analytic
    # FLOPs' alone, and no MFU follows from it.
    compute_s = (flops or analytic_per_device) / t.peak_flops
    memory_s = bytes_accessed / t.bandwidth if bytes_accessed else None
    bound = max(compute_s, memory_s or 0.0)
    row["roofline"] = {"compute_s": compute_s, "memory_s": memory_s, "step_s_lower_bound": bound,
                       "best_mfu": (analytic_per_device / t.peak_flops / bound
                                    if memory_s is not None else None)}
  return row


def _oom_bytes(message: str) -> float | None:
  """The bytes a TPU program needed, from XLA's compile-time out-of-memory error
  (None: the error is another one). libtpu 0.0.50 says "CompileTimeHbmOom: ... the
  total memory required for HLO temporaries (49.18G) exceeds available HBM
  (15.75G)"; older ones "Used 20.5G of 15.75G hbm"."""
  if "CompileTimeHbmOom" not in message and "hbm" not in message.lower():
    return None
  unit = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
  m = (re.search(r"required for HLO temporaries \(([\d.]+)([KMGT])\)", message)
       or re.search(r"Used ([\d.]+)([KMGT]) of", message))
  return float(m.group(1)) * unit[m.group(2)] if m else float("nan")


# The report's text and the HLO readers live in aot_report and hlo: asked for here,
# a one-line error naming where.
_MOVED = dict.fromkeys(("devices_phrase", "format_report", "format_training_time",
                        "training_time"), "aot_report") | {"COLLECTIVES": "hlo"}


def __getattr__(name):
  if name in _MOVED:
    raise AttributeError(f"attnscale.runtime.aot.{name} is "
                         f"attnscale.runtime.{_MOVED[name]}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
