"""Train state, optimizer, device mesh and orbax checkpoints.

The train state is a plain dict {"step", "params", "opt_state", "last_losses"}:
params is the model's `nnx.State`, the model's structure (graphdef) stays
outside, so the state is an ordinary pytree that jit can donate and orbax can
save. Randomness (dropout) and data order are functions of (config.seed, step),
so `step` is the whole data position and RNG state: restoring it resumes
bit-for-bit. `last_losses` is the window of the last `LAST_LOSSES` training
losses (the train step pushes each step's), so the final-loss metric
(`loss_last20`) is checkpointed with the step it belongs to and a resumed run
reports the uninterrupted run's value. A checkpoint written before the window
existed restores with an empty one (`Checkpoints.restore`).

Parallelism: one `jax.sharding.Mesh` over all devices (of all processes) with
axes `data` x `fsdp` (`config.mesh`; the default puts every device on `data`).
Batches are sharded on both axes, so every device gets its own rows. Params and
optimizer state are sharded on `fsdp` and replicated over `data` (fully sharded
data parallel, as nanodo, big_vision and MaxText do it with NamedSharding): each
weight matrix is split along its largest axis that `fsdp` divides; vectors and
scalars (gains, biases, the step) are replicated. XLA's partitioner inserts the
collectives (all-gathers of the weights, the gradients' reductions). A matrix
that no axis of splits evenly is a one-line error naming config.mesh.fsdp
(`state_shardings`): replicating it instead would quietly give back the memory
FSDP is for.

Dimension legend: W the window of recent losses (`LAST_LOSSES`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from attnscale import models
from attnscale.core import sharding
from attnscale.models import ModelConfig, mup
from attnscale.runtime import configlib, packing

State = dict[str, Any]

# Graphcore's final training loss is the mean of the last 20 steps' losses.
LAST_LOSSES = 20

# State entries a checkpoint may lack because it predates them: restoring one
# keeps their initial value (see `Checkpoints.restore`).
ADDED_STATE_ENTRIES = ("last_losses",)


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  """`config.model` as a `ModelConfig`, with the top-level `config.remat` (default none)."""
  return configlib.model_config(config)


MESH_AXES = sharding.MESH_AXES  # ("data", "fsdp")


def make_mesh(config: ml_collections.ConfigDict | None = None, devices=None
              ) -> jax.sharding.Mesh:
  """The `data` x `fsdp` mesh of `config.mesh` over every device of every process.

  None (or a config without `mesh`) puts every device on `data`. `devices`:
  others than `jax.devices()`, e.g. a TPU slice's that `compile.py` compiles for.

  Raises:
    ValueError: config.mesh does not fit the devices (one line, naming the field).
  """
  devices = jax.devices() if devices is None else list(devices)
  return _mesh(*configlib.mesh_shape(config, len(devices)), devices)


def evaluation_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """The mesh to evaluate a run's checkpoint on, with the devices here.

  The run's own mesh when it fits these devices; else the run's fsdp count if
  it divides the device count (the model was sharded because it needed to be),
  or 1, with every other device on `data`. The data count is a throughput
  choice, so a checkpoint trained on 8 devices evaluates on 1 (orbax restores
  across mesh shapes).
  """
  num_devices = jax.device_count()
  try:
    return _mesh(*configlib.mesh_shape(config, num_devices))
  except ValueError:  # trained on another device count
    mesh = config.get("mesh")
    fsdp = mesh.fsdp if mesh is not None and mesh.fsdp > 0 else 1
    fsdp = fsdp if num_devices % fsdp == 0 else 1
    return _mesh(num_devices // fsdp, fsdp)


def _mesh(data: int, fsdp: int, devices=None) -> jax.sharding.Mesh:
  # Devices ordered by process: flattening the mesh gives each process one
  # contiguous block of batch rows, so process p's devices hold rows
  # [p * b, (p + 1) * b) of the global batch, the rows `Task.train_batch` gives
  # process p (`jax.make_array_from_process_local_data` places them there).
  devices = sorted(jax.devices() if devices is None else devices,
                   key=lambda d: (d.process_index, d.id))
  return jax.sharding.Mesh(np.asarray(devices).reshape(data, fsdp), MESH_AXES)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Batches: rows sharded on every device (`data` and `fsdp` both split them)."""
  return NamedSharding(mesh, P(MESH_AXES))


# The fields a packed step takes as arrays (attnscale/runtime/packing.py says why).
TRACED_FIELDS = packing.TRACED_FIELDS


def hparams(config) -> dict[str, np.ndarray]:
  """`config`'s `TRACED_FIELDS` as numpy scalars (to stack into a pack): the seed as
  int32 (what `jax.random.key` makes of a Python int), the rest as float32 (what a
  Python float becomes where it meets a float32 array)."""
  return {k: np.float32(config.get(k, 0.0)) for k in TRACED_FIELDS if k != "seed"} | {
      "seed": np.int32(config.seed)}


def _value(config, hparams, name):
  """`hparams[name]` (a traced value of a packed step) if given, else the config's."""
  return config[name] if hparams is None else hparams[name]


def learning_rate_schedule(config, hparams=None) -> optax.Schedule:
  """Linear warm-up to config.learning_rate, then constant or cosine decay.

  `hparams`: the `TRACED_FIELDS` as arrays (a packed step's), replacing the
  config's values; the schedule's form (warm-up steps, decay length) is the config's.
  """
  lr = _value(config, hparams, "learning_rate")
  warmup = optax.linear_schedule(0.0, lr, max(config.warmup_steps, 1))
  if config.lr_schedule == "constant":
    after = optax.constant_schedule(lr)
  else:  # cosine down to min_learning_rate at num_train_steps (nanoGPT's lr_decay_iters)
    decay_steps = max(config.num_train_steps - config.warmup_steps, 1)
    after = optax.cosine_decay_schedule(
        lr, decay_steps, alpha=_value(config, hparams, "min_learning_rate") / lr)
  if config.warmup_steps == 0:
    return after
  return optax.join_schedules([warmup, after], [config.warmup_steps])


OPTIMIZERS, MUON_LR_RULES = configlib.OPTIMIZERS, configlib.MUON_LR_RULES
# Moonlight's update RMS: 0.2 matches AdamW's typical update RMS (Liu et al. 2025).
MOONLIGHT_RMS = 0.2


def make_optimizer(config, hparams=None) -> optax.GradientTransformation:
  """The run's optimizer: Adam, AdamW or Muon on the schedule, clipping, muP's multipliers.

  `hparams`: as in `learning_rate_schedule` (a packed step builds its optimizer
  inside the traced step from them; its state has the same layout).
  """
  schedule = learning_rate_schedule(config, hparams)
  cfg = model_config(config)
  # optax's default epsilon; the depth rule scales it (mup.adam_eps_mult, 1 otherwise).
  eps = {} if not cfg.depth_alpha else {"eps": 1e-8 * mup.adam_eps_mult(cfg)}
  if config.optimizer == "adam":
    opt = optax.adam(schedule, b1=config.b1, b2=config.b2, **eps)
  else:
    opt = optax.adamw(schedule, b1=config.b1, b2=config.b2, **eps,
                      weight_decay=_value(config, hparams, "weight_decay"), mask=_decay_mask)
  if config.optimizer == "muon":
    opt = muon(config, schedule, opt, _value(config, hparams, "weight_decay"))
  if mup.has_lr_multipliers(cfg):
    # After Adam(W): the whole step, decay included, at the group's lr (MuAdamW's).
    opt = optax.chain(opt, scale_by_lr_multipliers(cfg))
  if config.grad_clip > 0:
    opt = optax.chain(optax.clip_by_global_norm(_value(config, hparams, "grad_clip")), opt)
  return opt


def _decay_mask(params):
  # nanoGPT decays only the matrices and embeddings (ndim >= 2), never gains.
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def is_muon_matrix(path, p) -> bool:
  """Whether Muon trains the parameter at `path`: the hidden matrices (`mup.is_hidden`,
  the Dense layers' 2-D kernels); embeddings, the tied readout, gains and biases are
  AdamW's (modded-nanogpt's and Moonlight's split)."""
  return mup.is_hidden(path) and p.ndim == 2


def muon(config, schedule, adamw: optax.GradientTransformation, weight_decay
         ) -> optax.GradientTransformation:
  """Muon on the hidden matrices, `adamw` (the run's Adam(W)) on everything else.

  Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks"
  (kellerjordan.github.io/posts/muon; modded-nanogpt): the Nesterov momentum
  M <- beta M + G (beta = 0.95, optax's bias-corrected EMA form) is orthogonalised by
  5 quintic Newton-Schulz steps X <- a X + (b A + c A^2) X, A = X X^T, from
  X0 = M / ||M||_F, (a, b, c) = (3.4445, -4.7750, 2.0315) (`optax.contrib.scale_by_muon`,
  transposed so the iteration runs on the wide side). The update O (singular values
  about 1) is then scaled by `config.muon_lr_rule`, for W of shape (fan_in, fan_out):

      moonlight       O x 0.2 sqrt(max(fan_in, fan_out)): update RMS 0.2, AdamW's, so
                      one learning rate serves both (Liu et al. 2025, "Muon is
                      Scalable for LLM Training", arXiv 2502.16982, section 2.2; Kimi)
      modded_nanogpt  O x sqrt(max(1, fan_out / fan_in)) (modded-nanogpt; Bernstein's
                      spectral-norm width rule: the update's RMS->RMS norm is 1)

  then decayed (decoupled, W x weight_decay, as Moonlight) and multiplied by the
  schedule's learning rate. Both rules read the shape, so the learning rate transfers
  across width without a muP multiplier. Built from optax.contrib's pieces with
  `optax.partition` (not `optax.contrib.muon`, whose Adam branch is Nesterov and
  shares Muon's epsilon): the non-matrix branch is exactly the run's Adam(W). The
  opt_state layout depends on the parameters' shapes only, not on the traced
  learning rate or decay.
  """
  rule = config.get("muon_lr_rule", "moonlight")
  consistent_rms = MOONLIGHT_RMS if rule == "moonlight" else None
  matrices = optax.chain(
      # Every leaf it sees is a (fan_in, fan_out) matrix; the callable keeps the
      # partition's masked leaves (optax.contrib.muon does the same).
      optax.contrib.scale_by_muon(weight_dimension_numbers=lambda updates: jax.tree.map(
          lambda _: optax.contrib.MuonDimensionNumbers(), updates)),
      scale_by_muon_shape(consistent_rms),
      optax.add_decayed_weights(weight_decay),
      optax.scale_by_learning_rate(schedule))
  labels = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, p: "muon" if is_muon_matrix(path, p) else "adam", params)
  return optax.partition({"muon": matrices, "adam": adamw}, labels)


def muon_shape_factor(shape, consistent_rms: float | None) -> float:
  """Muon's per-matrix factor for W of `shape` (fan_in, fan_out): consistent_rms
  sqrt(max(fan_in, fan_out)) (Moonlight), or sqrt(max(1, fan_out / fan_in)) when None
  (modded-nanogpt); optax.contrib's `scale_by_shape` formulas."""
  fan_in, fan_out = shape
  if consistent_rms is not None:
    return consistent_rms * max(fan_in, fan_out) ** 0.5
  return max(1.0, fan_out / fan_in) ** 0.5


def scale_by_muon_shape(consistent_rms: float | None) -> optax.GradientTransformation:
  """Multiplies each orthogonalised update by `muon_shape_factor` (stateless)."""

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u: u * muon_shape_factor(u.shape, consistent_rms),
                        updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_lr_multipliers(cfg: ModelConfig) -> optax.GradientTransformation:
  """Multiplies each parameter's update by its learning-rate multiplier
  (`mup.lr_multipliers`: 1/m on hidden matrices under mup, r^(alpha - 1) on block
  parameters under the depth rule, 1 elsewhere). Stateless, so a
  checkpoint's opt_state holds nothing more than Adam's."""

  def update(updates, state, params=None):
    del params
    mults = mup.lr_multipliers(cfg, updates)
    return jax.tree.map(lambda u, m: u if m == 1.0 else u * jnp.asarray(m, u.dtype),
                        updates, mults), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def init_model(config, seed=None) -> models.Model:
  """The model `config.model.variant` names (`attnscale.models.VARIANTS`), initialised
  from `seed` (default config.seed; an array under a packed init's vmap)."""
  return models.build(model_config(config),
                      rngs=nnx.Rngs(params=config.seed if seed is None else jax.random.key(seed)))


def init_last_losses() -> dict[str, jax.Array]:
  """An empty loss window: {"loss_W": float32 [W], "count": int32 []}, W = LAST_LOSSES.

  The newest loss is loss_W[-1]; only the last `count` entries are losses.
  """
  return {"loss_W": jnp.zeros((LAST_LOSSES,), jnp.float32), "count": jnp.zeros((), jnp.int32)}


def push_loss(last_losses: dict[str, jax.Array], loss) -> dict[str, jax.Array]:
  """The window with `loss` appended (the oldest dropped once it holds W); jittable."""
  loss_W = jnp.roll(last_losses["loss_W"], -1).at[-1].set(jnp.asarray(loss, jnp.float32))
  return {"loss_W": loss_W, "count": jnp.minimum(last_losses["count"] + 1, LAST_LOSSES)}


def mean_last_losses(last_losses) -> float:
  """The mean of the window's losses, oldest to newest in float64 (NaN if empty)."""
  count = int(last_losses["count"])
  if count == 0:
    return float("nan")
  return float(np.mean([float(x) for x in np.asarray(last_losses["loss_W"])[-count:]]))


def fsdp_spec(shape: tuple[int, ...], fsdp: int) -> P | None:
  """The partition spec of an array of `shape` on an fsdp axis of `fsdp` devices.

  big_vision's `fsdp` rule (big_vision/sharding.py): a matrix (ndim >= 2) is
  split along its largest axis that `fsdp` divides (the first of equal ones);
  vectors and scalars are replicated (O(width) bytes, not worth a collective).
  nanodo (nanodo/fsdp.py) instead names each layer's model axis D in a table;
  a rule on shapes alone shards a new model variant without one. None: a matrix
  that no axis of splits evenly (JAX shards only evenly).
  """
  if fsdp == 1 or len(shape) < 2:
    return P()
  for axis in sorted(range(len(shape)), key=lambda i: -shape[i]):
    if shape[axis] % fsdp == 0:
      return P(*(None,) * axis, "fsdp")
  return None


def state_shardings(abstract: State, mesh: jax.sharding.Mesh):
  """The NamedSharding of every leaf of the (abstract) train state on `mesh`.

  Raises:
    ValueError: a parameter matrix that mesh.fsdp divides no axis of; one line
      naming config.mesh.fsdp, the parameter, and the counts that would work.
  """
  fsdp = mesh.shape["fsdp"]
  # Parameters first: the optimizer's moments mirror them, and the parameter's
  # name is the one a user recognises.
  bad = (_unsplittable({"params": abstract["params"]}, fsdp) if "params" in abstract else None
         ) or _unsplittable(abstract, fsdp)
  if bad is not None:
    path, x = bad
    shapes = [leaf.shape for leaf in jax.tree.leaves(abstract)]
    allowed = [f for f in range(1, mesh.size + 1)
               if mesh.size % f == 0 and all(fsdp_spec(s, f) is not None for s in shapes)]
    raise ValueError(f"config.mesh.fsdp={fsdp} divides no axis of {_dotted(path)} "
                     f"{tuple(x.shape)}: with {mesh.size} devices it must be one of {allowed}")
  return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(x.shape, fsdp)), abstract)


def _unsplittable(tree, fsdp: int):
  """(path, leaf) of the first leaf of `tree` that fsdp splits no axis of, or None."""
  return next(((path, x) for path, x in jax.tree_util.tree_leaves_with_path(tree)
               if fsdp_spec(x.shape, fsdp) is None), None)


def _dotted(path) -> str:
  """`blocks.0.attn.q_proj.kernel` for a pytree key path (nnx's `.value` dropped)."""
  names = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
  return ".".join(n for n in names if n != "value")


def create_state(config, mesh, tx: optax.GradientTransformation | None = None,
                 ) -> tuple[nnx.GraphDef, State, Any]:
  """Initialises the train state directly into its shardings (`state_shardings`).

  Shapes first (jax.eval_shape), then shardings, then a jitted init: no
  device ever holds an unsharded copy (big_vision/nanodo style).

  Args:
    config: the run's config.
    mesh: the device mesh (`make_mesh`).
    tx: the optimizer whose state to initialise; the training loop builds it
      once and hands the same one to `steps.make_train_step`. None builds
      `make_optimizer(config)` (enough for restoring a checkpoint's layout).

  Returns:
    (graphdef, state, state_shardings).

  Raises:
    ValueError: mesh.fsdp splits no axis of a parameter matrix (before any
      device work).
  """
  init = init_fn(config, make_optimizer(config) if tx is None else tx)
  shardings = state_shardings(jax.eval_shape(init), mesh)
  state = jax.jit(init, out_shardings=shardings)()
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: init_model(config)), nnx.Param)
  return graphdef, state, shardings


def state_shapes(config, tx: optax.GradientTransformation | None = None) -> State:
  """The train state as jax.ShapeDtypeStructs (`jax.eval_shape`): nothing allocated."""
  return jax.eval_shape(init_fn(config, make_optimizer(config) if tx is None else tx))


def init_fn(config, tx: optax.GradientTransformation):
  """The function that returns the initial train state (to jit): `init()` from
  config.seed, `init(seed)` from another (a packed sweep vmaps it over its seeds)."""

  def init(seed=None):
    graphdef, params = nnx.split(init_model(config, seed), nnx.Param)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": tx.init(params), "last_losses": init_last_losses()}
  return init


def abstract_state(state, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)


# Where `Checkpoints.set_aside` keeps the checkpoints that cannot be read.
DAMAGED_DIR = "damaged_checkpoints"


class DamagedCheckpointError(ValueError):
  """A checkpoint on disk that cannot be read: a file of it truncated, missing or
  garbled (a full disk, a failing volume, a copy cut short). `directory` (the
  run's checkpoints/), `step`, `why` (the first line of the reader's error)."""

  def __init__(self, directory: str, step: int, why: str):
    super().__init__(f"checkpoint {step} in {directory} cannot be read ({why})")
    self.directory, self.step, self.why = directory, step, why


def describe_damaged(damaged: list[DamagedCheckpointError]) -> str:
  """One clause for a run's unreadable steps (newest first): the newest one's error."""
  if len(damaged) == 1:
    return str(damaged[0])
  newest = damaged[0]
  return (f"checkpoints {', '.join(str(e.step) for e in damaged)} in {newest.directory} "
          f"cannot be read (step {newest.step}: {newest.why})")


class Checkpoints:
  """Orbax checkpoints of the train state in WORKDIR/checkpoints.

  Saves are asynchronous; `close` waits for the last one. A step that is already
  on disk is never overwritten.

  Damage: a checkpoint "cannot be read" when orbax fails to read its metadata or
  arrays (any error: tensorstore reports a truncated file as ValueError, a lost
  chunk as a bare Exception, a torn _METADATA as a JSON error). Every damage we
  tried (truncating or deleting each file of a step in turn) either fails so or
  restores the same arrays (files orbax no longer reads). A layout this code
  does not know is its own ValueError, never "damaged"; and since every
  checkpoint of a run has one layout, an error that is not damage fails every
  step alike, which `restore_newest_intact` reports without touching anything.
  """

  def __init__(self, workdir: str, keep: int):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        # Named, so that `item_metadata` can read a checkpoint this manager did not write.
        item_handlers=ocp.StandardCheckpointHandler())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: State) -> None:
    if step in self.manager.all_steps():
      return
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, state: State, shardings, step: int | None = None, *,
              alone: bool = False) -> State:
    """Restores `step` (default: latest) into the layout of `state`.

    `alone`: read without orbax's barrier of every process after the read, for a
    caller that agrees with the others itself (`restore_newest_intact`).

    An entry of `ADDED_STATE_ENTRIES` that the checkpoint lacks (it was written
    before the entry existed) keeps its value in `state`, the initial one.

    Raises:
      DamagedCheckpointError: the checkpoint cannot be read (one line, naming
        the step and the first line of orbax's error).
      ValueError: there is no checkpoint `step`, or it holds entries this code
        does not know, or lacks one it cannot do without (one line, naming them).
    """
    step = self.latest_step() if step is None else step
    if step not in self.manager.all_steps():
      raise ValueError(f"no checkpoint of step {step} in {self.manager.directory} "
                       f"(it has steps {sorted(self.manager.all_steps())})")
    with self._reading(step):
      saved = set(self.manager.item_metadata(step).keys())  # None.keys(): no _METADATA
    lacking = [k for k in state if k not in saved]
    unknown = sorted(saved - set(state))
    if unknown or set(lacking) - set(ADDED_STATE_ENTRIES):
      raise ValueError(
          f"checkpoint {step} in {self.manager.directory} has the state entries "
          f"{sorted(saved)}, this code expects {sorted(state)}: was it written by "
          "another version of attnscale?")
    kept = [k for k in state if k in saved]
    args = ocp.args.StandardRestore(
        abstract_state({k: state[k] for k in kept}, {k: shardings[k] for k in kept}))
    with self._reading(step):
      if alone:  # the manager's own item handler and folder, without its barrier
        handler = ocp.StandardCheckpointHandler()
        try:
          restored = handler.restore(
              epath.Path(self.directory) / str(step) / "default", args=args)
        finally:
          handler.close()
      else:
        restored = self.manager.restore(step, args=args)
    return {k: restored[k] if k in saved else state[k] for k in state}

  @contextlib.contextmanager
  def _reading(self, step: int):
    """Turns any error of orbax reading checkpoint `step` into DamagedCheckpointError."""
    try:
      yield
    except Exception as e:  # noqa: BLE001 (see the class docstring)
      lines = str(e).strip().splitlines() or [type(e).__name__]
      # tensorstore appends its whole spec to a chunk's error; the first clause says it.
      why = lines[0].split(" See full TensorStore details")[0]
      raise DamagedCheckpointError(self.directory, step,
                                   why if len(why) <= 300 else why[:297] + "...") from e

  def restore_newest_intact(self, state: State, shardings) -> tuple[State, int, list]:
    """The newest checkpoint that can be read, restored; steps newest first.

    Returns:
      (state, its step, the DamagedCheckpointErrors of the newer steps).

    Several processes read each step without orbax's barrier after the read
    (which a process whose read failed would never reach: the others would wait
    there for orbax's 300 s) and then agree (an all-gather): a step that none
    can read is damaged and all go on to the previous one; one that only some
    can read stops every process, since the files differ between the processes
    (a --workdir that is not shared, a copy in progress) and setting the step
    aside would be wrong for those that read it.

    Raises:
      ValueError: there is no checkpoint, or none can be read (one line, naming
        the steps and the newest one's error), or some processes can read a step
        and others cannot (one line, in every process). Nothing on disk is changed.
    """
    damaged = []
    several = jax.process_count() > 1
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored, error = self.restore(state, shardings, step, alone=several), None
      except DamagedCheckpointError as e:
        restored, error = None, e
      read = _each_process(error is None)
      if all(read):
        return restored, step, damaged
      if any(read):
        cannot = [i for i, ok in enumerate(read) if not ok]
        why = f" ({error.why})" if error else ""
        raise ValueError(
            f"checkpoint {step} in {self.directory} cannot be read by process"
            f"{'es' if len(cannot) > 1 else ''} {', '.join(map(str, cannot))} of "
            f"{len(read)}{why} but can by the others: do all processes see the same "
            "--workdir? Nothing was changed")
      damaged.append(error)
    if not damaged:
      raise ValueError(f"no checkpoint in {self.directory}")
    raise ValueError(f"no checkpoint can be read: {describe_damaged(damaged)}; the run "
                     "directory is left as it is (to start afresh, move checkpoints/ away)")

  def intact_steps(self, state: State, shardings) -> list[int]:
    """The steps that restore (each read in full, into the layout of `state`)."""
    intact = []
    for step in sorted(self.manager.all_steps()):
      with contextlib.suppress(DamagedCheckpointError):
        self.restore(state, shardings, step)
        intact.append(step)
    return intact

  def set_aside(self, step: int) -> str:
    """Moves checkpoint `step` to WORKDIR/damaged_checkpoints/STEP (STEP.1, ... if
    that is taken) and forgets it; returns where it went.

    Nothing is deleted: the damaged files stay for inspection, out of orbax's
    sight. Left where it was, it would count as the latest step, a rerun's save of
    the same step would be refused as existing, and `keep` would collect an
    intact older step in its place. Process 0 moves it; every process calls this.
    """
    target = os.path.join(os.path.dirname(self.directory), DAMAGED_DIR, str(step))
    path, n = target, 0
    while os.path.exists(path):
      n += 1
      path = f"{target}.{n}"
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.rename(os.path.join(self.directory, str(step)), path)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"attnscale set_aside {step}")
    self.manager.reload()
    return path

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _each_process(ok: bool) -> list[bool]:
  """`ok` of every process, by process index (an all-gather; [ok] in one)."""
  if jax.process_count() == 1:
    return [ok]
  from jax.experimental import multihost_utils
  return [bool(x) for x in np.asarray(multihost_utils.process_allgather(np.int32(ok)))]
