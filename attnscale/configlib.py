"""Config helpers: the `key=value,...` argument of `get_config(arg)`, and validation.

Configs are ml_collections ConfigDicts built by `configs/*.py:get_config(arg)`
(big_vision style: `--config=configs/shakespeare_char.py:preset=cpu,scaling=cosine`).
Every bad value fails at start with a one-line ValueError naming the field and
what is allowed.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from attnscale import scalings


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


def add_attention_fields(m: ml_collections.ConfigDict, scaling: str, *, p: float = 2.0) -> None:
  """The attention fields every model config shares, set on `config.model`.

  `scaling` is the config argument's: a registered name, or "unit_scaled",
  Graphcore's experiment (docs/science.md, "Unit scaling and the residual rule"):
  fully scaled attention inside the unit-scaled transformer (`model.variant=unit`),
  its branch weighted to sqrt(e/n) of the skip. (`--config.model.scaling=umup`
  instead picks u-muP's 1/d attention.)
  """
  m.scaling = scaling  # attention scaling: attnscale.scalings.names()
  m.scaling_params = {"p": p} if scaling == "key_norm_power" else {}  # its params
  m.qk_layernorm = False  # learned LayerNorm on q, k before the scaling
  m.shared_kv = False  # W_K = W_V
  m.normalizer = "softmax"  # softmax | sigmoid (the softmax alternative; slow path)
  m.attention_impl = config_dict.placeholder(str)  # None/xla/cudnn fused, or reference
  m.positions = "learned"  # learned | rope (rotary on q, k) | none (NoPE; causal only)
  m.rope_base = 10000.0  # rotary frequency base
  m.dtype = "float32"  # compute dtype (bfloat16 for mixed precision); params float32
  m.variant = "standard"  # attnscale.models.VARIANTS: standard | unit
  # The unit-scaled, residual-weighted transformer's own fields
  # (attnscale/models/unit_transformer.py).
  m.unit = ml_collections.ConfigDict()
  m.unit.residual_mult = 1.0  # u-muP: all branches' weight against the embedding
  m.unit.residual_attn_ratio = 1.0  # u-muP: attention / MLP branch weight ratio
  m.unit.residual_rule = "umup"  # umup: (tau f + x)/sqrt(1+tau^2) | 2023: sqrt(1-tau) x + sqrt(tau) f
  m.unit.attn_residual = "rule"  # rule | relative: attention tau x sqrt(e/n) (Graphcore's fix)
  if scaling == "unit_scaled":
    m.variant, m.scaling, m.unit.attn_residual = "unit", "fully_scaled", "relative"


# Config fields that moved or were renamed: old path -> new path. Overriding an
# old path fails with a one-line error naming the new one.
RENAMED_FIELDS: dict[str, str] = {
    f"model.{name}": f"model.unit.{name}"
    for name in ("residual_mult", "residual_attn_ratio", "residual_rule", "attn_residual")
}


def migrate(config: dict) -> dict:
  """A saved config.json (a dict) from before a rename, in today's field names.

  Moves every `RENAMED_FIELDS` entry and renamed value (`model.variant`
  "unit_scaled" -> "unit"), so runs trained before the rename still evaluate and
  resume.
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
    dst[new_key] = src.pop(old_key)
  model = config.get("model", {})
  if model.get("variant") == "unit_scaled":
    model["variant"] = "unit"
  if model.get("scaling") == "unit_scaled":  # the registered u-muP attention
    model["scaling"] = "umup"
  return config


def run_label(config: ml_collections.ConfigDict) -> str:
  """The one name of a run's attention setup (log line, eval.json, sweeps, studies).

  The scaling's registered name; Graphcore's experiment (fully scaled attention in
  the unit-scaled, residual-weighted transformer) is "unit_scaled", the config
  argument that selects it; model options that change attention are appended.
  """
  m = config.model
  label = m.scaling
  if m.get("variant", "standard") != "standard":
    if m.scaling == "fully_scaled" and m.unit.attn_residual == "relative":
      label = "unit_scaled"
    else:
      label = f"unit/{m.scaling}"
  for option in ("qk_layernorm", "shared_kv"):
    if m.get(option):
      label += f"+{option}"
  if m.get("normalizer", "softmax") != "softmax":
    label += f"+{m.normalizer}"
  return label


def check_choice(field: str, value, allowed) -> None:
  if value not in allowed:
    raise ValueError(f"{field} must be one of {list(allowed)}, got {value!r}")


def check_positive(field: str, value, *, allow_zero: bool = False) -> None:
  ok = value >= 0 if allow_zero else value > 0
  if not ok:
    raise ValueError(f"{field} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def validate(config: ml_collections.ConfigDict, *, num_devices: int = 1) -> None:
  """Checks the fields train.py relies on; raises a one-line ValueError.

  The generic fields here; the task's own (its dataset names, the masked LM's
  rates, ...) in its `validate_config`, which runs before any data is loaded.
  """
  # Imported here: the tasks sit above configlib (they use its check_* helpers),
  # and configs import configlib without needing the data pipelines.
  from attnscale import tasks
  task_cls = tasks.task_class(config)
  check_choice("config.optimizer", config.optimizer, ("adamw", "adam"))
  check_choice("config.lr_schedule", config.lr_schedule, ("constant", "cosine"))
  check_choice("model.scaling", config.model.scaling, scalings.names())
  for field in ("batch_size", "seq_len", "num_train_steps", "log_every", "eval_every",
                "checkpoint_every", "keep_checkpoints", "eval_batches"):
    check_positive(f"config.{field}", config[field])
  for field in ("learning_rate", "warmup_steps", "min_learning_rate", "weight_decay",
                "grad_clip"):
    check_positive(f"config.{field}", config[field], allow_zero=True)
  if config.learning_rate == 0:
    raise ValueError("config.learning_rate must be > 0, got 0")
  if config.batch_size % num_devices:
    raise ValueError(f"config.batch_size ({config.batch_size}) must be divisible by the "
                     f"number of devices ({num_devices})")
  task_cls.validate_config(config)
  if config.seq_len > config.model.block_size:
    raise ValueError(f"config.seq_len ({config.seq_len}) must be <= model.block_size "
                     f"({config.model.block_size}), the training context length (and "
                     "the learned position table's)")
