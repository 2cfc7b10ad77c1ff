"""Max retrieval: attention that must stay sharp on one item as the items grow.

Source: Veličković, Perivolaropoulos, Barbero and Pascanu 2024, "softmax is not
enough (for sharp out-of-distribution)" (arXiv 2410.01104): a model trained to
retrieve the item of maximal priority from sets of up to 16 items loses the
retrieval on larger sets, because softmax with a fixed temperature cannot keep
its weight on one of n keys as n grows (its coefficients disperse: Theorem 2);
an adaptive temperature (lower where the weights' entropy is high) helps. Here it
separates the scalings at length: a log n factor on the logits is one answer to
the same dispersion.

The token version, a causal running maximum (the paper's is a set and a single
query): a row of T = 2 n tokens is n items, each a priority token then a label
token,

    p_1 c_1 p_2 c_2 ... p_n c_n,   priorities distinct, from P values
                                   (`num_priorities`), labels from C (`num_labels`)
    target  at each label position i: the label of the highest-priority item among
            items 1 .. i (the item of max priority so far)
    scored  the label positions

so one row scores the retrieval among 1 .. n items, and its last target
(`last_accuracy`) among all n. Priorities are distinct within a row, so the
answer is unique; a row of n items needs n <= P, which bounds the lengths
(2 P at most). What the paper's sets do not have: the causal order (a query sees
the items before it only), and the priorities are token ids whose order the
model learns from the data.

Token ids: 0 .. P - 1 the priorities (their order is the priority), P .. P + C - 1
the labels.

Dimension legend: B batch, T sequence, N items.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from attnscale import checks
from attnscale.models.config import field
from attnscale.tasks import synthetic


@dataclasses.dataclass(frozen=True)
class MaxRetrievalArgs(synthetic.Args):
  """Max retrieval's arguments (`config.probe`)."""

  num_priorities: int = field(256, "max_retrieval: the priority values P (distinct in a "
                              "row, so rows hold <= P items: lengths <= 2 P)")
  num_labels: int = field(8, "max_retrieval: the labels C an item carries (chance 1/C)")


class MaxRetrievalTask(synthetic.SyntheticTask):
  """Veličković et al. 2024's max retrieval as a causal running maximum (module docstring)."""

  ARGS = MaxRetrievalArgs

  @classmethod
  def vocab_size(cls, args) -> int:
    return args.num_priorities + args.num_labels

  @classmethod
  def check_args(cls, args, length):
    checks.check_positive("config.probe.num_priorities", args.num_priorities)
    checks.check_positive("config.probe.num_labels", args.num_labels)
    if length % 2:
      raise ValueError(f"max_retrieval rows are (priority, label) items: an even length, "
                       f"got {length}")
    if length // 2 > args.num_priorities:
      raise ValueError(f"max_retrieval: {length // 2} items with distinct priorities need "
                       f"config.probe.num_priorities >= {length // 2}, got "
                       f"{args.num_priorities}")

  @classmethod
  def generate(cls, rng_, rows, length, args):
    P, C, N = args.num_priorities, args.num_labels, length // 2
    prio_BN = np.argsort(rng_.random((rows, P)), axis=1)[:, :N]
    label_BN = rng_.integers(0, C, size=(rows, N))
    inputs_BT = np.empty((rows, length), np.int64)
    inputs_BT[:, 0::2] = prio_BN
    inputs_BT[:, 1::2] = P + label_BN
    weights_BT = np.zeros((rows, length), np.float32)
    weights_BT[:, 1::2] = 1.0
    return {"inputs": inputs_BT.astype(np.int32),
            "targets": cls.solve(inputs_BT, args).astype(np.int32), "weights": weights_BT}

  @classmethod
  def solve(cls, inputs_BT, args):
    """At each label position, the label of the item of highest priority so far; 0
    at the priority positions."""
    del args
    prio_BN, label_BN = inputs_BT[:, 0::2], inputs_BT[:, 1::2]
    best_BN = np.maximum.accumulate(prio_BN, axis=1)
    # The item holding the running max: the last position where the max was set.
    N = prio_BN.shape[1]
    is_best_BN = prio_BN == best_BN
    where_BN = np.maximum.accumulate(np.where(is_best_BN, np.arange(N), 0), axis=1)
    out_BT = np.zeros_like(inputs_BT)
    out_BT[:, 1::2] = np.take_along_axis(label_BN, where_BN, axis=1)
    return out_BT

  def query_groups(self, batch):
    """The label rows (each a retrieval), and the priority rows."""
    w_BT = jnp.asarray(batch["weights"]) > 0
    return {"query": w_BT, "other": ~w_BT}
