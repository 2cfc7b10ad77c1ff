"""The checks across a run's fields, after each field passed its own declaration.

Each raises a one-line ValueError naming the field and what is allowed. The task's
own checks (its dataset names, the masked LM's rates, ...) are its
`validate_config`, run here too, before any data is loaded.
"""

from __future__ import annotations

import re

# STOP < num_train_steps: the trace stops before the step after STOP, so one must follow.
_FORM = "'START:STOP' with 0 <= START < STOP < config.num_train_steps (e.g. '20:25'), or ''"


def mesh_shape(mesh, num_devices: int) -> tuple[int, int]:
  """The (data, fsdp) device counts of `mesh` (a `MeshConfig`, a ConfigDict or
  None) on `num_devices` devices.

  -1 in one field takes all the rest; no mesh (None, or a config.json written
  before it existed) puts every device on `data`.

  Raises:
    ValueError: a count that is neither >= 1 nor -1, both -1, or counts that do
      not multiply to (or divide) the device count; one line, naming the field.
  """
  data, fsdp = (-1, 1) if mesh is None else (mesh.data, mesh.fsdp)
  for field, value in (("data", data), ("fsdp", fsdp)):
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
      raise ValueError(f"config.mesh.{field} must be a device count >= 1 or -1 (all the "
                       f"rest), got {value!r}")
  if data == fsdp == -1:
    raise ValueError("config.mesh.data and config.mesh.fsdp cannot both be -1 (all the rest): "
                     "give one of them a device count")
  if -1 in (data, fsdp):
    field, count = ("fsdp", fsdp) if data == -1 else ("data", data)
    if num_devices % count:
      raise ValueError(f"config.mesh.{field} ({count}) must divide the device count "
                       f"({num_devices})")
    rest = num_devices // count
    return (rest, count) if data == -1 else (count, rest)
  if data * fsdp != num_devices:
    raise ValueError(f"config.mesh.data x config.mesh.fsdp ({data} x {fsdp} = {data * fsdp}) "
                     f"must equal the device count ({num_devices}); -1 in one of them takes "
                     "all the rest")
  return data, fsdp


def check_run(run, num_devices: int | None) -> None:
  """The checks across `run`'s fields (a `RunConfig` whose fields each passed their
  declaration) on `num_devices` devices (None: none of the device checks), then the
  task's own."""
  from attnscale import tasks
  from attnscale.models import base  # the model layer's rule of what QK-clip can scale
  if run.learning_rate == 0:
    raise ValueError("config.learning_rate must be > 0, got 0")
  if num_devices is not None:  # eval.py reads a run for other devices than its own
    mesh_shape(run.mesh, num_devices)
    accum = run.grad_accum_steps
    if run.batch_size % num_devices:
      raise ValueError(f"config.batch_size ({run.batch_size}) must be divisible by the "
                       f"number of devices ({num_devices}): the batch is sharded on "
                       "config.mesh.data x config.mesh.fsdp, every device")
    if run.batch_size % (accum * num_devices):
      raise ValueError(f"config.batch_size ({run.batch_size}) must be divisible by "
                       f"config.grad_accum_steps x the number of devices ({accum} x "
                       f"{num_devices} = {accum * num_devices}): each device's rows are "
                       "split into grad_accum_steps micro-batches")
  tasks.task_class(run).validate_config(run)
  run.logger_names  # noqa: B018 (parsed once, here: a bad name fails at start)
  run.profile_window  # noqa: B018
  cfg = run.model
  if run.optimizer == "muon" and (cfg.variant, cfg.parameterization) != ("standard", "sp"):
    raise ValueError(f"config.optimizer='muon' needs model.variant='standard' and "
                     f"model.parameterization='sp' (Muon's shape rule is its own width rule, "
                     f"and it finds the matrices by the Dense kernels), got "
                     f"{cfg.variant!r} and {cfg.parameterization!r}")
  if run.muon_adam_lr_mult != 1 and run.optimizer != "muon":
    raise ValueError(f"config.muon_adam_lr_mult={run.muon_adam_lr_mult:g} scales the rate of "
                     f"Muon's Adam(W) branch and needs config.optimizer='muon' (got "
                     f"{run.optimizer!r}); leave it at 1")
  base_width = run.muon_adam_lr_base_width
  if base_width and run.optimizer != "muon":
    raise ValueError(f"config.muon_adam_lr_base_width={base_width} scales the rate of "
                     f"Muon's Adam(W) branch and needs config.optimizer='muon' (got "
                     f"{run.optimizer!r}); leave it at 0")
  if run.qk_clip:
    reason = base.qk_clip_refusal(cfg)
    if reason:
      raise ValueError(f"config.qk_clip={run.qk_clip:g} cannot apply: {reason}; use "
                       "config.qk_clip=0")
  if run.seq_len > cfg.block_size:
    raise ValueError(f"config.seq_len ({run.seq_len}) must be <= model.block_size "
                     f"({cfg.block_size}), the training context length (and "
                     "the learned position table's)")


def profile_window(value, num_train_steps: int | None = None) -> tuple[int, int] | None:
  """config.profile_steps as (start, stop), None for "" (off); a one-line
  ValueError naming the field and the form for anything else."""
  if value in ("", None):
    return None
  match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", value) if isinstance(value, str) else None
  start, stop = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
  if not match or start >= stop or (num_train_steps is not None and stop >= num_train_steps):
    raise ValueError(f"config.profile_steps must be {_FORM}, got {value!r}")
  return start, stop
