"""Saved configs across renames and new fields: `migrate`.

A config.json written before a field was renamed, or before a field existed, still
loads, evaluates and resumes: `migrate` moves each renamed field (and its values)
to today's name and fills in each added field at the value that reproduces the old
run (its declaration's `since`, attnscale/config/run.py), and the model fields from
ModelConfig's defaults.
"""

from __future__ import annotations

import copy

from attnscale.config import run as run_config
from attnscale.config.schema import RENAMED_FIELD_VALUES, RENAMED_FIELDS, model_fields
from attnscale.core import scalings


def flat_diff(old: dict, new: dict, prefix: str = ""):
  """(dotted key, old value, new value) for each leaf in which two nested dicts differ."""
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      yield from flat_diff(a, b, f"{prefix}{key}.")
    elif a != b:
      yield f"{prefix}{key}", a, b


def _fill_defaults(config: dict, defaults: dict) -> None:
  for key, value in defaults.items():
    if isinstance(value, dict) and isinstance(config.get(key), dict):
      _fill_defaults(config[key], value)
    else:
      config.setdefault(key, value)


def migrate(config: dict) -> dict:
  """A saved config.json (a dict) from before a rename, in today's field names.

  Moves every `RENAMED_FIELDS` entry (mapping its values by
  `RENAMED_FIELD_VALUES`: model.qk_layernorm=True -> model.qk_norm="layernorm"),
  renames values (`model.variant` "unit_scaled" -> "unit") and fills in each added
  field at its `since` (`run_config.added_fields`), so runs trained before still
  evaluate and resume.
  """
  for old, new in RENAMED_FIELDS.items():
    *old_path, old_key = old.split(".")
    *new_path, new_key = new.split(".")
    src = config
    for key in old_path:
      src = src.get(key, {})
    if old_key not in src:
      continue
    dst = config
    for key in new_path:
      dst = dst.setdefault(key, {})
    value = src.pop(old_key)
    dst[new_key] = RENAMED_FIELD_VALUES.get(old, {}).get(value, value)
  for key, value in run_config.added_fields().items():
    config.setdefault(key, copy.deepcopy(value))
  if "model" in config:  # a model field it predates: ModelConfig's default, as it then was
    _fill_defaults(config["model"], model_fields().to_dict())
  model = config.get("model", {})
  if model.get("variant") == "unit_scaled":
    model["variant"] = "unit"
  if model.get("scaling") in scalings.RENAMED:  # a registered scaling's old name
    model["scaling"] = scalings.RENAMED[model["scaling"]]
  return config


