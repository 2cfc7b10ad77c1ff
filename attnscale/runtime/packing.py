"""Which runs can share one compiled train step (a pack), and the configs of a pack's runs.

Light (no JAX): sweep.py groups its points with it before anything is compiled;
`attnscale.runtime.packed` trains a pack.

A train step depends on a config's fields in two ways. Most make the program: the
model, the batch and sequence shapes, the number of steps, the schedule's form,
the optimizer. A few enter it only as numbers, `TRACED_FIELDS`: the learning
rate and the cosine's floor, AdamW's weight decay, the clipping thresholds,
QK-clip's tau, the z-loss coefficient and the seed (init, data order and dropout
are functions of it and the step). Runs that differ only in those, and in
bookkeeping (where each logs, evaluates and saves), train as one vmapped program
with the numbers passed in as arrays of R values (R: the pack size). Adam's b1 and b2 stay out: optax computes 1 - b in Python
(float64) from a number but in float32 from an array, which would move every
step's moments by up to 1e-5 relative, not a rounding.
"""

from __future__ import annotations

import importlib.util
import json
import os

import ml_collections

from attnscale.config import migration
from attnscale.config import run as run_config

# The fields a packed step takes as arrays (`RunConfig.hparams`), those that are
# also a branch (on when > 0: on in every run of a pack or in none), and what may
# differ between the runs of a pack (the traced fields and bookkeeping): each field's
# declared kind (attnscale/config/run.py).
TRACED_FIELDS = run_config.TRACED_FIELDS
SWITCHES = run_config.SWITCHES
PACK_FREE_FIELDS = run_config.pack_free_fields()


def pack_key(config: ml_collections.ConfigDict) -> str:
  """What a run's program depends on: runs with equal keys can share a pack."""
  flat = json.loads(config.to_json())
  key = {k: v for k, v in flat.items() if k not in PACK_FREE_FIELDS}
  key["switches"] = {k: bool(flat.get(k, 0.0)) for k in SWITCHES}
  return json.dumps(key, sort_keys=True)


def check_packable(configs) -> None:
  """Raises a one-line ValueError naming the first field in which a run differs from
  the first beyond `PACK_FREE_FIELDS`, or a switch on in one and off in the other."""
  if not configs:
    raise ValueError("a pack needs at least one run")
  first = json.loads(configs[0].to_json())
  for i, config in enumerate(configs[1:], 1):
    other = json.loads(config.to_json())
    for name, a, b in migration.flat_diff(first, other):
      if name.split(".")[0] not in PACK_FREE_FIELDS:
        raise ValueError(
            f"run {i} of the pack differs from run 0 in {name} ({b!r} against {a!r}): the "
            f"runs of a pack may differ only in {', '.join(TRACED_FIELDS)} (and "
            "bookkeeping); run it in another pack")
    for name in SWITCHES:
      if bool(first.get(name, 0.0)) != bool(other.get(name, 0.0)):
        raise ValueError(
            f"run {i} of the pack has config.{name}={other.get(name, 0.0)!r} and run 0 "
            f"{first.get(name, 0.0)!r}: config.{name} must be on (> 0) in every run of a "
            "pack or in none")


def groups(configs, size: int) -> list[list[int]]:
  """The indices of `configs` in packs of at most `size` runs that share a program.

  Runs with equal `pack_key`s go together in their given order; packs are in the
  order of their first run, so a sweep ordered by priority keeps it within each
  kind of run.
  """
  if not isinstance(size, int) or size < 1:
    raise ValueError(f"the pack size must be a positive integer, got {size!r}")
  by_key: dict[str, list[int]] = {}
  for i, config in enumerate(configs):
    by_key.setdefault(pack_key(config), []).append(i)
  packs = [members[j:j + size] for members in by_key.values()
           for j in range(0, len(members), size)]
  return sorted(packs, key=lambda p: p[0])


def load_config(config_arg: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
  """What `train.py --config=FILE:ARG --config.KEY=VALUE ...` makes of a run.

  `overrides`: dotted field -> value (a JSON list becomes a tuple). The config is
  locked afterwards, as train.py's is.

  Raises:
    ValueError: no such config file, or an override of a field it lacks.
  """
  path, _, arg = config_arg.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"--config {path} is not a config file")
  spec = importlib.util.spec_from_file_location("_packed_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(arg)
  for key, value in (overrides or {}).items():
    *parents, name = key.split(".")
    node = config
    for parent in parents:
      node = node.get(parent) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      raise ValueError(f"--config.{key}: the config has no field {key}")
    node[name] = tuple(value) if isinstance(value, list) else value
  config.lock()
  return config


def command(runs: list[dict], python: str, pack_size: int | None = None) -> list[str]:
  """The argv that trains `runs` ({"config": "FILE:ARG", "overrides": {...},
  "workdir": DIR}, each as train.py would) packed: train.py's command with `--runs`.

  `pack_size`: the program's R slots (default: one slot per run). A sweep passes its own,
  so that a short pack trains its runs as a full one would (a run's numbers depend
  on R, not on its pack-mates: attnscale/runtime/packed.py)."""
  size = [] if pack_size is None else [f"--pack_size={pack_size}"]
  return [python, "-m", "attnscale.commands.train", *size, "--runs=" + json.dumps(runs)]
