"""The task contract: everything that depends on what a config trains on.

The harness (training, evaluation, diagnostics, studies) calls only what `Task`
declares, so it never names a task: a task checks its config fields
(`validate_config`, before any data is loaded), chooses and loads its corpus
(`config.dataset`, one of `DATASETS`), makes batches, computes the loss and the
metrics of eval.json, prints its lines of eval.py's summary, says how its
attention is masked and which query rows the sink measures report apart
(`query_groups`), and may generate text (`sampler`).

Dimension legend: B batch, T sequence, V vocabulary.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attnscale import checks
from attnscale.tasks import losses

Batch = dict[str, np.ndarray]


class Sampler(Protocol):
  """Generates `length` tokens after `prompt` and returns their text (seeded)."""

  def __call__(self, model, *, prompt: str, length: int, temperature: float,
               top_k: int | None, seed: int) -> str:
    ...


def cross_entropy(logits_BTV, targets_BT, weights_BT=None):
  """(sum of weighted token losses, sum of weights), in float32.

  sum_t w_t * (logsumexp(logits_t) - logits_t[y_t]), and sum_t w_t: the mean
  over batches is the ratio of the summed sums, whatever the padding.
  """
  loss_BT = optax.softmax_cross_entropy_with_integer_labels(
      logits_BTV.astype(jnp.float32), targets_BT)
  if weights_BT is None:
    weights_BT = jnp.ones_like(loss_BT)
  return jnp.sum(loss_BT * weights_BT), jnp.sum(weights_BT)


def this_process_rows(batches: Iterator[Batch], batch_size: int) -> Iterator[Batch]:
  """This process's rows of each global batch: process p keeps rows
  [p * b, (p + 1) * b) with b = batch_size // process_count (as training does)."""
  rows = batch_size // jax.process_count()
  lo = jax.process_index() * rows
  for batch in batches:
    yield {k: v[lo:lo + rows] for k, v in batch.items()}


class Task(abc.ABC):
  """What a config trains on. Subclasses set `DATASETS` and implement the
  abstract methods; one registry line in `attnscale.tasks.TASKS` names them."""

  # The corpora this task can load: the allowed values of config.dataset.
  DATASETS: ClassVar[tuple[str, ...]] = ()
  # The top-level config fields only this task reads: a frozen dataclass declared with
  # `attnscale.fields.field` (default, doc, kind), or None. They are read as
  # top-level fields (config.mask_rate), checked, documented and classified for
  # packing and resume as the shared ones are (attnscale/config/run.py).
  CONFIG_FIELDS: ClassVar[type | None] = None
  # eval.py --lengths: False = windows of the validation token stream
  # (`attnscale.evaluation.length_eval`); True = the task's own `check_lengths` and
  # `length_examples` (the synthetic tasks generate examples at each length).
  OWN_LENGTH_EVAL: ClassVar[bool] = False

  def __init__(self, config):
    """Loads the data of `config.dataset`; expects a config that passed
    `validate_config` (`attnscale.tasks.get_task` runs it first)."""
    self.config = config

  @classmethod
  def validate_config(cls, config) -> None:
    """Checks the fields only this task reads; one-line ValueError.

    Runs before any data is loaded (from `configlib.validate` and `get_task`),
    so a bad value fails before a download or a workdir is touched. Subclasses
    extend it (call super() for the dataset check).
    """
    checks.check_choice("config.dataset", config.dataset, cls.DATASETS)

  def for_run(self, config) -> Task:
    """This task, its loaded data shared, for another run whose program is the same
    (a pack's runs: they differ only in traced and bookkeeping fields, which a task
    reads when it makes a batch, never when it loads). The caller checks that the
    two read the same data (`dataset`, `data_dir`)."""
    task = copy.copy(self)
    task.__dict__.pop("sampler", None)  # a cached sampler reads its run's config
    task.config = config
    return task

  @classmethod
  def without_data(cls, config) -> Task:
    """This task with no data loaded: it traces `loss` (all compile.py needs)
    but cannot make batches."""
    task = cls.__new__(cls)
    Task.__init__(task, config)
    return task

  @classmethod
  def batch_spec(cls, config, *, train: bool = True) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one global batch of `train_batch` (train=True) or of
    `eval_batches` (False): what compile.py compiles a step for, without data.
    A task that compile.py should take implements it."""
    raise NotImplementedError(f"task {cls.__name__} does not give its batch_spec, which "
                              "compile.py needs")

  @property
  def tokens_per_batch(self) -> int:
    """Tokens of one global training batch (padding included), for tokens/s."""
    return self.config.batch_size * self.config.seq_len

  @abc.abstractmethod
  def train_batch(self, step: int) -> Batch:
    """This process's rows of the training batch of `step`: a function of
    (config, step) only, so a resumed run sees the same batches."""

  @abc.abstractmethod
  def val_batch(self, index: int) -> Batch:
    """Validation batch `index` of the periodic estimate (the same at every estimate)."""

  @abc.abstractmethod
  def eval_batches(self, batch_size: int | None = None) -> Iterator[Batch]:
    """The whole validation split once, padding weighing 0 (this process's rows).

    The first one is the batch the attention diagnostics run on.
    """

  @abc.abstractmethod
  def loss(self, model, batch: Batch, dropout_key=None) -> tuple[jax.Array, dict[str, Any]]:
    """(mean loss to differentiate, {name: sum}) where the sums add over batches."""

  @abc.abstractmethod
  def eval_metrics(self, sums: dict[str, float]) -> dict[str, Any]:
    """eval.json's metrics from the loss sums added over `eval_batches()`."""

  @classmethod
  @abc.abstractmethod
  def format_summary(cls, result: dict) -> list[str]:
    """This task's lines of eval.py's printed summary of `result` (eval.json).

    A classmethod: printing a summary needs no data.
    """

  @property
  def sampler(self) -> Sampler | None:
    """How this task generates text from a model, or None (it does not)."""
    return None

  def attention_masks(self, batch: Batch) -> tuple[jax.Array | None, jax.Array | None]:
    """(mask, query_mask_BT) the attention diagnostics run `batch` with.

    mask: the attention mask the model runs with (broadcastable to [B, N, T, S]),
    or None; query_mask_BT: bool [B, T], the queries the statistics count (True =
    a real token), or None for all. The default: no padding, nothing masked.
    """
    del batch
    return None, None

  def query_groups(self, batch: Batch) -> dict[str, jax.Array]:
    """{name: bool [B, T]}: groups of query rows whose attention sink measures the
    diagnostics also report apart (eval.json's "rows", the training log's
    train/attn/<measure>_<name>), e.g. the trigger task's trigger and no-trigger
    rows. Traceable (jnp on the batch). The default: none."""
    del batch
    return {}


class NextTokenTask(Task):
  """A causal language model over one stream of token ids (characters, BPE tokens).

  What the char LM and the token LM share: a causal decoder, training batches that
  are random windows of the stream drawn from (seed, step), each process reading
  its own rows (`get_batch`, the data layer's), the periodic estimate's fixed
  validation windows, and the mean next-token cross-entropy. Subclasses load
  `self.data` (with `.train` and `.validation` streams) and set `get_batch` and
  `UNIT` ("character", "token").
  """

  UNIT: ClassVar[str] = "token"

  @staticmethod
  def get_batch(stream, *, batch_size, seq_len, seed, step, process_index, process_count):
    """(inputs, targets) [b, T] of this process's rows of a random batch."""
    raise NotImplementedError

  @classmethod
  def validate_config(cls, config) -> None:
    super().validate_config(config)
    if not config.model.causal:
      raise ValueError(f"model.causal must be True for task {config.task!r} (next-{cls.UNIT} "
                       "prediction needs a causal decoder)")

  @classmethod
  def batch_spec(cls, config, *, train=True):
    spec = {k: jax.ShapeDtypeStruct((config.batch_size, config.seq_len), jnp.int32)
            for k in ("inputs", "targets")}
    if not train:  # eval_batches weigh each target (0 for the last batch's filler)
      spec["weights"] = jax.ShapeDtypeStruct((config.batch_size, config.seq_len), jnp.float32)
    return spec

  def train_batch(self, step: int):
    return self._random_batch(self.data.train, self.config.seed, step)

  def val_batch(self, index: int):
    # A seed disjoint from training's, and the same windows at every estimate.
    return self._random_batch(self.data.validation, 2**31 - 1 - self.config.seed, index)

  def _random_batch(self, stream, seed, step):
    inputs, targets = self.get_batch(
        stream, batch_size=self.config.batch_size, seq_len=self.config.seq_len, seed=seed,
        step=step, process_index=jax.process_index(), process_count=jax.process_count())
    return {"inputs": inputs, "targets": targets}

  def loss(self, model, batch, dropout_key=None):
    """Mean cross-entropy per (weighted) target token, and metrics to sum (with the
    output logits' z-loss sum and health: `losses.output_sums`)."""
    logits_BTV = model(batch["inputs"], dropout_key=dropout_key)
    weights_BT = batch.get("weights")
    total, count = cross_entropy(logits_BTV, batch["targets"], weights_BT)
    return total / jnp.maximum(count, 1.0), {"loss_sum": total, "count": count,
                                             **losses.output_sums(logits_BTV, weights_BT)}

  # attention_masks: the base's (None, None): causal, no padding, so the model's
  # own causal mask is all there is.
