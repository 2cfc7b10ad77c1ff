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
    train/attn/...        attention health per layer i (`attention_key(name, i)`)
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


def train(name: str) -> str:
  """The key of the training summary's `name` ("loss" -> "train/loss")."""
  return TRAIN + name


def attention_key(prefix: str, layer: int) -> str:
  """`prefix` (MAX_LOGIT, ENTROPY, MAX_LOGIT_HEADS or ENTROPY_HEADS) of `layer`."""
  return f"{prefix}{layer}"
