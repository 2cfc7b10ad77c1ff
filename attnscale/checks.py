"""One-line checks of config values, shared by every layer that validates a field.

Each raises a ValueError naming the field and what is allowed. Imports nothing.
"""

from __future__ import annotations


def check_choice(field: str, value, allowed) -> None:
  if value not in allowed:
    raise ValueError(f"{field} must be one of {list(allowed)}, got {value!r}")


def check_positive(field: str, value, *, allow_zero: bool = False) -> None:
  ok = value >= 0 if allow_zero else value > 0
  if not ok:
    raise ValueError(f"{field} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
