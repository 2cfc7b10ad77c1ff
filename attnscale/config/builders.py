"""What `configs/*.py:get_config(arg)` builds a run's ConfigDict with.

    arg = builders.parse_arg(arg, preset="cpu", scaling="standard", seed=0)
    c = ml_collections.ConfigDict()
    builders.add_optimizer(c, learning_rate=1e-3)   # and add_devices, add_attention_health
    c.model = builders.model(arg.scaling)

Each `add_*` sets a group of `RunConfig`'s top-level fields at their declared
defaults (attnscale/config/run.py: one declaration per field, its doc and kind), so
a config writes only what differs for it. `model(...)` is `config.model` from
`ModelConfig`'s defaults and the config argument's scaling.
"""

from __future__ import annotations

import dataclasses
import inspect

import ml_collections

from attnscale.checks import check_choice, check_positive
from attnscale.config.run import RunConfig
from attnscale.config.schema import config_value, model_fields, schema_default, schema_fields
from attnscale.core import scalings

__all__ = ["add_attention_health", "add_devices", "add_optimizer", "add_outputs",
           "check_choice", "check_positive", "model", "model_fields", "parse_arg",
           "schema_default", "schema_fields", "set_defaults"]


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses "k1=v1,k2=v2" into a ConfigDict, typed like `defaults`.

  Raises:
    ValueError: an unknown key (lists the known ones) or a value of the wrong type.
  """
  out = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(f"config argument {key!r} is not one of {sorted(defaults)}")
    out[key] = _coerce(key, value.strip(), defaults[key])
  return ml_collections.ConfigDict(out)


def _coerce(key, value, default):
  if default is None or isinstance(default, str):
    return value
  try:
    if isinstance(default, bool):
      if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return value.lower() in ("true", "1")
    return type(default)(value)
  except ValueError:
    raise ValueError(f"config argument {key}={value!r} must be a "
                     f"{type(default).__name__}") from None


def set_defaults(c: ml_collections.ConfigDict, *names: str) -> None:
  """Sets each named `RunConfig` field of `c` to its declared default."""
  by_name = {f.name: f for f in dataclasses.fields(RunConfig)}
  for name in names:
    c[name] = config_value(RunConfig, by_name[name])


def add_devices(c: ml_collections.ConfigDict) -> None:
  """Where and how a run runs: mesh, remat, grad_accum_steps; and what it writes."""
  set_defaults(c, "mesh", "remat", "grad_accum_steps")
  add_outputs(c)


def add_outputs(c: ml_collections.ConfigDict) -> None:
  """What a run writes besides checkpoints and how it is named: loggers
  (attnscale/runtime/trackers.py), profile_steps (runtime/profiling.py) and its
  sweep's label for it (`label`)."""
  set_defaults(c, "loggers", "profile_steps", "label")


def add_optimizer(c: ml_collections.ConfigDict, *, learning_rate: float) -> None:
  """The optimizer and its Muon options, the peak `learning_rate` (the config's own),
  the schedule's form and the parameters a run starts from (`init_from`)."""
  set_defaults(c, "optimizer", "muon_lr_rule", "muon_adam_lr_mult", "muon_adam_lr_base_width")
  c.learning_rate = learning_rate
  set_defaults(c, "lr_schedule", "init_from")


def add_attention_health(c: ml_collections.ConfigDict) -> None:
  """Training health: attn_metrics, qk_clip, sink_metrics_rows and z_loss
  (docs/guides/training.md, "Attention health and QK-clip")."""
  set_defaults(c, "attn_metrics", "qk_clip", "sink_metrics_rows", "z_loss")


def model(scaling: str = "standard", *, p: float = 2.0, temperature: float = 0.0,
          s: float = 0.0, gamma: float = 1.0, a: float = 0.0) -> ml_collections.ConfigDict:
  """`config.model` for the config argument's `scaling`, `p`, `temperature`, `s`,
  `gamma` and `a`:
  ModelConfig's defaults plus what the argument selects. A config then overrides
  what differs for it (sizes, dropout, ...).

  `scaling` is a registered name, or a preset's (`scalings.presets()`: a scaling in
  another model variant, with its fields; "unit_scaled", Graphcore's experiment,
  docs/science.md, "Unit scaling and the residual rule": fully scaled attention
  inside the unit-scaled transformer, its branch weighted to sqrt(e/n) of the skip).
  `p`, `temperature`, `s` go to the scaling's params where its registration lists
  them (`config_args`): key_norm_power's power; cosine's fixed temperature and
  log_n's fixed s, where > 0 (0 leaves them learned); the length laws' gamma and
  exponents (log_n_power's gamma and p, n_power's gamma and a).
  """
  m = model_fields()
  m.scaling = scaling
  if scaling in scalings.presets():
    m.scaling, preset = scalings.presets()[scaling]
    m.variant = preset.variant
    m.update_from_flattened_dict(preset.fields)
  if m.scaling in scalings.names():  # an unknown name fails in ModelConfig, listing them
    entry = scalings.entry(m.scaling)
    given = {"p": p, "temperature": temperature, "s": s, "gamma": gamma, "a": a}
    defaults = {k: v.default for k, v in inspect.signature(model).parameters.items()
                if k in given}  # this function's own, so the two never drift apart
    stray = [k for k in given if given[k] != defaults[k] and k not in entry.config_args]
    if stray:  # a typo'd law would otherwise train as standard attention
      raise ValueError(f"config argument {stray[0]}={given[stray[0]]:g} does not apply to "
                       f"scaling={m.scaling} (it takes: {', '.join(entry.config_args) or 'none'})")
    params = {k: given[k] for k in entry.config_args
              if k not in entry.learned or given[k] > 0}
    if params:
      m.scaling_params = params
  return m
