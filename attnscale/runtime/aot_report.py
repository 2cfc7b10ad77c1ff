"""compile.py's table: a `aot.compile_report` as text, and the best-case training
time it implies for a number of tokens."""

from __future__ import annotations

from typing import Any

GiB = 2**30


def format_bytes(b: float | None) -> str:
  """GiB to two places; below 0.01 GiB, MiB (and so on down to bytes): a state
  sharded over 64 chips is not "0.00 GiB"."""
  if b is None:
    return "-"
  for unit, size, least in (("GiB", GiB, 0.01), ("MiB", 2**20, 0.01), ("KiB", 2**10, 1)):
    if abs(b) >= least * size:
      return f"{b / size:.2f} {unit}"
  return f"{b:.0f} B"


def devices_phrase(report: dict[str, Any]) -> str:
  """What the target's devices are: chips, and for TPUs the cores its name counts."""
  n, chip, cores = report["num_devices"], report["chip"], report.get("cores_per_chip", 1)
  if report["platform"] == "tpu":
    each = (f"{cores} TensorCores each, one JAX device: the name counts {n * cores} cores"
            if cores > 1 else "1 TensorCore each")
    return f"{n} chips of {chip} ({each})"
  if report["platform"] == "gpu":
    return f"{n} GPU{'s' if n > 1 else ''} ({chip})"
  return f"{n} CPU device{'s' if n > 1 else ''} ({report['device_kind']})"


def format_report(report: dict[str, Any]) -> str:
  """The report as the table compile.py prints."""
  g = format_bytes
  memory = "HBM" if report["platform"] != "cpu" else "host memory"
  lines = [f"{report['label']} | {report['dtype']} | remat {report['remat']} | "
           f"{report['num_params'] / 1e6:.2f}M params",
           f"target {report['target']}: {devices_phrase(report)}, "
           f"{g(report['device_memory_bytes'])} {memory} each | mesh data "
           f"{report['mesh']['data']} x fsdp {report['mesh']['fsdp']}"]
  header = f"{'':26}{'train_step':>18}{'eval_step':>18}"
  lines += ["", header]
  rows = [("parameters / device", lambda r: g(r["memory"]["parameters"])),
          ("optimizer state / device", lambda r: g(r["memory"]["optimizer_state"])),
          ("batch / device", lambda r: g(r["memory"]["batch"])),
          ("temporaries / device", lambda r: g(r["memory"].get("temporaries"))),
          ("total / device", lambda r: g(r["memory"]["total"])),
          ("fits", lambda r: ("yes" if r["memory"]["fits"] else
                              f"no (+{g(r['memory']['over_by'])})")),
          ("attention kernel", lambda r: r.get("kernel", "-")),
          ("all-gather", lambda r: _count(r, "all-gather")),
          ("reduce-scatter", lambda r: _count(r, "reduce-scatter")),
          ("all-reduce", lambda r: _count(r, "all-reduce")),
          ("all-to-all", lambda r: _count(r, "all-to-all")),
          ("activation collectives", lambda r: (str(len(r["activation_collectives"]))
                                                if "activation_collectives" in r else "-")),
          ("FLOPs / device (XLA)", lambda r: _e(r.get("flops", {}).get("compiled_per_device"))),
          ("FLOPs / device (6N+12LTD)", lambda r: _e(r.get("flops", {}).get(
              "analytic_per_device"))),
          ("step time >= (roofline)", lambda r: (f"{r['roofline']['step_s_lower_bound'] * 1e3:.2f} ms"
                                                 if "roofline" in r else "-")),
          ("best-case MFU (estimate)", lambda r: (f"{r['roofline']['best_mfu']:.0%}"
                                                  if r.get("roofline", {}).get("best_mfu")
                                                  else "-"))]
  for label, fn in rows:
    lines.append(f"{label:26}{fn(report['train_step']):>18}{fn(report['eval_step']):>18}")
  lines.append("Compiled, not run: memory, kernel and collectives are the compiler's; the "
               "step time is a lower bound.\nActivation collectives: those that move a "
               "batch-sized tensor (FSDP moves weights and gradients only).")
  for name in ("train_step", "eval_step"):
    row = report[name]
    if "why" in row:
      unknown = " (not compiled: the rows below fits are -)" if "error" in row else ""
      lines.append(f"{name} does not fit{unknown}: {row['why']}")
  return "\n".join(lines)


def training_time(report: dict[str, Any], tokens: int, tokens_per_step: int) -> dict[str, Any]:
  """The best case for training `tokens` tokens on the report's target: the
  roofline step time times the steps (ceil(tokens / tokens_per_step)). A lower
  bound, never a measurement: no input pipeline, logging, evaluation, checkpoints
  or collectives' latency, and the chip at its peak FLOPs or bandwidth."""
  steps = -(-tokens // tokens_per_step)
  step_s = report["train_step"].get("roofline", {}).get("step_s_lower_bound")
  return {"tokens": tokens, "tokens_per_step": tokens_per_step, "steps": steps,
          "seconds_lower_bound": None if step_s is None else steps * step_s}


def format_training_time(t: dict[str, Any], target_name: str) -> str:
  """compile.py --tokens' line."""
  if t["seconds_lower_bound"] is None:
    return f"training {t['tokens']:.3g} tokens on {target_name}: no roofline for this target"
  s = t["seconds_lower_bound"]
  return (f"training {t['tokens']:.3g} tokens on {target_name}: >= {s / 3600:.2f} hours "
          f"({t['steps']:,} steps of {t['tokens_per_step']:,} tokens at the roofline step "
          "time; a lower bound, not an estimate of a real run)")


def _count(row, kind):
  return str(row["collectives"][kind]) if "collectives" in row else "-"


def _e(x):
  return f"{x:.3g}" if x else "-"
