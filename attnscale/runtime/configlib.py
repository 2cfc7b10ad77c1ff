"""What the runtime asks of a config: its checks, its mesh, its resume rules.

The schema itself is `attnscale.config` (each top-level field declared once in
`RunConfig`; the builders `configs/*.py` use, `attnscale.config.builders`); this
module keeps the runtime's names for it.
"""

from __future__ import annotations

import ml_collections

from attnscale.config import run as run_config
from attnscale.config import validation
from attnscale.models.config import ModelConfig

# Fields that may change when a run resumes (each field's kind: bookkeeping or
# layout, attnscale/config/run.py). num_train_steps joins them only under a constant
# learning rate: it is the length of the cosine decay, so changing it would change
# the finished steps' run (`rundir.save_config`).
RESUMABLE_CHANGES = run_config.resumable_fields()


def validate(config: ml_collections.ConfigDict, *, num_devices: int = 1) -> ModelConfig:
  """Checks `config` as a start does (`attnscale.config.read`: its imports, every field
  against its declaration, the checks across fields, the task's own); a one-line
  ValueError. Returns the model's `ModelConfig`."""
  return run_config.read(config, num_devices).model


def mesh_shape(config, num_devices: int) -> tuple[int, int]:
  """The (data, fsdp) device counts of `config.mesh` on `num_devices` devices
  (`attnscale.config.validation.mesh_shape`; no mesh: every device on `data`)."""
  mesh = None if config is None else getattr(config, "mesh", None)
  return validation.mesh_shape(mesh, num_devices)


# Names that live in attnscale.config now: a config or notebook that still reaches
# them here gets one line naming the new place.
_MOVED = {
    **dict.fromkeys(("add_attention_health", "add_devices", "add_optimizer", "add_outputs",
                     "check_choice", "check_positive", "model", "model_fields", "parse_arg",
                     "schema_default", "schema_fields"), "builders"),
    **dict.fromkeys(("import_files", "import_modules"), "imports"),
    "flat_diff": "migration", "migrate": "migration", "run_label": "labels",
    **dict.fromkeys(("RENAMED_FIELD_VALUES", "RENAMED_FIELDS", "model_config", "value_hint"),
                    "schema"),
}


def __getattr__(name):
  if name in _MOVED:
    raise AttributeError(f"attnscale.runtime.configlib.{name} is "
                         f"attnscale.config.{_MOVED[name]}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
