"""Multi-query associative recall (MQAR): retrieval that must stay exact at length.

Source: Arora, Eyuboglu et al. 2023, "Zoology: Measuring and Improving Recall in
Efficient Language Models" (arXiv 2312.04927), whose generator
(HazyResearch/zoology, zoology/data/multiquery_ar.py, `multiquery_ar`) this
follows exactly, with one pass over the pairs (its `num_passes=1`) and
`random_non_queries=True`. A row of T tokens is

    k_1 v_1 k_2 v_2 ... k_N v_N  then T - 2N positions of random tokens, among them
    each key k_i once more, at position 2N + 2 g_i (g_i distinct, drawn with
    probability proportional to (g + 1)^(a - 1), a = `power_a`: near queries
    likelier, Zoology's power law of repeated bigrams)

keys distinct, from [1, V/2); values distinct, from [V/2, V); the fillers are any
token of [0, V) (Zoology's `random_non_queries`). The target at a repeated key is
its value; no other position is scored. The model reads the key and must recall
the value that followed it earlier: attention that stays sharp on one key among
the 2N + ... others.

Zoology's sizes: vocabulary 8192, lengths 64 ... 512, 4 ... 64 pairs (its Figure
2); its generator asserts V > T and 4 N <= T. The probes presets are smaller
(`configs/probes.py`). `eval.py --lengths` scores each length L twice: with the
pairs growing in proportion (N L / T_train, the main entry: the same density of
pairs), and with them fixed at N (`pairs_fixed`: more distractors, the same
number of things to recall).

Dimension legend: B batch, T sequence, N pairs.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from attnscale import checks
from attnscale.models.config import field
from attnscale.tasks import synthetic


@dataclasses.dataclass(frozen=True)
class MQARArgs(synthetic.Args):
  """MQAR's arguments (`config.probe`): Zoology's `multiquery_ar` parameters."""

  vocab_size: int = field(8192, "mqar: the vocabulary V (keys from [1, V/2), values from "
                          "[V/2, V); Zoology's 8192)")
  num_pairs: int = field(8, "mqar: key-value pairs N per row at the training length "
                         "(needs 4 N <= seq_len, as Zoology)")
  power_a: float = field(0.01, "mqar: the queries' gaps drawn with probability "
                         "~ (g + 1)^(a - 1) (Zoology's power_a; 1 = uniform)")


class MQARTask(synthetic.SyntheticTask):
  """Zoology's multi-query associative recall (module docstring)."""

  ARGS = MQARArgs

  @classmethod
  def vocab_size(cls, args) -> int:
    return args.vocab_size

  @classmethod
  def check_args(cls, args, length):
    checks.check_positive("config.probe.num_pairs", args.num_pairs)
    checks.check_positive("config.probe.power_a", args.power_a)
    if length % 2:
      raise ValueError(f"mqar rows must have an even length (Zoology's), got {length}")
    if 4 * args.num_pairs > length:
      raise ValueError(f"mqar: {args.num_pairs} pairs need 4 x {args.num_pairs} <= the "
                       f"length (pairs, then a query per key among as many fillers), got "
                       f"{length}")
    if args.num_pairs > args.vocab_size // 2 - 1:
      raise ValueError(f"mqar: {args.num_pairs} distinct keys need config.probe.vocab_size "
                       f">= {2 * args.num_pairs + 2}, got {args.vocab_size}")

  @classmethod
  def args_at_length(cls, args, length, train_length):
    grown = max(1, round(args.num_pairs * length / train_length))
    return {"": dataclasses.replace(args, num_pairs=grown), "pairs_fixed": args}

  @classmethod
  def generate(cls, rng_, rows, length, args):
    V, N = args.vocab_size, args.num_pairs
    context = 2 * N
    key_choices = V // 2 - 1  # keys 1 .. V/2 - 1
    keys_BN = 1 + np.argsort(rng_.random((rows, key_choices)), axis=1)[:, :N]
    values_BN = V // 2 + np.argsort(rng_.random((rows, V - V // 2)), axis=1)[:, :N]
    space = (length - context) // 2
    p_G = args.power_a * np.arange(1, space + 1) ** (args.power_a - 1)
    gaps_BN = synthetic.top_k_without_replacement(rng_, np.broadcast_to(p_G, (rows, space)), N)
    inputs_BT = np.zeros((rows, length), np.int64)
    inputs_BT[:, 0:context:2] = keys_BN
    inputs_BT[:, 1:context:2] = values_BN
    query_BN = context + 2 * gaps_BN
    np.put_along_axis(inputs_BT, query_BN, keys_BN, axis=1)
    targets_BT = np.zeros((rows, length), np.int64)
    np.put_along_axis(targets_BT, query_BN, values_BN, axis=1)
    weights_BT = np.zeros((rows, length), np.float32)
    np.put_along_axis(weights_BT, query_BN, 1.0, axis=1)
    filler_BT = inputs_BT == 0  # Zoology's random_non_queries: any token of [0, V)
    inputs_BT[filler_BT] = rng_.integers(0, V, size=int(filler_BT.sum()))
    return {"inputs": inputs_BT.astype(np.int32), "targets": targets_BT.astype(np.int32),
            "weights": weights_BT}

  @classmethod
  def solve(cls, inputs_BT, args):
    """At each position after the pairs whose token is one of the row's keys, the
    value that followed that key in the pairs; 0 elsewhere."""
    N = None
    out_BT = np.zeros_like(inputs_BT)
    for b, row in enumerate(inputs_BT):
      N = args.num_pairs
      table = {int(row[2 * i]): int(row[2 * i + 1]) for i in range(N)}
      for t in range(2 * N, len(row)):
        out_BT[b, t] = table.get(int(row[t]), 0)
    return out_BT

  def query_groups(self, batch):
    """The query rows (a repeated key), and the rest after the pairs."""
    w_BT = jnp.asarray(batch["weights"]) > 0
    return {"query": w_BT, "other": ~w_BT}
