"""`RunConfig`: every top-level run field declared once, read once at start.

    run = config.read(config_dict, num_devices)   # train.py, a pack, eval.py: validated
    run = config.of(config_dict_or_run)           # a test or a tool: converted, unchecked

A user writes a ConfigDict (`configs/*.py:get_config(arg)`, big_vision style, every
field overridable on the command line); `read` is the one conversion and
validation a start makes, into a frozen `RunConfig`: the typed top-level fields
declared below (each with its default, doc, kind and history: `fields.field`), the
mesh, the model's `ModelConfig`, the task's own fields (declared by the task:
`Task.CONFIG_FIELDS`) and the run's declared identity (`RunConfig.label`, the sweep's
name for it). Packing, resuming, the migration of old config.json files and
the config reference (docs/reference/config.md) all read the declarations, so a
new field is one declaration here (and its use).

`hparams`: the traced fields (`TRACED_FIELDS`) as the config's Python numbers. A
single run's program folds them in as constants; a pack stacks them into arrays
(`attnscale.runtime.packed`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
from collections.abc import Mapping
from typing import Any

import ml_collections

from attnscale import fields
from attnscale.core import scalings
from attnscale.fields import field
from attnscale.models.config import REMATS, ModelConfig

OPTIMIZERS = ("adamw", "adam", "muon")  # config.optimizer (attnscale/runtime/optimizers.py)
# config.muon_lr_rule: how Muon's update is scaled across matrix shapes.
MUON_LR_RULES = ("moonlight", "modded_nanogpt")
LR_SCHEDULES = ("constant", "cosine")
DEFAULT_LOGGERS = "tensorboard,jsonl"


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """`config.mesh`: a data x fsdp mesh over every device of every process
  (docs/guides/pods-and-gpus.md). The batch is sharded on both axes; params and
  optimizer state on fsdp (FSDP), replicated over data. -1 = all the rest."""

  data: int = fields.field(-1, "data-parallel replicas", kind="layout")
  fsdp: int = fields.field(1, "devices each parameter is split over (1 = replicated)",
                           kind="layout")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One run's config: every top-level field, typed, with the model's and the task's."""

  # What is trained.
  task: str = field("char_lm", "what train.py trains: the task decides data, loss and eval")
  dataset: str = field("tiny_shakespeare_char", "the corpus (one of the task's DATASETS)")
  data_dir: str | None = field(None, "the data set's directory; None = TFDS's default",
                               kind="bookkeeping")
  seed: int = field(0, "one seed for init, data order and dropout: a run is (config, seed)",
                    kind="traced")
  imports: tuple = field(
      (), "your own scalings, model variants or tasks: module names or .py paths imported "
      "before the config is checked, e.g. --config.imports='(\"my_scalings\",)'; saved in "
      "config.json, so eval.py and the studies import them too",
      kind="bookkeeping", since=[])

  # Optimisation.
  batch_size: int = field(64, "global batch (sequences), split over all devices",
                          positive="> 0")
  seq_len: int = field(256, "training window length (<= model.block_size)", positive="> 0")
  num_train_steps: int = field(
      5000, "total optimizer steps (raised on a finished run under a constant schedule: "
      "it continues)", positive="> 0")
  optimizer: str = field(
      "adamw", "adamw | adam (no weight decay) | muon (hidden matrices; Adam(W) the rest)",
      choices=OPTIMIZERS)
  muon_lr_rule: str = field(
      "moonlight", "muon: its update's scale by shape: moonlight (RMS 0.2 sqrt(max(fan_in, "
      "fan_out)), one LR with AdamW's) | modded_nanogpt (sqrt(max(1, fan_out/fan_in)))",
      choices=MUON_LR_RULES, since="moonlight")
  muon_adam_lr_mult: float = field(
      1.0, "muon: the Adam(W) branch's rate (embeddings, readout, gains) as a multiple of "
      "learning_rate (Moonlight and Kimi: 1, one rate; modded-nanogpt tunes it apart)",
      positive="> 0", since=1.0)
  muon_adam_lr_base_width: int = field(
      0, "muon: > 0 also scales that rate by this / model.width (Adam's 1/width: the branch "
      "runs at learning_rate x muon_adam_lr_mult at this width); 0: the same at every width",
      positive=">= 0", allowed="a width >= 0 (0: off)", since=0)
  learning_rate: float = field(1e-3, "peak learning rate", kind="traced", positive=">= 0")
  lr_schedule: str = field("cosine", "cosine (to min_learning_rate) | constant",
                           choices=LR_SCHEDULES)
  init_from: str = field(
      "", "a run directory whose newest parameters a new run starts from (optimizer state "
      "fresh; shapes must match: e.g. rope or no positions to train longer); \"\" = a fresh "
      "init", since="")
  warmup_steps: int = field(100, "linear warm-up from 0", positive=">= 0")
  min_learning_rate: float = field(1e-4, "end of the cosine decay", kind="traced",
                                   positive=">= 0")
  b1: float = field(0.9, "Adam beta1")
  b2: float = field(0.99, "Adam beta2")
  weight_decay: float = field(0.1, "decoupled, on matrices and embeddings only (nanoGPT)",
                              kind="traced", positive=">= 0")
  grad_clip: float = field(1.0, "global-norm clipping; 0 = off", kind="switch",
                           positive=">= 0")

  # Bookkeeping.
  log_every: int = field(50, "steps between progress lines / metric writes",
                         kind="bookkeeping", positive="> 0")
  eval_every: int = field(250, "steps between validation estimates", kind="bookkeeping",
                          positive="> 0")
  eval_batches: int = field(20, "random validation batches per estimate (nanoGPT "
                            "estimate_loss)", kind="bookkeeping", positive="> 0")
  checkpoint_every: int = field(500, "steps between checkpoints (plus one at the end)",
                                kind="bookkeeping", positive="> 0")
  keep_checkpoints: int = field(3, "how many recent checkpoints to keep", kind="bookkeeping",
                                positive="> 0")
  loggers: str = field(
      DEFAULT_LOGGERS, "where metrics go, comma-separated: tensorboard, jsonl (always: the "
      "run's record) and experiment trackers: wandb | trackio (optional extras; offline "
      "files); a tracker that cannot start costs one warning line, never the run",
      kind="bookkeeping", since=DEFAULT_LOGGERS)
  profile_steps: str = field(
      "", "\"START:STOP\": a jax.profiler trace of steps START+1..STOP into "
      "WORKDIR/tensorboard (TensorBoard's profile plugin, Perfetto); \"\" = off",
      kind="bookkeeping", since="")

  # Devices.
  mesh: MeshConfig = field(doc="the device mesh: data x fsdp", kind="layout",
                           default_factory=MeshConfig)
  remat: str = field(
      "none", "rematerialisation of each block, for models that do not fit: none | full "
      "(keep only each block's input) | dots (keep matmul outputs)", kind="layout",
      choices=REMATS)
  grad_accum_steps: int = field(
      1, "gradient accumulation: each step's batch_size rows in this many micro-batches "
      "run one after another (activation memory / this); the loss and gradient are the one "
      "batch's", kind="layout", positive="> 0", allowed="an integer >= 1", since=1)

  # Training health (docs/guides/training.md, "Attention health and QK-clip").
  attn_metrics: bool = field(
      True, "log each layer's largest attention logit and mean entropy (per head) every "
      "log_every steps, from the fused kernel; False = the step program without them",
      kind="bookkeeping", since=False)
  qk_clip: float = field(
      0.0, "QK-clip threshold tau (Kimi K2: 100; 0 = off): after each step, the q/k "
      "weights of a head whose largest logit S passed tau are scaled so that it is tau "
      "(GQA: q only)", kind="switch", positive=">= 0", since=0.0)
  sink_metrics_rows: int = field(
      8, "log each layer's attention sinks and massive activations every log_every steps, "
      "eval.py's measures on this many rows of the step's batch (one extra forward pass, "
      "training unchanged); 0 = off", kind="layout", positive=">= 0",
      allowed="an integer >= 0 (0 = off)", since=0)
  z_loss: float = field(
      0.0, "z-loss coefficient (PaLM: 1e-4; 0 = off): minimise the loss + z_loss * mean "
      "(log Z)^2 of the output softmax (train/loss stays the cross-entropy)",
      kind="switch", positive=">= 0", allowed="a finite number >= 0 (PaLM: 1e-4; 0 = off)",
      since=0.0)

  # Identity: what the sweep that made this run declared of it.
  label: str = field(
      "", "the run's label in its sweep (the study's name for its attention setup, e.g. "
      "sink_learned), declared by the sweep that made it; \"\" for a run started by hand "
      "(its studies then group it by `RunConfig.run_label`)", kind="bookkeeping", since="")

  # Not top-level fields of their own: the model's, the task's, the ConfigDict.
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  task_fields: Any = None  # an instance of the task's CONFIG_FIELDS dataclass, or None
  config: ml_collections.ConfigDict | None = dataclasses.field(
      default=None, compare=False, repr=False)  # as written: config.json, tasks' data

  def __getattr__(self, name):
    # The task's own fields read as top-level ones (config.mask_rate), as the user
    # writes them.
    task_fields = self.__dict__.get("task_fields")
    if task_fields is not None and name in {f.name for f in dataclasses.fields(task_fields)}:
      return getattr(task_fields, name)
    raise AttributeError(f"RunConfig has no field {name!r}")

  @functools.cached_property
  def logger_names(self) -> tuple[str, ...]:
    """`loggers` as names (`attnscale.config.loggers.parse`), parsed once."""
    from attnscale.config import loggers
    return loggers.parse(self.loggers)

  @functools.cached_property
  def profile_window(self) -> tuple[int, int] | None:
    """`profile_steps` as (start, stop), None when off; parsed once."""
    from attnscale.config import validation
    return validation.profile_window(self.profile_steps, self.num_train_steps)

  @property
  def hparams(self) -> Mapping[str, float | int]:
    """`TRACED_FIELDS` -> this run's number (what a packed step takes as arrays)."""
    return types.MappingProxyType({k: getattr(self, k) for k in fields.traced(type(self))})

  @property
  def run_label(self) -> str:
    """The name of the run's attention setup, derived from the config ("standard",
    "qk_rmsnorm+softpick", ...: `derived_label`): its log line's and eval.json's. A
    study groups runs by their declared `label` where the sweep gave one
    (`attnscale.config.labels.of`)."""
    return derived_label(self)


def derived_label(run) -> str:
  """The scaling's registered name; Graphcore's experiment (fully scaled attention in
  the unit-scaled, residual-weighted transformer) is "unit_scaled", the config
  argument that selects it; each model option or training rule that changes attention
  is appended ("+qk_rmsnorm", "+sink_learned", "+qk_clip50", ...), and "+post_ln"
  for a post-LN block (BERT's), so a sweep's post-LN and pre-LN runs of one scaling
  are two labels.

  `run`: a `RunConfig`.
  """
  m = run.model
  label = m.scaling
  params = dict(m.scaling_params or {})
  if params:  # fixed parameters: cosine(temperature=10), key_norm_power(p=2)
    label += "(" + ",".join(f"{k}={_number(v)}" for k, v in sorted(params.items())) + ")"
  if m.variant != "standard":
    label = scalings.preset_of(dataclasses.asdict(m)) or f"unit/{m.scaling}"  # "unit_scaled": a preset's name
  options = [
      (m.ln_position == "post", "+post_ln"),
      (m.qk_norm != "none", f"+qk_{m.qk_norm}"),
      (m.shared_kv, "+shared_kv"),
      (bool(m.num_kv_heads) and m.num_kv_heads != m.num_heads, f"+kv_heads{m.num_kv_heads}"),
      (m.normalizer != "softmax", f"+{m.normalizer}"),
      (bool(m.logit_softcap), f"+softcap{m.logit_softcap:g}"),
      (m.sink != "none", f"+sink_{m.sink}"),
      (m.attn_gate != "none", f"+gate_{m.attn_gate}"),
      (m.forget_gate, "+fox"),
      (m.differential, "+diff"),
      (m.xsa, "+xsa"),
      (m.head_norm != "none", f"+head_norm_{m.head_norm}"),
      (m.selective, "+selective"),
      (m.parameterization != "sp", f"+{m.parameterization}"),
      (m.mup_output_mult != 1, f"+output_mult{m.mup_output_mult:g}"),
      (m.mup_attn_mult != 1, f"+attn_mult{m.mup_attn_mult:g}"),
      (m.mup_vector_lr != "constant", f"+vector_lr_{m.mup_vector_lr}"),
      (bool(m.depth_alpha), f"+depth_alpha{m.depth_alpha:g}"),
      (bool(run.qk_clip), f"+qk_clip{run.qk_clip:g}"),
      (bool(run.z_loss), f"+z_loss{run.z_loss:g}"),
  ]
  label += "".join(text for on, text in options if on)
  if run.optimizer == "muon":  # the optimizer decides what transfers across width
    rule = run.muon_lr_rule
    label += "+muon" + ("" if rule == "moonlight" else f"_{rule}")
    if run.muon_adam_lr_mult != 1:
      label += f"+adam_lr{run.muon_adam_lr_mult:g}"
    if run.muon_adam_lr_base_width:
      label += f"+adam_per_width{run.muon_adam_lr_base_width}"
  return label


def _number(v) -> str:
  return f"{v:g}" if isinstance(v, (int, float)) else f"{v}"


def _task_schemas() -> list[type]:
  from attnscale import tasks
  return [cls.CONFIG_FIELDS for cls in tasks.TASKS.values() if cls.CONFIG_FIELDS is not None]


def _all(fn) -> tuple[str, ...]:
  names = list(fn(RunConfig))
  for schema in _task_schemas():
    names += [n for n in fn(schema) if n not in names]
  return tuple(names)


TRACED_FIELDS = fields.traced(RunConfig)
SWITCHES = fields.switches(RunConfig)


def resumable_fields() -> tuple[str, ...]:
  """The fields a resumed run may change (those of every registered task included);
  num_train_steps too under a constant schedule (`attnscale.runtime.rundir`)."""
  return _all(fields.resumable)


def pack_free_fields() -> tuple[str, ...]:
  """The fields in which the runs of one pack may differ."""
  return _all(fields.pack_free)


def added_fields() -> dict[str, Any]:
  """Field -> the value that reproduces a run saved before it existed."""
  out = fields.added(RunConfig)
  for schema in _task_schemas():
    out |= fields.added(schema)
  return out


def top_level_fields() -> tuple[str, ...]:
  """The names of `RunConfig`'s declared fields (the task's are its own)."""
  return tuple(f.name for f in fields.declared(RunConfig))


def _convert(schema: type, values: Mapping[str, Any], *, check: bool) -> dict[str, Any]:
  out = {}
  for f in fields.declared(schema):
    if f.name not in values:
      continue
    value = values[f.name]
    if f.name == "mesh":
      value = MeshConfig(**value) if isinstance(value, Mapping) else value
    elif check:
      value = fields.check(schema, f.name, value)
    elif isinstance(value, list):
      value = tuple(value)
    out[f.name] = value
  return out


def unknown_field_error(name: str, known) -> ValueError:
  close = difflib.get_close_matches(name, list(known), n=1)
  hint = f" (did you mean {close[0]!r}?)" if close else ""
  return ValueError(f"config.{name} is not a config field{hint}; a task's own fields are "
                    "declared by its CONFIG_FIELDS")


def convert(config: ml_collections.ConfigDict, *, check: bool = True) -> RunConfig:
  """`config` as a `RunConfig`: each declared field converted (and, with `check`,
  checked against its declaration), the task's fields in its `CONFIG_FIELDS`, the
  model's in `ModelConfig`. A field not declared anywhere fails in one line.

  The cross-field checks are `read`'s.
  """
  from attnscale import tasks
  from attnscale.config.schema import model_config  # and the renames of its fields
  values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  task_cls = tasks.task_class(config) if check or values.get("task") in tasks.TASKS else None
  schema = getattr(task_cls, "CONFIG_FIELDS", None)
  task_names = {f.name for f in dataclasses.fields(schema)} if schema else set()
  if check:
    renamed, top = fields.renames(RunConfig), top_level_fields()
    for name in values:
      if name in renamed:
        raise ValueError(f"config.{name} was renamed to config.{renamed[name]}")
      if name not in top and name not in task_names and name != "model":
        raise unknown_field_error(name, top + tuple(task_names))
  top = _convert(RunConfig, values, check=check)
  task_fields = None
  if schema is not None:
    given = {n: values[n] for n in task_names if n in values}
    task_fields = schema(**_convert(schema, given, check=check))
  model = model_config(config)
  return RunConfig(**top, model=model, task_fields=task_fields, config=config)


def read(config: ml_collections.ConfigDict, num_devices: int | None, *,
         recorded: Mapping[str, str] | None = None) -> RunConfig:
  """Validates `config` for `num_devices` devices and converts it: the one reading
  of a start (train.py, a pack, eval.py, compile.py). `num_devices` None: the checks
  that depend on the devices are left out (eval.py: a checkpoint trained on 8
  devices evaluates on 1).

  First imports `config.imports` (the user's scalings, variants, tasks: before they
  are checked). Then each field against its declaration, the model's fields
  (`ModelConfig`), the checks across fields here and the task's own
  (`Task.validate_config`), all before any data is loaded.

  `recorded`: the files a run's imports came from (eval.py: its provenance.json),
  for an entry that cannot be found from here.

  Raises:
    ValueError: a bad field (one line, naming it and what is allowed).
  """
  from attnscale.config import validation
  from attnscale.config.imports import import_modules
  import_modules(config, recorded=recorded)
  run = convert(config)
  validation.check_run(run, num_devices)
  return run


def of(config: ml_collections.ConfigDict | RunConfig) -> RunConfig:
  """`config` itself if it is a `RunConfig`, else converted without the checks
  (tests, benchmarks and tools that build a step or a model from a ConfigDict)."""
  if isinstance(config, RunConfig):
    return config
  return convert(config, check=False)
