"""The studies `python -m attnscale.studies NAME` runs: one line each in `REGISTRY`.

A study is a module (its compute, plot and runner) plus one line here naming its
`Study`, "module:ATTRIBUTE", imported only when that study runs or the command
line is built. docs/guides/extending.md, "A study", walks through adding one.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Callable

# name -> "module:attribute" of its Study, in the order `all` runs them.
REGISTRY = {
    "output_scale": "attnscale.studies.output_std:OUTPUT_SCALE",
    "temperature": "attnscale.studies.output_std:TEMPERATURE",
    "key_norms": "attnscale.studies.key_norm_kde:STUDY",
    "trained": "attnscale.studies.trained:STUDY",
    "length": "attnscale.studies.length:STUDY",
    "precision": "attnscale.studies.precision:STUDY",
    "shared_kv": "attnscale.studies.shared_kv:STUDY",
    "width": "attnscale.studies.width:WIDTH",
    "depth": "attnscale.studies.width:DEPTH",
    "sensitivity": "attnscale.studies.sensitivity:STUDY",
    "coord_check": "attnscale.studies.coord_check:STUDY",
    "bert": "attnscale.studies.bert:STUDY",
    "transfer": "attnscale.studies.transfer:STUDY",
    "critical_length": "attnscale.studies.critical_length:STUDY",
    "critical_length_trained": "attnscale.studies.critical_trained:STUDY",
    "normalisers": "attnscale.studies.normalisers:STUDY",
    "probes": "attnscale.studies.probes:STUDY",
}

Runner = Callable[[argparse.Namespace], "tuple[list[str], list[str]]"]


@dataclasses.dataclass(frozen=True)
class Study:
  """One study of the command line.

  Attributes:
    run: args -> (paths written, notes printed); raises SystemExit with one line
      on a bad argument.
    in_all: part of `all` (a synthetic study, or one that reads any trained runs
      given with --workdirs); False for those that read one sweep's layout or
      train; or a function of the parsed flags that says.
    needs_workdirs: reads --workdirs (in `all` only when some are given).
    arguments: adds the study's own flags to the parser (a function several
      studies may share: it is called once); shared flags (--out, --seed,
      --workdirs) are the command line's.
    check: validates the parsed flags, calling parser.error(one line).
  """

  run: Runner
  in_all: bool | Callable[[argparse.Namespace], bool] = True
  needs_workdirs: bool = False
  arguments: Callable[[argparse.ArgumentParser], None] | None = None
  check: Callable[[argparse.Namespace, argparse.ArgumentParser], None] | None = None


def get(name: str) -> Study:
  """The registered study `name` (its module imported)."""
  module, attribute = REGISTRY[name].split(":")
  return getattr(importlib.import_module(module), attribute)


def names() -> tuple[str, ...]:
  return tuple(REGISTRY)


def code_note(rows, args, study: str) -> str:
  """The commits a study's runs came from, a line for under its table
  (`sweep_results.commit_note`); several commits only with --allow_mixed_code,
  else a one-line SystemExit naming the flag."""
  from attnscale.experiments import sweep_results
  try:
    return sweep_results.commit_note(rows, allow_mixed=getattr(args, "allow_mixed_code", False))
  except ValueError as e:
    raise SystemExit(f"{study}: {e}; or pass --allow_mixed_code") from None
