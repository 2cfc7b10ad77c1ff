"""A run's config: every top-level field declared once, read once at start.

    run.py         `RunConfig` (the declarations, the model's `ModelConfig`, the task's
                   own fields), `read` (the one validation and conversion of a start),
                   `of` (converted, unchecked: tests and tools)
    validation.py  the checks across fields, and the mesh's shape
    builders.py    what `configs/*.py` build a ConfigDict with (`add_optimizer`,
                   `model`, `parse_arg`, ...), from the declared defaults
    schema.py      what the schemas share: fields as a ConfigDict, `model_config`, renames
    migration.py   a saved config.json in today's names (`migrate`)
    labels.py      a run's label: the sweep's declared one, else derived (`of`,
                   `run_label`; the derivation is `run.derived_label`)
    loggers.py     the names config.loggers takes (trackers register theirs here)
    imports.py     config.imports: the user's own modules, imported before the checks

How a field is declared (`field(default, doc, kind=..., since=...)`, and what
packing, resuming and migration derive from the kinds) is attnscale/fields.py,
beside checks.py at the bottom of the layers, since the tasks declare theirs too.

Below the runtime, above the models and tasks: may import checks, fields, core,
numerics, models, data and tasks, never the runtime (which reads the config here).
"""

from attnscale.config.run import RunConfig, of, read
from attnscale.fields import field

__all__ = ["RunConfig", "field", "of", "read"]
