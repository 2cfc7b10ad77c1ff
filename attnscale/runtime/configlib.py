"""Config helpers: the `key=value,...` argument of `get_config(arg)`, and validation.

Configs are ml_collections ConfigDicts built by `configs/*.py:get_config(arg)`
(big_vision style: `--config=configs/shakespeare_char.py:preset=cpu,scaling=cosine`).
Every bad value fails at start with a one-line ValueError naming the field and
what is allowed.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from attnscale.checks import check_choice, check_positive  # noqa: F401 (configs use them here)
from attnscale.core import scalings


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


def add_attention_fields(m: ml_collections.ConfigDict, scaling: str, *, p: float = 2.0,
                         temperature: float = 0.0) -> None:
  """The attention fields every model config shares, set on `config.model`.

  `scaling` is the config argument's: a registered name, or "unit_scaled",
  Graphcore's experiment (docs/science.md, "Unit scaling and the residual rule"):
  fully scaled attention inside the unit-scaled transformer (`model.variant=unit`),
  its branch weighted to sqrt(e/n) of the skip. (`--config.model.scaling=umup`
  instead picks u-muP's 1/d attention.)
  """
  m.scaling = scaling  # attention scaling: attnscale.scalings.names()
  m.scaling_params = {}  # its params (e.g. key_norm_power's p); a learned one set here is fixed
  if scaling == "key_norm_power":
    m.scaling_params = {"p": p}
  elif scaling == "cosine" and temperature > 0:  # a fixed temperature instead of the learned one
    m.scaling_params = {"temperature": temperature}
  m.qk_layernorm = False  # learned LayerNorm on q, k before the scaling
  m.shared_kv = False  # W_K = W_V
  m.normalizer = "softmax"  # softmax | sigmoid (the softmax alternative; slow path)
  m.attention_impl = config_dict.placeholder(str)  # None/xla/cudnn fused, or reference
  m.logit_softcap = 0.0  # c > 0: logits -> c tanh(logits / c) (Gemma 2: 50); 0 = off
  m.sink = "none"  # none | zero (off-by-one softmax) | learned (a sink logit per head)
  m.attn_gate = "none"  # none | headwise | elementwise: output * sigmoid(x W_g)
  m.positions = "learned"  # learned | rope (rotary on q, k) | none (NoPE; causal only)
  m.rope_base = 10000.0  # rotary frequency base
  # float32 | bfloat16 | float16 (no loss scaling) | fp8 (simulated: e4m3 product inputs,
  # e5m2 gradients; attnscale/numerics/precision.py); params, softmax and loss stay float32.
  m.dtype = "float32"
  m.fp8_scaling = "none"  # model.dtype=fp8: none | per_tensor (power-of-2 scale, current amax)
  m.variant = "standard"  # attnscale.models.VARIANTS: standard | unit
  # The unit-scaled, residual-weighted transformer's own fields
  # (attnscale/models/unit_transformer.py).
  m.unit = ml_collections.ConfigDict()
  m.unit.residual_mult = 1.0  # u-muP: all branches' weight against the embedding
  m.unit.residual_attn_ratio = 1.0  # u-muP: attention / MLP branch weight ratio
  m.unit.residual_rule = "umup"  # umup: (tau f + x)/sqrt(1+tau^2) | 2023: sqrt(1-tau) x + sqrt(tau) f
  m.unit.attn_residual = "rule"  # rule | relative: attention tau x sqrt(e/n) (Graphcore's fix)
  # The gradient reaching the logits scaled to unit std, as unit_scaling's
  # cross_entropy does (False: the plain mean's ~1/(B T sqrt(V)), which low precision flushes).
  m.unit.scaled_loss = True
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
  params = dict(m.get("scaling_params") or {})
  if params:  # fixed parameters: cosine(temperature=10), key_norm_power(p=2)
    label += "(" + ",".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                            for k, v in sorted(params.items())) + ")"
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
  if m.get("logit_softcap"):
    label += f"+softcap{m.logit_softcap:g}"
  if m.get("sink", "none") != "none":
    label += f"+sink_{m.sink}"
  if m.get("attn_gate", "none") != "none":
    label += f"+gate_{m.attn_gate}"
  return label


def validate(config: ml_collections.ConfigDict, *, num_devices: int = 1) -> None:
  """Checks the fields train.py relies on; raises a one-line ValueError.

  The generic fields here; the task's own (its dataset names, the masked LM's
  rates, ...) in its `validate_config`, which runs before any data is loaded.
  """
  # Imported here: configs import configlib without needing the data pipelines.
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
  mesh_shape(config, num_devices)
  if config.batch_size % num_devices:
    raise ValueError(f"config.batch_size ({config.batch_size}) must be divisible by the "
                     f"number of devices ({num_devices}): the batch is sharded on "
                     "config.mesh.data x config.mesh.fsdp, every device")
  task_cls.validate_config(config)
  if config.seq_len > config.model.block_size:
    raise ValueError(f"config.seq_len ({config.seq_len}) must be <= model.block_size "
                     f"({config.model.block_size}), the training context length (and "
                     "the learned position table's)")


def mesh_shape(config: ml_collections.ConfigDict | None, num_devices: int) -> tuple[int, int]:
  """The (data, fsdp) device counts of `config.mesh` on `num_devices` devices.

  -1 in one field takes all the rest; a config without a `mesh` (None, or a
  config.json written before it existed) puts every device on `data`.

  Raises:
    ValueError: a count that is neither >= 1 nor -1, both -1, or counts that do
      not multiply to (or divide) the device count; one line, naming the field.
  """
  mesh = None if config is None else config.get("mesh")
  data, fsdp = (-1, 1) if mesh is None else (mesh.data, mesh.fsdp)
  for field, value in (("data", data), ("fsdp", fsdp)):
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
      raise ValueError(f"config.mesh.{field} must be a device count >= 1 or -1 (all the "
                       f"rest), got {value!r}")
  if data == fsdp == -1:
    raise ValueError("config.mesh.data and config.mesh.fsdp cannot both be -1 (all the rest): "
                     "give one of them a device count")
  if -1 in (data, fsdp):
    field, count = ("fsdp", fsdp) if data == -1 else ("data", data)
    if num_devices % count:
      raise ValueError(f"config.mesh.{field} ({count}) must divide the device count "
                       f"({num_devices})")
    rest = num_devices // count
    return (rest, count) if data == -1 else (count, rest)
  if data * fsdp != num_devices:
    raise ValueError(f"config.mesh.data x config.mesh.fsdp ({data} x {fsdp} = {data * fsdp}) "
                     f"must equal the device count ({num_devices}); -1 in one of them takes "
                     "all the rest")
  return data, fsdp
