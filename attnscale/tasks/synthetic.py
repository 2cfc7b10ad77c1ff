"""What the synthetic probe tasks share: examples generated on the fly, scored exactly.

A synthetic task (`trigger`, `mqar`, `max_retrieval`) draws every batch from a
generator seeded by (config.seed, step): nothing is downloaded, and every label of
a sweep trains on the same examples at a seed. Evaluation examples come from a
seed of their own (`EVAL_SEED`), the same for every run. Each row is a causal
sequence of token ids with a target and a weight per position: the weighted
positions are the ones scored, and the target of position t is a function of the
inputs at 0 .. t only (the causal model reads no answer it could not compute).

Metrics, over the weighted positions: the mean cross-entropy, the exact-match
accuracy of the argmax (`accuracy`), the share of rows whose every target is right
(`sequence_accuracy`) and the accuracy at each row's last target
(`last_accuracy`: the most keys, items or tokens seen). `eval.py --lengths` scores
fresh examples at each length (`length_examples`); a task says how its sizes grow
with the length (`args_at_length`). `query_groups` names the rows the attention
diagnostics report separately (the trigger task's trigger and no-trigger rows).

A task's arguments are `config.probe`, declared once in the task's `Args`
dataclass (each field's default and doc, as `ModelConfig`'s).

Dimension legend: B batch, T sequence, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from attnscale import checks, fields
from attnscale.models.config import field
from attnscale.tasks import losses
from attnscale.tasks.base import Batch, Task, cross_entropy, this_process_rows

# The evaluation examples' seed, the same for every run (and apart from training's).
EVAL_SEED = 2**31 - 7
DATASET = "generated"  # config.dataset: the only value (the examples are generated)


@dataclasses.dataclass(frozen=True)
class Args:
  """The arguments every synthetic task takes (`config.probe`)."""

  eval_examples: int = field(1024, "evaluation rows, at the training length and at each "
                             "eval.py --lengths length")


def rng(seed: int, step: int, stream: int = 0) -> np.random.Generator:
  """The generator of batch `step` of `seed`: a function of the three numbers only."""
  return np.random.default_rng(np.random.SeedSequence([seed, step, stream]))


def top_k_without_replacement(rng_: np.random.Generator, weights_BN: np.ndarray,
                              k: int) -> np.ndarray:
  """k distinct indices per row, drawn without replacement with probability
  proportional to `weights_BN` (the Gumbel top-k trick: the k largest of
  log w + Gumbel noise are distributed as k sequential draws)."""
  gumbel_BN = -np.log(-np.log(rng_.random(weights_BN.shape)))
  return np.argsort(-(np.log(weights_BN) + gumbel_BN), axis=1)[:, :k]


@dataclasses.dataclass(frozen=True)
class SyntheticFields:
  """The config fields of every synthetic task."""

  probe: dict = fields.field(doc="the task's arguments: the fields of its `ARGS` dataclass "
                             "(\"Synthetic task arguments\" below), at their defaults "
                             "where unset", default_factory=dict)


class SyntheticTask(Task):
  """A task whose examples come from `generate` (a subclass's), seeded per batch.

  Subclasses set `ARGS` (their `Args` dataclass), `vocab_size(args)` and
  `generate(rng, rows, length, args)` -> {"inputs", "targets" int32 [B, T],
  "weights" float32 [B, T]}, and may override `args_at_length`, `query_groups`
  and `solve` (the hand-built solution the tests score).
  """

  DATASETS = (DATASET,)
  ARGS: ClassVar[type] = Args
  CONFIG_FIELDS = SyntheticFields
  # eval.py --lengths: this task scores its own examples (not a token stream).
  OWN_LENGTH_EVAL: ClassVar[bool] = True

  # ---- what a subclass defines ----

  @classmethod
  def vocab_size(cls, args) -> int:
    raise NotImplementedError

  @classmethod
  def generate(cls, rng_: np.random.Generator, rows: int, length: int, args) -> Batch:
    raise NotImplementedError

  @classmethod
  def check_args(cls, args, length: int) -> None:
    """One-line ValueError when `args` cannot make rows of `length` tokens."""

  @classmethod
  def args_at_length(cls, args, length: int, train_length: int) -> dict[str, Any]:
    """{variant name: the args of rows of `length` tokens}: what eval.py --lengths
    scores at each length ("" is the main variant). The default: the same args."""
    del length, train_length
    return {"": args}

  @classmethod
  def solve(cls, inputs_BT: np.ndarray, args) -> np.ndarray:
    """The hand-built solution: the target of every position, from the inputs."""
    raise NotImplementedError

  def query_groups(self, batch: Batch) -> dict[str, jax.Array]:
    """{name: bool [B, T]}: the rows the attention diagnostics report apart (their
    sink measures); the default: the scored positions and the rest."""
    w_BT = jnp.asarray(batch["weights"]) > 0
    return {"scored": w_BT, "unscored": ~w_BT}

  # ---- the Task contract ----

  @classmethod
  def args(cls, config):
    """`config.probe` as this task's `ARGS` (missing fields at their defaults); a
    field the task does not take fails in one line."""
    given = dict(getattr(config, "probe", None) or {})
    names = {f.name for f in dataclasses.fields(cls.ARGS)}
    for name in given:
      if name not in names:
        raise ValueError(f"config.probe.{name} is not an argument of task "
                         f"{config.task!r} (one of {sorted(names)})")
    return cls.ARGS(**given)

  @classmethod
  def validate_config(cls, config) -> None:
    super().validate_config(config)
    if not config.model.causal:
      raise ValueError(f"model.causal must be True for task {config.task!r} (a target "
                       "is a function of the tokens before it)")
    args = cls.args(config)
    checks.check_positive("config.probe.eval_examples", args.eval_examples)
    cls.check_args(args, config.seq_len)
    vocab = cls.vocab_size(args)
    if config.model.vocab_size != vocab:
      raise ValueError(f"model.vocab_size ({config.model.vocab_size}) must equal task "
                       f"{config.task!r}'s vocabulary ({vocab}): set "
                       f"--config.model.vocab_size={vocab}")

  def __init__(self, config):
    super().__init__(config)
    self.probe = self.args(config)

  @classmethod
  def without_data(cls, config):
    task = super().without_data(config)
    task.probe = cls.args(config)
    return task

  @classmethod
  def batch_spec(cls, config, *, train=True):
    del train  # one layout
    shape = (config.batch_size, config.seq_len)
    return {"inputs": jax.ShapeDtypeStruct(shape, jnp.int32),
            "targets": jax.ShapeDtypeStruct(shape, jnp.int32),
            "weights": jax.ShapeDtypeStruct(shape, jnp.float32)}

  def _rows(self, seed, step, length=None, args=None) -> Batch:
    """This process's rows of the global batch `step` of `seed`."""
    B = self.config.batch_size
    batch = self.generate(rng(seed, step), B, length or self.config.seq_len,
                          args or self.probe)
    return next(this_process_rows(iter([batch]), B))

  def train_batch(self, step: int):
    return self._rows(self.config.seed, step)

  def val_batch(self, index: int):
    return self._rows(EVAL_SEED, index)

  def examples(self, length: int, args, batch_size: int) -> Iterator[Batch]:
    """The evaluation rows at `length` (`args.eval_examples` of them, from
    `EVAL_SEED`), in global batches of `batch_size`, the last padded with weight 0."""
    n = self.probe.eval_examples
    for i, lo in enumerate(range(0, n, batch_size)):
      batch = self.generate(rng(EVAL_SEED, i, stream=length), batch_size, length, args)
      real_B = np.arange(batch_size) < n - lo
      batch["weights"] = batch["weights"] * real_B[:, None]
      yield batch

  def eval_batches(self, batch_size: int | None = None):
    B = batch_size or self.config.batch_size
    return this_process_rows(self.examples(self.config.seq_len, self.probe, B), B)

  def loss(self, model, batch, dropout_key=None):
    """Mean cross-entropy over the weighted positions, and sums: the loss, the
    count, the exact matches, the rows all right, the last targets right, and the
    output logits' health (`losses.output_sums`)."""
    logits_BTV = model(batch["inputs"], dropout_key=dropout_key)
    w_BT = batch["weights"]
    total, count = cross_entropy(logits_BTV, batch["targets"], w_BT)
    return total / jnp.maximum(count, 1.0), {
        "loss_sum": total, "count": count,
        **exact_match_sums(logits_BTV, batch, self.query_groups(batch)),
        **losses.output_sums(logits_BTV, w_BT)}

  def eval_metrics(self, sums):
    return metrics_from_sums(sums)

  @classmethod
  def format_summary(cls, result):
    return [f"  validation loss {result['val_loss']:.4f} | accuracy {result['accuracy']:.4f}"
            f" | rows all right {result['sequence_accuracy']:.4f} | last target "
            f"{result['last_accuracy']:.4f} over {result['val_targets']:,} targets"]

  # ---- eval.py --lengths ----

  def check_lengths(self, model_cfg, lengths) -> None:
    """One-line ValueError for a length this task or model cannot take."""
    from attnscale.models.base import check_length  # the model layer's rule
    for length in lengths:
      for args in self.args_at_length(self.probe, length, self.config.seq_len).values():
        try:
          self.check_args(args, length)
          check_length(model_cfg, length)
        except ValueError as e:
          raise ValueError(f"--lengths: {length}: {e}") from None

  def length_examples(self, length: int, batch_size: int) -> dict[str, tuple[Any, Iterator]]:
    """eval.py --lengths at `length`: {variant: (its args, this process's rows of
    its evaluation batches)}, one per `args_at_length` variant ("" the main one);
    `attnscale.evaluation.length_eval` scores them with `loss` and `eval_metrics`."""
    return {name: (args, this_process_rows(self.examples(length, args, batch_size),
                                           batch_size))
            for name, args in self.args_at_length(self.probe, length,
                                                  self.config.seq_len).items()}


def exact_match_sums(logits_BTV, batch, groups=None) -> dict[str, jax.Array]:
  """Sums of exact matches over the weighted positions: "correct" (targets),
  "rows_correct" and "rows" (rows with a target, all of whose targets are right),
  "last_correct" (each row's last target right), and per query group g
  (`query_groups`) "correct/g" and "count/g" (its weighted positions)."""
  w_BT = batch["weights"] > 0
  hit_BT = jnp.argmax(logits_BTV, axis=-1) == batch["targets"]
  has_B = jnp.any(w_BT, axis=1)
  T = w_BT.shape[1]
  last_B = T - 1 - jnp.argmax(w_BT[:, ::-1], axis=1)
  last_hit_B = jnp.take_along_axis(hit_BT, last_B[:, None], axis=1)[:, 0]
  f = lambda x: jnp.sum(x.astype(jnp.float32))
  sums = {"correct": f(hit_BT & w_BT), "rows_correct": f(has_B & jnp.all(hit_BT | ~w_BT, 1)),
          "rows": f(has_B), "last_correct": f(has_B & last_hit_B)}
  for name, in_BT in (groups or {}).items():
    sums[f"correct/{name}"] = f(hit_BT & w_BT & in_BT)
    sums[f"count/{name}"] = f(w_BT & in_BT)
  return sums


def metrics_from_sums(sums) -> dict[str, float]:
  """val_loss, accuracy, sequence_accuracy, last_accuracy, val_targets, val_rows, and
  accuracy_<g> for each query group g with scored positions."""
  count, rows = max(sums["count"], 1.0), max(sums["rows"], 1.0)
  loss = sums["loss_sum"] / count
  out = {"val_loss": loss, "perplexity": math.exp(min(loss, 700.0)),
         "accuracy": sums["correct"] / count, "sequence_accuracy": sums["rows_correct"] / rows,
         "last_accuracy": sums["last_correct"] / rows, "val_targets": int(sums["count"]),
         "val_rows": int(sums["rows"])}
  for key, n in sums.items():
    if key.startswith("count/") and n > 0:
      name = key.removeprefix("count/")
      out[f"accuracy_{name}"] = sums[f"correct/{name}"] / n
  return out
