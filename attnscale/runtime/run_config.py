"""A run's config, read once at start: `RunConfig`.

    run = run_config.read(config, num_devices)   # train.py, a packed sweep: validated
    run = run_config.of(config_or_run)           # a test or a tool: unvalidated, or as given

The ConfigDict a user writes (`configs/*.py:get_config(arg)`) is read here into a
frozen value that the train path passes down: the model's `ModelConfig` (converted
once: `configlib.model_config`), the traced hyperparameters (`hparams`: the
numbers a packed step takes as arrays, `packing.TRACED_FIELDS`) and the ConfigDict
itself for the fields that are read as they are (the optimizer's name and betas,
the schedule's form, the data, the bookkeeping). The optimizer and its schedule
are built from it once per program (`optimizers.build`), the model from `model`.

`hparams` holds the config's own Python numbers: a single run's program folds them
in as constants, exactly as it always did; a pack stacks them into float32 /
int32 arrays (`attnscale.runtime.packed`).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import ml_collections

from attnscale.models.config import ModelConfig
from attnscale.runtime import configlib, packing


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One run's config, read once.

  Attributes:
    config: the locked ConfigDict (every field, for what is read as written).
    model: `config.model` as a `ModelConfig` (with the top-level fields it takes).
    hparams: `packing.TRACED_FIELDS` -> the config's number (seed an int, qk_clip
      and z_loss floats, the others as written; 0.0 for a field the config lacks).
  """

  config: ml_collections.ConfigDict
  model: ModelConfig
  hparams: Mapping[str, float | int]

  @property
  def seed(self) -> int:
    return self.hparams["seed"]


def traced_values(config: ml_collections.ConfigDict) -> Mapping[str, float | int]:
  """`config`'s `packing.TRACED_FIELDS` as the single-run step always read them."""
  values = {k: config.get(k, 0.0) for k in packing.TRACED_FIELDS}
  values["seed"], values["qk_clip"] = config.seed, float(config.get("qk_clip", 0.0))
  values["z_loss"] = float(config.get("z_loss", 0.0))
  return types.MappingProxyType(values)


def read(config: ml_collections.ConfigDict, num_devices: int) -> RunConfig:
  """Validates `config` for `num_devices` devices (`configlib.validate`, which
  converts the model config, the one conversion of a start) and reads it.

  Raises:
    ValueError: a bad field (one line, naming it).
  """
  model = configlib.validate(config, num_devices=num_devices)
  return RunConfig(config, model, traced_values(config))


def of(config: ml_collections.ConfigDict | RunConfig) -> RunConfig:
  """`config` itself if it is a `RunConfig`, else read without validation (tests,
  benchmarks and tools that build a step or a model from a ConfigDict)."""
  if isinstance(config, RunConfig):
    return config
  return RunConfig(config, configlib.model_config(config), traced_values(config))
