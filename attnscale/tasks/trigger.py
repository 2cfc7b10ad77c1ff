"""The trigger-conditional task: a task on which softmax attention must form a sink.

Source: Ran-Milo 2026, "Attention Sinks Are Provably Necessary in Softmax
Transformers: Evidence from Trigger-Conditional Tasks" (arXiv 2603.11487). As its
abstract and introduction define it: when a designated trigger token appears, the
model must return the average of all preceding token representations, and
otherwise output zero. The paper proves that softmax self-attention solving it
must put its weight on a fixed position (a sink: the BOS token) on the rows
without a trigger, since its weights sum to one and "zero" is no average of the
values, while un-normalised ReLU attention solves it with no sink; its experiments
show strong sinks in softmax models and none with ReLU, single- and multi-head.
The paper's text we could read gives no sizes (vocabulary, length, trigger
rate), so those below are ours.

The token version. The paper's target is a vector (a regression on
representations); a token model predicts a class, so the representation of a
content token is its value v in {0, ..., m - 1} (`num_values`), and

    inputs  [BOS] x_1 x_2 ... x_{T-1},  x_t = TRIGGER with probability `trigger_rate`
                                       (never x_1), else a value token
    target  at a trigger t: the value round(mean of the values x_s, s < t, not
            triggers), half up, as a value token; at every other position
            (BOS included): NULL, the output "zero"
    scored  every position

Where it departs from the paper, and why:
  * The average is of scalar values, read out as the nearest value (exact match
    needs a class); the paper averages the representation vectors.
  * "Zero" is the NULL class, not the zero vector: with residual streams and MLPs
    a model can, in principle, map a non-zero attention output to NULL, which the
    paper's attention-only argument excludes. Whether a sink forms anyway is what
    the probes study measures (first-key weight on the no-trigger rows).
  * Each row's values come from its own distribution (Dirichlet(1/2) over the m
    values), so that the means spread over the values instead of concentrating
    at (m - 1)/2 as the length grows (a constant answer would score well).
  * Earlier triggers are not averaged ("preceding tokens" read as the values
    before t); BOS is not a value.

Token ids: 0 BOS, 1 TRIGGER, 2 NULL, 3 .. 3 + m - 1 the values 0 .. m - 1.

Dimension legend: B batch, T sequence, M values.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from attnscale import checks
from attnscale.models.config import field
from attnscale.tasks import synthetic

BOS, TRIGGER, NULL, FIRST_VALUE = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class TriggerArgs(synthetic.Args):
  """The trigger task's arguments (`config.probe`)."""

  num_values: int = field(8, "trigger: the values m a content token carries (the "
                          "vocabulary is m + 3: BOS, TRIGGER, NULL)")
  trigger_rate: float = field(0.1, "trigger: the probability that a position after the "
                              "first content token is the trigger")
  concentration: float = field(0.5, "trigger: each row's values ~ Dirichlet(this) over "
                               "the m values, so that row means spread")


class TriggerTask(synthetic.SyntheticTask):
  """Ran-Milo 2026's trigger-conditional task with token targets (module docstring)."""

  ARGS = TriggerArgs

  @classmethod
  def vocab_size(cls, args) -> int:
    return FIRST_VALUE + args.num_values

  @classmethod
  def check_args(cls, args, length):
    if isinstance(args.num_values, bool) or not isinstance(args.num_values, int) or (
        args.num_values < 2):
      raise ValueError(f"config.probe.num_values must be an integer >= 2, got "
                       f"{args.num_values!r}")
    if not 0 < args.trigger_rate < 1:
      raise ValueError(f"config.probe.trigger_rate must be in (0, 1), got "
                       f"{args.trigger_rate!r}")
    checks.check_positive("config.probe.concentration", args.concentration)
    if length < 3:
      raise ValueError(f"the trigger task needs rows of >= 3 tokens (BOS, a value, a "
                       f"trigger), got {length}")

  @classmethod
  def generate(cls, rng_, rows, length, args):
    m = args.num_values
    probs_BM = rng_.dirichlet(np.full(m, args.concentration), size=rows)
    # Inverse-CDF draws of each row's values from its own distribution.
    cdf_BM = np.cumsum(probs_BM, axis=1)
    u_BT = rng_.random((rows, length))
    value_BT = np.minimum((u_BT[:, :, None] > cdf_BM[:, None, :]).sum(-1), m - 1)
    trigger_BT = rng_.random((rows, length)) < args.trigger_rate
    trigger_BT[:, :2] = False  # BOS, then a value before any trigger
    inputs_BT = np.where(trigger_BT, TRIGGER, FIRST_VALUE + value_BT)
    inputs_BT[:, 0] = BOS
    return {"inputs": inputs_BT.astype(np.int32),
            "targets": cls.solve(inputs_BT, args).astype(np.int32),
            "weights": np.ones((rows, length), np.float32)}

  @classmethod
  def solve(cls, inputs_BT, args):
    """At each trigger, the rounded mean (half up) of the values before it, exactly
    in integers: floor((2 s + c) / (2 c)) for sum s over c values; NULL elsewhere."""
    del args
    is_value_BT = inputs_BT >= FIRST_VALUE
    value_BT = np.where(is_value_BT, inputs_BT - FIRST_VALUE, 0)
    s_BT = np.cumsum(value_BT, axis=1)  # through t: a trigger adds nothing at t itself
    c_BT = np.cumsum(is_value_BT, axis=1)
    mean_BT = (2 * s_BT + c_BT) // np.maximum(2 * c_BT, 1)
    return np.where(inputs_BT == TRIGGER, FIRST_VALUE + mean_BT, NULL)

  def query_groups(self, batch):
    """The trigger rows, and the no-trigger rows after BOS (where the paper's sink is
    forced: BOS's own row sees one key and says nothing)."""
    inputs_BT = jnp.asarray(batch["inputs"])
    return {"trigger": inputs_BT == TRIGGER,
            "no_trigger": (inputs_BT != TRIGGER) & (inputs_BT != BOS)}
