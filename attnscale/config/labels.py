"""A run's label: the one its sweep declared, else the name of its attention setup.

A sweep declares each run's label in `config.label` (the study's name for it); `of`
is what every study groups runs by. `run_label` is the name derived from the config
(`RunConfig.run_label`, `attnscale.config.run.derived_label`): a run started by hand
(its log line, eval.json's "scaling") and runs made before sweeps declared labels.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import ml_collections

from attnscale.config import migration
from attnscale.config import run as run_config


def of(config: Mapping) -> str:
  """A run's label in its studies, from its config (a config.json's dict, a
  ConfigDict): the label its sweep declared (`config.label`); a run without one, its
  `run_label`."""
  return config.get("label") or run_label(config)


def run_label(config) -> str:
  """The name of a run's attention setup, derived from its config
  (`attnscale.config.run.derived_label`: log line, eval.json, a run by hand).

  `config`: a `RunConfig`, a ConfigDict or a config.json's dict (migrated first, so a
  run saved before a rename keeps its label).
  """
  if isinstance(config, run_config.RunConfig):
    return config.run_label
  saved = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  return run_config.of(ml_collections.ConfigDict(migration.migrate(copy.deepcopy(saved)))).run_label


def of_argument(scaling: str) -> str:
  """The label a sweep declares for a config argument's scaling: "log_n,s=1" ->
  "log_n(s=1)", "log_n_power,p=1,gamma=0.5" -> "log_n_power(gamma=0.5,p=1)", its name
  and fixed parameters as `derived_label` writes them."""
  name, *params = scaling.split(",")
  if not params:
    return name
  pairs = sorted(kv.split("=", 1) for kv in params)
  return name + "(" + ",".join(f"{k}={float(v):g}" for k, v in pairs) + ")"
