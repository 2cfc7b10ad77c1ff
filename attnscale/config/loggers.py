"""The names `config.loggers` takes: MetricsWriter's own sinks and the registered trackers.

    @loggers.register("wandb")          # attnscale/runtime/trackers.py: class WandbTracker
    loggers.parse("tensorboard,jsonl,wandb") -> ("tensorboard", "jsonl", "wandb")

The registry keeps each tracker's class (a `attnscale.runtime.trackers.Tracker`,
or your own from a module in `config.imports`) under its name, so that the config is
checked against it when it is read and the metrics' sink starts it by name.
"""

from __future__ import annotations

BUILTIN = ("tensorboard", "jsonl")  # MetricsWriter's own sinks
DEFAULT = "tensorboard,jsonl"
_REGISTRY: dict[str, type] = {}


def register(name: str):
  """Decorator: registers a `Tracker` subclass under the name `config.loggers` uses."""
  def deco(cls):
    if name in BUILTIN:
      raise ValueError(f"tracker name {name!r} is taken by MetricsWriter's own sinks")
    _REGISTRY[name] = cls
    return cls
  return deco


def names() -> list[str]:
  """Every name config.loggers accepts."""
  return [*BUILTIN, *_REGISTRY]


def parse(loggers: str | None) -> tuple[str, ...]:
  """config.loggers ("tensorboard,jsonl,wandb") as names; a one-line ValueError for
  an unknown name or a missing jsonl."""
  if not isinstance(loggers, str):
    raise ValueError(f"config.loggers must be comma-separated names from {names()} "
                     f"(e.g. 'tensorboard,jsonl,wandb'), got {loggers!r}")
  out = tuple(dict.fromkeys(n.strip() for n in loggers.split(",") if n.strip()))
  for name in out:
    if name not in names():
      raise ValueError(f"config.loggers: {name!r} is not one of {names()} (comma-separated, "
                       "e.g. 'tensorboard,jsonl,wandb'; your own: trackers.register)")
  if "jsonl" not in out:
    raise ValueError(f"config.loggers must include 'jsonl' (metrics.jsonl is the run's "
                     f"record that resume, eval.py and sweeps read), got {loggers!r}")
  return out


def registered(name: str) -> type:
  """The tracker class registered under `name`."""
  return _REGISTRY[name]
