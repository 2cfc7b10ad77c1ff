"""Every key a run writes to metrics.jsonl and TensorBoard, named once.

The training loop (`attnscale.runtime.loop`) writes them; the sweep tables
(`attnscale.experiments.run_records`), the studies and the tests read them. The
strings are part of every committed run record and table: never change one.

    train/loss            mean training loss over the log interval
    train/grad_norm       mean global gradient norm over the interval
    train/lr              the learning rate of the interval's last step
    train/loss_last20     mean loss of the run's last 20 steps (Graphcore's final loss)
    train/elapsed_s       training seconds since the run started (across resumes)
    train/steps_per_s, train/tokens_per_s   the interval's speed
    val/loss              mean validation loss per target token
    train/attn/...        attention health per layer i (`attention_key(name, i)`), and
                          its sinks and massive activations (config.sink_metrics_rows)
    train/out/max_logit   the largest output logit over the interval (every run)
    train/out/log_z       mean log Z of the output softmax over the interval (every run)
    train/z_loss          mean z-loss term over the interval (config.z_loss > 0)
"""

from __future__ import annotations

TRAIN, VAL = "train/", "val/"

LOSS = "train/loss"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
LOSS_LAST20 = "train/loss_last20"
ELAPSED_S = "train/elapsed_s"
STEPS_PER_S = "train/steps_per_s"
TOKENS_PER_S = "train/tokens_per_s"
VAL_LOSS = "val/loss"

# Attention health, per layer: + the layer's index (`attention_key`).
MAX_LOGIT = "train/attn/max_logit/layer_"  # max over heads (TensorBoard and metrics.jsonl)
ENTROPY = "train/attn/entropy/layer_"  # mean over heads
MAX_LOGIT_HEADS = "train/attn/max_logit_heads/layer_"  # one per query head (metrics.jsonl)
ENTROPY_HEADS = "train/attn/entropy_heads/layer_"
CLIPPED_HEADS = "train/attn/clipped_heads"  # QK-clip's head rescalings over the interval
# Sinks and massive activations, per layer, from the log step's extra forward pass
# (`layer_stats.layer_stats`, eval.py's definitions; config.sink_metrics_rows > 0).
SINK_RATE = "train/attn/sink_rate/layer_"  # mean weight on the first key, mean over heads
SINK_HEADS = "train/attn/sink_heads/layer_"  # share of heads with sink rate > 0.3 (Gu et al.)
TOP_KEY = "train/attn/top_key_weight/layer_"  # the heaviest key's mean weight, wherever it sits
MAX_ACT = "train/attn/max_act/layer_"  # max |x| of the residual stream the block writes
ACT_RATIO = "train/attn/act_ratio/layer_"  # max |x| / median |x| (Sun et al.)
KURTOSIS = "train/attn/kurtosis/layer_"  # mean over tokens of the kurtosis over dimensions
SINK_RATE_HEADS = "train/attn/sink_rate_heads/layer_"  # one per query head (metrics.jsonl)
# |v_0| / mean |v_j|: the value at the sink position against the real keys'
FIRST_VALUE_RATIO = "train/attn/first_value_ratio/layer_"
# The extra pass's scalars: prefix -> the name of `layer_stats.layer_stats`' value.
LAYER_STATS = {SINK_RATE: "sink_rate", SINK_HEADS: "sink_heads", TOP_KEY: "top_key_weight",
               MAX_ACT: "max_act", ACT_RATIO: "act_ratio", KURTOSIS: "kurtosis",
               FIRST_VALUE_RATIO: "first_value_ratio"}
# The same pass's sink measures on each of the task's query groups g
# (`Task.query_groups`: the trigger task's trigger and no-trigger rows):
# train/attn/{sink_rate, top_key_weight, uniform_sink_rate, row_mass}_<g>/layer_<i>.
GROUP_MEASURES = ("sink_rate_", "top_key_weight_", "uniform_sink_rate_", "row_mass_")
# Every per-layer prefix (`attention_key`).
PER_LAYER = (MAX_LOGIT, ENTROPY, MAX_LOGIT_HEADS, ENTROPY_HEADS, *LAYER_STATS, SINK_RATE_HEADS)

# The output logits (`attnscale.tasks.losses`), over the interval.
OUT_MAX_LOGIT = "train/out/max_logit"  # the largest output logit of its steps
OUT_LOG_Z = "train/out/log_z"  # mean log Z_t (log of the output softmax's normaliser)
Z_LOSS = "train/z_loss"  # mean config.z_loss * mean_t (log Z_t)^2 (when on)


def train(name: str) -> str:
  """The key of the training summary's `name` ("loss" -> "train/loss")."""
  return TRAIN + name


def group_stats(layer: dict) -> list[str]:
  """The names of a layer's per-group sink measures (`GROUP_MEASURES`), in order."""
  return [k for k in layer if k != "heads" and k.startswith(GROUP_MEASURES)]


def group_prefix(name: str) -> str:
  """The per-layer key prefix of a group measure ("sink_rate_trigger" ->
  "train/attn/sink_rate_trigger/layer_")."""
  return f"train/attn/{name}/layer_"


def attention_key(prefix: str, layer: int) -> str:
  """`prefix` (a per-layer key above: MAX_LOGIT, ENTROPY, SINK_RATE, ...) of `layer`."""
  return f"{prefix}{layer}"
