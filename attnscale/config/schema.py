"""What the config's schemas share: a schema's fields, their ConfigDict form, the
model config's conversion and the renames.

`ModelConfig` (attnscale/models/config.py) and `RunConfig` (run.py) are dataclasses
whose fields carry their defaults and docs; a ConfigDict holds the same fields
(`config_value`, `model_fields`), and `model_config` turns `config.model` back
into a `ModelConfig`. A renamed field's old name fails in one line naming the new
one (`RENAMED_FIELDS`), and migration.py moves it in a saved config.json.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict

from attnscale import fields
from attnscale.models.config import ModelConfig

# Config fields that moved or were renamed: old path -> new path. Overriding an
# old path fails with a one-line error naming the new one.
RENAMED_FIELDS: dict[str, str] = {
    f"model.{name}": f"model.unit.{name}"
    for name in ("residual_mult", "residual_attn_ratio", "residual_rule", "attn_residual")
} | {"model.qk_layernorm": "model.qk_norm"}
# A renamed field whose values changed too: old path -> {old value: new value}.
RENAMED_FIELD_VALUES: dict[str, dict] = {
    "model.qk_layernorm": {True: "layernorm", False: "none"},
}


def config_value(schema: type, f: dataclasses.Field) -> Any:
  """A declared field's default as a ConfigDict holds it (None: a typed placeholder,
  so that `--config.FIELD=VALUE` type-checks)."""
  default = fields.default_of(f)
  if dataclasses.is_dataclass(default):
    return ml_collections.ConfigDict(
        {g.name: config_value(type(default), g) for g in dataclasses.fields(default)})
  if default is None:
    hint = typing.get_type_hints(schema)[f.name]
    kinds = [t for t in typing.get_args(hint) if t is not type(None)]
    return config_dict.placeholder(kinds[0])
  return default


def schema_fields(schema: type, *, top_level: bool = False) -> list[dataclasses.Field]:
  """The fields of a schema dataclass (`ModelConfig`) that its config holds; with
  `top_level`, those set from a top-level config field instead (`remat`)."""
  return [f for f in dataclasses.fields(schema)
          if bool(f.metadata.get("top_level")) == top_level]


def schema_default(f: dataclasses.Field) -> Any:
  """A schema field's default."""
  return fields.default_of(f)


def model_fields(schema: type = ModelConfig) -> ml_collections.ConfigDict:
  """A ConfigDict of `schema`'s fields at their defaults: `config.model` before a
  config overrides what differs. A nested schema (`unit`) becomes a sub-config, a
  None default a typed placeholder (so `--config.model.num_kv_heads=2` type-checks)."""
  out = ml_collections.ConfigDict()
  for f in schema_fields(schema):
    out[f.name] = config_value(schema, f)
  return out


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  """`config.model` as a `ModelConfig`, with the top-level fields it takes
  (`config.remat`, default none). A field ModelConfig lacks fails in one line
  (naming the new name of a renamed one)."""
  values = config.model.to_dict()
  known = {f.name for f in schema_fields(ModelConfig)}
  for name in values:
    if name in known:
      continue
    old = f"model.{name}"
    if old in RENAMED_FIELDS:
      raise ValueError(f"{old} was renamed to {RENAMED_FIELDS[old]}{value_hint(old)}")
    raise ValueError(f"{old} is not a model field (one of {sorted(known)})")
  top = {f.name: config.get(f.metadata["top_level"], schema_default(f))
         for f in schema_fields(ModelConfig, top_level=True)}
  return ModelConfig(**values, **top)


def value_hint(old: str) -> str:
  """" (model.qk_norm=layernorm for True, ...)" for a renamed field whose values changed."""
  values = RENAMED_FIELD_VALUES.get(old)
  if not values:
    return ""
  return " (" + ", ".join(f"{RENAMED_FIELDS[old]}={new} for {old_value}"
                          for old_value, new in values.items()) + ")"
