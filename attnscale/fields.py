"""How a config field is declared: `field(default, doc, kind=..., since=...)`.

One declaration says everything the harness needs to know of a field:

* its type (the annotation) and default, and a one-line doc (the config
  reference, docs/reference/config.md, is generated from it);
* its `kind`, which decides packing and resuming:

      program      makes the compiled program: every run of a pack shares it, a
                   resumed run keeps it (the model's shapes, the optimizer, ...)
      traced       a number the packed step takes as an array (the learning rate):
                   may differ between the runs of a pack, not at resume
      switch       traced, and also a branch (on when > 0): on in every run of a
                   pack or in none
      bookkeeping  where and when a run logs, evaluates and saves: may differ in a
                   pack and change at resume
      layout       how the same run is laid out on the devices (mesh, remat, micro-
                   batches): may change at resume, but makes the pack's program

* `since`: the value that reproduces runs saved before the field existed (a
  saved config.json without it is migrated to it), or `ALWAYS` for a field every
  config has held;
* `renamed_from`: its old name, so an old override fails in one line naming the
  new one and an old config.json is migrated;
* `choices` / `positive`: the generic checks of `check` (one of those values; "> 0"
  or ">= 0"), one line naming the field.

The classification functions (`traced`, `resumable`, ...) read a schema
dataclass's declarations; `attnscale.config.run` applies them to `RunConfig`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from attnscale import checks

KINDS = ("program", "traced", "switch", "bookkeeping", "layout")


class _Always:
  def __repr__(self):
    return "ALWAYS"


ALWAYS = _Always()  # `since` of a field every saved config holds


def field(default: Any = dataclasses.MISSING, doc: str = "", *, kind: str = "program",
          since: Any = ALWAYS, renamed_from: str | None = None,
          choices: tuple | None = None, positive: str | None = None,
          allowed: str | None = None, default_factory: Any = dataclasses.MISSING) -> Any:
  """A top-level run field (see the module docstring for each argument)."""
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  if positive not in (None, "> 0", ">= 0"):
    raise ValueError(f"positive must be None, '> 0' or '>= 0', got {positive!r}")
  metadata = {"doc": doc, "kind": kind, "since": since, "renamed_from": renamed_from,
              "choices": choices, "positive": positive, "allowed": allowed}
  if default_factory is not dataclasses.MISSING:
    return dataclasses.field(default_factory=default_factory, metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def declared(schema: type) -> list[dataclasses.Field]:
  """The schema's fields declared with `field` (not `model`, not the task's)."""
  return [f for f in dataclasses.fields(schema) if "kind" in f.metadata]


def default_of(f: dataclasses.Field) -> Any:
  return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def of_kind(schema: type, *kinds: str) -> tuple[str, ...]:
  """The names of the schema's fields of the given kinds, in declaration order."""
  return tuple(f.name for f in declared(schema) if f.metadata["kind"] in kinds)


def traced(schema: type) -> tuple[str, ...]:
  """The numbers a packed step takes as arrays."""
  return of_kind(schema, "traced", "switch")


def switches(schema: type) -> tuple[str, ...]:
  """The traced fields that are also a branch: on in every run of a pack or in none."""
  return of_kind(schema, "switch")


def resumable(schema: type) -> tuple[str, ...]:
  """The fields a resumed run may change."""
  return of_kind(schema, "bookkeeping", "layout")


def pack_free(schema: type) -> tuple[str, ...]:
  """The fields in which the runs of one pack may differ."""
  return of_kind(schema, "traced", "switch", "bookkeeping")


def added(schema: type) -> dict[str, Any]:
  """Field -> the value that reproduces a run saved before the field existed."""
  return {f.name: f.metadata["since"] for f in declared(schema)
          if f.metadata["since"] is not ALWAYS}


def renames(schema: type) -> dict[str, str]:
  """Old top-level name -> new name."""
  return {f.metadata["renamed_from"]: f.name for f in declared(schema)
          if f.metadata["renamed_from"]}


def _kind_name(t) -> str:
  return getattr(t, "__name__", str(t))


def check(schema: type, name: str, value: Any) -> Any:
  """`value` checked against field `name`'s declaration (type, choices, positive) and
  converted to it (an int where a float is declared becomes a float).

  Raises:
    ValueError: one line, naming config.NAME and what is allowed.
  """
  f = next(f for f in dataclasses.fields(schema) if f.name == name)
  try:
    value = _check(schema, f, value)
  except ValueError:
    if not f.metadata.get("allowed"):
      raise
    raise ValueError(f"config.{name} must be {f.metadata['allowed']}, got {value!r}") from None
  choices = f.metadata.get("choices")
  if choices is not None:
    checks.check_choice(f"config.{name}", value, choices)
  return value


def _check(schema: type, f: dataclasses.Field, value: Any) -> Any:
  name = f.name
  hint = typing.get_type_hints(schema)[name]
  kinds = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
  nullable = type(None) in typing.get_args(hint)
  positive = f.metadata.get("positive")
  where = f"config.{name}"
  if value is None:
    if nullable:
      return None
    raise ValueError(f"{where} must be set (a {_kind_name(kinds[0])}), got None")
  kind = kinds[0]
  if kind is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
        value):
      raise ValueError(f"{where} must be a finite number, got {value!r}")
    value = float(value)
  elif kind is int:
    if isinstance(value, bool) or not isinstance(value, int):
      raise ValueError(f"{where} must be an integer, got {value!r}")
  elif kind is bool:
    if not isinstance(value, bool):
      raise ValueError(f"{where} must be True or False, got {value!r}")
  elif kind is str:
    if not isinstance(value, str):
      raise ValueError(f"{where} must be a string, got {value!r}")
  elif kind is tuple:
    if not isinstance(value, (tuple, list)):
      raise ValueError(f"{where} must be a tuple, got {value!r}")
    value = tuple(value)
  if positive is not None:
    checks.check_positive(where, value, allow_zero=positive == ">= 0")
  return value
