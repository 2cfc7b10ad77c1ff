"""A run's config: every top-level field declared once, read once at start.

    fields.py      `field(default, doc, kind=..., since=...)`: how a field is declared,
                   and what packing, resuming and migration derive from the kinds
    run.py         `RunConfig` (the declarations, the model's `ModelConfig`, the task's
                   own fields), `read` (the one validation and conversion of a start),
                   `of` (converted, unchecked: tests and tools)
    validation.py  the checks across fields, and the mesh's shape
    builders.py    what `configs/*.py` build a ConfigDict with (`add_optimizer`,
                   `model`, `parse_arg`, ...), from the declared defaults
    migration.py   a saved config.json in today's names (`migrate`, `model_config`)
    labels.py      a run's label when no sweep declared one (`derived_label`)

Below the runtime, above the models and tasks: may import core, numerics, models
and tasks (tasks declare their own fields with `fields.field`, so they import
`fields` only), and the runtime's tracker and profiler parsers where a field is
parsed (`RunConfig.logger_names`, `profile_window`).
"""

from attnscale.config.fields import field
from attnscale.config.run import RunConfig, of, read

__all__ = ["RunConfig", "field", "of", "read"]
