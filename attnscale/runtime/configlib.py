"""Config helpers: `config.model` from `ModelConfig` (its one schema: each field's
default and doc), the `key=value,...` argument of `get_config(arg)`, validation,
renames and the migration of saved configs.

Configs are ml_collections ConfigDicts built by `configs/*.py:get_config(arg)`
(big_vision style: `--config=configs/shakespeare_char.py:preset=cpu,scaling=cosine`).
Every bad value fails at start with a one-line ValueError naming the field and
what is allowed.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict

from attnscale.checks import check_choice, check_positive  # noqa: F401 (configs use them here)
from attnscale.core import scalings
from attnscale.models.config import ModelConfig
from attnscale.runtime.config_imports import import_files, import_modules  # noqa: F401

OPTIMIZERS = ("adamw", "adam", "muon")  # config.optimizer (attnscale/runtime/optimizers.py)
# config.muon_lr_rule: how Muon's update is scaled across matrix shapes.
MUON_LR_RULES = ("moonlight", "modded_nanogpt")

# Fields that may change when a run resumes: bookkeeping, not the experiment
# ("mesh": all its fields; the devices change, the losses agree within float
# rounding and orbax restores across mesh shapes; "imports": where the user's
# modules live; "grad_accum_steps": the same batch in other micro-batches, so the
# same losses within float rounding, dropout masks aside). num_train_steps joins
# them only under a constant learning rate: it is the length of the cosine decay,
# so changing it would change the finished steps' run (`rundir.save_config`).
RESUMABLE_CHANGES = ("log_every", "eval_every", "eval_batches", "checkpoint_every",
                     "keep_checkpoints", "data_dir", "mesh", "remat", "imports",
                     "attn_metrics", "grad_accum_steps", "eval_tokens", "loggers",
                     "profile_steps", "sink_metrics_rows")


def flat_diff(old: dict, new: dict, prefix: str = ""):
  """(dotted key, old value, new value) for each leaf in which two nested dicts differ."""
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      yield from flat_diff(a, b, f"{prefix}{key}.")
    elif a != b:
      yield f"{prefix}{key}", a, b


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


def schema_fields(schema: type, *, top_level: bool = False) -> list[dataclasses.Field]:
  """The fields of a schema dataclass (`ModelConfig`) that its config holds; with
  `top_level`, those set from a top-level config field instead (`remat`)."""
  return [f for f in dataclasses.fields(schema)
          if bool(f.metadata.get("top_level")) == top_level]


def schema_default(f: dataclasses.Field) -> Any:
  """A schema field's default."""
  return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def model_fields(schema: type = ModelConfig) -> ml_collections.ConfigDict:
  """A ConfigDict of `schema`'s fields at their defaults: `config.model` before a
  config overrides what differs. A nested schema (`unit`) becomes a sub-config, a
  None default a typed placeholder (so `--config.model.num_kv_heads=2` type-checks)."""
  hints = typing.get_type_hints(schema)
  out = ml_collections.ConfigDict()
  for f in schema_fields(schema):
    default = schema_default(f)
    if dataclasses.is_dataclass(default):
      out[f.name] = model_fields(type(default))
    elif default is None:
      kinds = [t for t in typing.get_args(hints[f.name]) if t is not type(None)]
      out[f.name] = config_dict.placeholder(kinds[0])
    else:
      out[f.name] = default
  return out


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


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  """`config.model` as a `ModelConfig`, with the top-level fields it takes
  (`config.remat`, default none). A field ModelConfig lacks fails in one line
  (naming the new name of a renamed one)."""
  fields = config.model.to_dict()
  known = {f.name for f in schema_fields(ModelConfig)}
  for name in fields:
    if name in known:
      continue
    old = f"model.{name}"
    if old in RENAMED_FIELDS:
      raise ValueError(f"{old} was renamed to {RENAMED_FIELDS[old]}{value_hint(old)}")
    raise ValueError(f"{old} is not a model field (one of {sorted(known)})")
  top = {f.name: config.get(f.metadata["top_level"], schema_default(f))
         for f in schema_fields(ModelConfig, top_level=True)}
  return ModelConfig(**fields, **top)


# Config fields that moved or were renamed: old path -> new path. Overriding an
# old path fails with a one-line error naming the new one.
RENAMED_FIELDS: dict[str, str] = {
    f"model.{name}": f"model.unit.{name}"
    for name in ("residual_mult", "residual_attn_ratio", "residual_rule", "attn_residual")
} | {"model.qk_layernorm": "model.qk_norm"}
# A renamed field whose values changed too: old path -> {old value: new value}.
RENAMED_FIELD_VALUES: dict[str, dict] = {
    "model.qk_layernorm": {True: "layernorm", False: "none"},
}
# Top-level fields added since runs were saved: name -> the value that reproduces
# an older run (`migrate` fills them in, and model fields from ModelConfig's
# defaults, so an old config.json loads and resumes).
ADDED_FIELDS: dict[str, Any] = {"imports": [], "attn_metrics": False, "qk_clip": 0.0,
                                "muon_lr_rule": "moonlight", "grad_accum_steps": 1,
                                "muon_adam_lr_mult": 1.0, "muon_adam_lr_base_width": 0,
                                "loggers": "tensorboard,jsonl", "profile_steps": "",
                                "z_loss": 0.0, "sink_metrics_rows": 0, "init_from": ""}


def _fill_defaults(config: dict, defaults: dict) -> None:
  for key, value in defaults.items():
    if isinstance(value, dict) and isinstance(config.get(key), dict):
      _fill_defaults(config[key], value)
    else:
      config.setdefault(key, value)


def value_hint(old: str) -> str:
  """" (model.qk_norm=layernorm for True, ...)" for a renamed field whose values changed."""
  values = RENAMED_FIELD_VALUES.get(old)
  if not values:
    return ""
  return " (" + ", ".join(f"{RENAMED_FIELDS[old]}={new} for {old_value}"
                          for old_value, new in values.items()) + ")"


def migrate(config: dict) -> dict:
  """A saved config.json (a dict) from before a rename, in today's field names.

  Moves every `RENAMED_FIELDS` entry (mapping its values by
  `RENAMED_FIELD_VALUES`: model.qk_layernorm=True -> model.qk_norm="layernorm"),
  renames values (`model.variant` "unit_scaled" -> "unit") and fills in
  `ADDED_FIELDS`, so runs trained before still evaluate and resume.
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
    value = src.pop(old_key)
    dst[new_key] = RENAMED_FIELD_VALUES.get(old, {}).get(value, value)
  for key, value in ADDED_FIELDS.items():
    config.setdefault(key, value)
  if "model" in config:  # a model field it predates: ModelConfig's default, as it then was
    _fill_defaults(config["model"], model_fields().to_dict())
  model = config.get("model", {})
  if model.get("variant") == "unit_scaled":
    model["variant"] = "unit"
  if model.get("scaling") in scalings.RENAMED:  # a registered scaling's old name
    model["scaling"] = scalings.RENAMED[model["scaling"]]
  return config


def run_label(config: ml_collections.ConfigDict) -> str:
  """The one name of a run's attention setup (log line, eval.json, sweeps, studies).

  The scaling's registered name; Graphcore's experiment (fully scaled attention in
  the unit-scaled, residual-weighted transformer) is "unit_scaled", the config
  argument that selects it; model options that change attention are appended,
  and "+post_ln" for a post-LN block (BERT's: `model.ln_position`), so a sweep's
  post-LN and pre-LN runs of one scaling are two labels.
  """
  m = config.model
  label = m.scaling
  params = dict(m.get("scaling_params") or {})
  if params:  # fixed parameters: cosine(temperature=10), key_norm_power(p=2)
    label += "(" + ",".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                            for k, v in sorted(params.items())) + ")"
  if m.get("variant", "standard") != "standard":
    label = scalings.preset_of(m) or f"unit/{m.scaling}"  # "unit_scaled": a preset's name
  if m.get("ln_position", "pre") == "post":  # BERT's block: a different model, same scaling
    label += "+post_ln"
  # model.qk_norm: "+qk_layernorm" as when it was model.qk_layernorm=True.
  qk_norm = m.get("qk_norm", "layernorm" if m.get("qk_layernorm") else "none")
  if qk_norm != "none":
    label += f"+qk_{qk_norm}"
  if m.get("shared_kv"):
    label += "+shared_kv"
  if m.get("num_kv_heads") and m.num_kv_heads != m.num_heads:
    label += f"+kv_heads{m.num_kv_heads}"  # grouped-query attention
  if m.get("normalizer", "softmax") != "softmax":
    label += f"+{m.normalizer}"
  if m.get("logit_softcap"):
    label += f"+softcap{m.logit_softcap:g}"
  if m.get("sink", "none") != "none":
    label += f"+sink_{m.sink}"
  if m.get("attn_gate", "none") != "none":
    label += f"+gate_{m.attn_gate}"
  if m.get("forget_gate", False):
    label += "+fox"
  if m.get("differential", False):
    label += "+diff"
  if m.get("selective", False):
    label += "+selective"
  if m.get("parameterization", "sp") != "sp":
    label += f"+{m.parameterization}"
  for name in ("mup_output_mult", "mup_attn_mult"):  # muP's base multipliers
    if m.get(name, 1.0) != 1:
      label += f"+{name.removeprefix('mup_')}{m[name]:g}"
  if m.get("mup_vector_lr", "constant") != "constant":  # an ablation of muP's rates
    label += f"+vector_lr_{m.mup_vector_lr}"
  if m.get("depth_alpha"):  # the depth rule (attnscale/models/mup.py)
    label += f"+depth_alpha{m.depth_alpha:g}"
  if config.get("qk_clip"):  # a training rule, but it changes the attention's logits
    label += f"+qk_clip{config.qk_clip:g}"
  if config.get("z_loss"):  # a loss term on the output logits
    label += f"+z_loss{config.z_loss:g}"
  if config.get("optimizer") == "muon":  # the optimizer decides what transfers across width
    rule = config.get("muon_lr_rule", "moonlight")
    label += "+muon" + ("" if rule == "moonlight" else f"_{rule}")
    if config.get("muon_adam_lr_mult", 1.0) != 1:
      label += f"+adam_lr{config.muon_adam_lr_mult:g}"
    if config.get("muon_adam_lr_base_width", 0):
      label += f"+adam_per_width{config.muon_adam_lr_base_width}"
  return label


def add_devices(c: ml_collections.ConfigDict) -> None:
  """The fields every config shares for where and how it runs: mesh and remat."""
  # Devices: a data x fsdp mesh over every device of every process
  # (docs/guides/pods-and-gpus.md). The batch is sharded on both axes; params
  # and optimizer state on fsdp (FSDP), replicated over data. -1 = all the rest.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # data-parallel replicas
  c.mesh.fsdp = 1  # devices each parameter is split over (1 = replicated)
  # Rematerialisation of each block, for models that do not fit: none | full (keep
  # only each block's input) | dots (keep matmul outputs). compile.py shows the saving.
  c.remat = "none"
  # Gradient accumulation: each step's batch_size rows in this many micro-batches run one
  # after another (activation memory / this); the loss and gradient are the one batch's.
  c.grad_accum_steps = 1
  add_outputs(c)


def add_outputs(c: ml_collections.ConfigDict) -> None:
  """The fields every config shares for what a run writes besides checkpoints:
  loggers (attnscale/runtime/trackers.py) and profile_steps (runtime/profiling.py)."""
  # Where metrics go, comma-separated: tensorboard, jsonl (always: the run's record) and
  # experiment trackers: wandb | trackio (optional extras; offline files, in the workdir or
  # trackio's store). A tracker that cannot start costs one warning line, never the run.
  c.loggers = "tensorboard,jsonl"
  # "START:STOP": a jax.profiler trace of steps START+1..STOP into WORKDIR/tensorboard
  # (TensorBoard's profile plugin, Perfetto); "" = off.
  c.profile_steps = ""


def add_optimizer(c: ml_collections.ConfigDict, *, learning_rate: float) -> None:
  """The optimizer fields every config shares: the optimizer and its Muon options,
  the peak `learning_rate` (the config's own), a cosine schedule and init_from."""
  c.optimizer = "adamw"  # adamw | adam (no weight decay) | muon (hidden matrices; Adam(W) the rest)
  # muon: its update's scale by shape: moonlight (RMS 0.2 sqrt(max(fan_in, fan_out)), one LR
  # with AdamW's) | modded_nanogpt (sqrt(max(1, fan_out/fan_in)))
  c.muon_lr_rule = "moonlight"
  # muon: the Adam(W) branch's rate (embeddings, readout, gains) as a multiple of
  # learning_rate (Moonlight and Kimi: 1, one rate; modded-nanogpt tunes it apart)
  c.muon_adam_lr_mult = 1.0
  # muon: > 0 also scales that rate by this / model.width (Adam's 1/width: the branch
  # runs at learning_rate x muon_adam_lr_mult at this width); 0: the same at every width
  c.muon_adam_lr_base_width = 0
  c.learning_rate = learning_rate  # peak learning rate
  c.lr_schedule = "cosine"  # cosine (to min_learning_rate) | constant
  # A run directory whose newest parameters a new run starts from (optimizer state fresh;
  # shapes must match: e.g. rope or no positions to train longer); "" = a fresh init.
  c.init_from = ""


def add_attention_health(c: ml_collections.ConfigDict) -> None:
  """The fields every config shares for training health: attn_metrics, qk_clip,
  sink_metrics_rows and z_loss (docs/guides/training.md, "Attention health and QK-clip")."""
  # Log each layer's largest attention logit and mean entropy (per head in metrics.jsonl)
  # every log_every steps, from the fused kernel; False = today's step program exactly.
  c.attn_metrics = True
  # QK-clip threshold tau (Kimi K2: 100; 0 = off): after each step, the q/k weights of a
  # head whose largest logit S passed tau are scaled so that it is tau (GQA: q only).
  c.qk_clip = 0.0
  # Log each layer's attention sinks (sink rate, sink heads) and massive activations
  # (max, max/median, kurtosis) every log_every steps, eval.py's measures on this many
  # rows of the step's batch, one extra forward pass (training unchanged); 0 = off.
  c.sink_metrics_rows = 8
  # z-loss coefficient (PaLM: 1e-4; 0 = off): minimise the loss + z_loss * mean (log Z)^2 of
  # the output softmax (train/loss stays the cross-entropy, train/z_loss is the term). The
  # output logits' max and mean log Z are logged on every run.
  c.z_loss = 0.0


def validate(config: ml_collections.ConfigDict, *, num_devices: int = 1) -> ModelConfig:
  """Checks the fields train.py relies on; raises a one-line ValueError. Returns
  `model_config(config)`, which the checks build (`run_config.read` keeps it).

  First imports `config.imports` (`import_modules`). The generic fields here; the
  task's own (its dataset names, the masked LM's rates, ...) in its
  `validate_config`, which runs before any data is loaded.
  """
  # Imported here: configs import configlib without needing the data pipelines.
  from attnscale import tasks
  from attnscale.runtime import profiling, trackers
  import_modules(config)  # the user's scalings, variants, tasks: before they are checked
  task_cls = tasks.task_class(config)
  check_choice("config.optimizer", config.optimizer, OPTIMIZERS)
  check_choice("config.muon_lr_rule", config.get("muon_lr_rule", "moonlight"), MUON_LR_RULES)
  check_choice("config.lr_schedule", config.lr_schedule, ("constant", "cosine"))
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
  accum = config.get("grad_accum_steps", 1)
  if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
    raise ValueError(f"config.grad_accum_steps must be an integer >= 1, got {accum!r}")
  if config.batch_size % (accum * num_devices):
    raise ValueError(f"config.batch_size ({config.batch_size}) must be divisible by "
                     f"config.grad_accum_steps x the number of devices ({accum} x "
                     f"{num_devices} = {accum * num_devices}): each device's rows are split "
                     "into grad_accum_steps micro-batches")
  task_cls.validate_config(config)
  trackers.parse(config.get("loggers", trackers.DEFAULT))
  profiling.parse(config.get("profile_steps", ""), config.num_train_steps)
  cfg = model_config(config)  # every model field: ModelConfig's checks
  if config.optimizer == "muon" and (cfg.variant, cfg.parameterization) != ("standard", "sp"):
    raise ValueError(f"config.optimizer='muon' needs model.variant='standard' and "
                     f"model.parameterization='sp' (Muon's shape rule is its own width rule, "
                     f"and it finds the matrices by the Dense kernels), got "
                     f"{cfg.variant!r} and {cfg.parameterization!r}")
  adam_mult = config.get("muon_adam_lr_mult", 1.0)
  check_positive("config.muon_adam_lr_mult", adam_mult)
  if adam_mult != 1 and config.optimizer != "muon":
    raise ValueError(f"config.muon_adam_lr_mult={adam_mult:g} scales the rate of Muon's "
                     f"Adam(W) branch and needs config.optimizer='muon' (got "
                     f"{config.optimizer!r}); leave it at 1")
  base_width = config.get("muon_adam_lr_base_width", 0)
  if not isinstance(base_width, int) or base_width < 0:
    raise ValueError(f"config.muon_adam_lr_base_width must be a width >= 0 (0: off), "
                     f"got {base_width!r}")
  if base_width and config.optimizer != "muon":
    raise ValueError(f"config.muon_adam_lr_base_width={base_width} scales the rate of "
                     f"Muon's Adam(W) branch and needs config.optimizer='muon' (got "
                     f"{config.optimizer!r}); leave it at 0")
  check_positive("config.qk_clip", config.get("qk_clip", 0.0), allow_zero=True)
  z_loss = config.get("z_loss", 0.0)
  if isinstance(z_loss, bool) or not isinstance(z_loss, (int, float)) or not (
      math.isfinite(z_loss) and z_loss >= 0):
    raise ValueError(f"config.z_loss must be a finite number >= 0 (PaLM: 1e-4; 0 = off), "
                     f"got {z_loss!r}")
  rows = config.get("sink_metrics_rows", 0)
  if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
    raise ValueError(f"config.sink_metrics_rows must be an integer >= 0 (0 = off), "
                     f"got {rows!r}")
  if config.get("qk_clip", 0.0):
    from attnscale.models import base  # the model layer's rule of what QK-clip can scale
    reason = base.qk_clip_refusal(cfg)
    if reason:
      raise ValueError(f"config.qk_clip={config.qk_clip:g} cannot apply: {reason}; use "
                       "config.qk_clip=0")
  if config.seq_len > config.model.block_size:
    raise ValueError(f"config.seq_len ({config.seq_len}) must be <= model.block_size "
                     f"({config.model.block_size}), the training context length (and "
                     "the learned position table's)")
  return cfg


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
