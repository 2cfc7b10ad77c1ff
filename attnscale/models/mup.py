"""muP for Adam (`model.parameterization = "mup"`): the rules, in one place.

Yang et al. 2022, "Tensor Programs V: Tuning Large Neural Networks via Zero-Shot
Hyperparameter Transfer" (arXiv 2203.03466, Table 3 and appendix J), as the
microsoft/mup package (MuReadout, MuAdam, `attn_mult / d`) and EleutherAI's
nanoGPT-mup implement it. With m = width / base_width (the width multiplier):

    hidden matrices (q, k, v, out, gate, MLP up/down, MLM dense)
                         init std  init_std / sqrt(m)    (~ 1/sqrt(fan_in))
                         Adam LR   lr / m
    embeddings (token, position) and gains/biases/scaling params
                         init and LR unchanged
    readout (tied output logits)   x @ E^T / m           (muP's output multiplier)
    attention logits     q.k sqrt(d_base) / d, d_base = base_width / num_heads
                         (1/d instead of 1/sqrt(d); equal to 1/sqrt(d) at m = 1)

At width == base_width every factor is 1 (exactly: 1.0, sqrt(1.0), 4/4), so mup
and sp compute the same numbers; the programs differ only by the multiplications
by 1.0 (docs/experiments/width.md, "The parameterisation").

The residual outputs' 1/sqrt(2 L) stays (depth, not width). Weight decay is
AdamW's, decoupled and applied with the group's learning rate (mup's MuAdamW with
`decoupled_wd=True`: the decay step is lr / m * wd * W on hidden matrices).
"""

from __future__ import annotations

import math

import jax

from attnscale.models.config import ModelConfig

# The leaves trained at lr / m: the Dense layers' weight matrices (attnscale.numerics.layers).
HIDDEN_LEAF = "kernel"


def width_mult(cfg: ModelConfig) -> float:
  """m = width / base_width under mup; 1 under sp."""
  return cfg.width / cfg.base_width if cfg.parameterization == "mup" else 1.0


def hidden_init_std(cfg: ModelConfig) -> float:
  """The hidden matrices' init std: init_std under sp, init_std sqrt(base_width / width)
  under mup (std ~ 1/sqrt(fan_in), equal to sp's at the base width)."""
  if cfg.parameterization != "mup":
    return cfg.init_std
  return cfg.init_std * math.sqrt(cfg.base_width / cfg.width)


def readout_mult(cfg: ModelConfig) -> float | None:
  """The output logits' multiplier 1/m under mup; None (no multiplication) under sp."""
  return cfg.base_width / cfg.width if cfg.parameterization == "mup" else None


def attention_scaling(cfg: ModelConfig) -> tuple[str, dict]:
  """(registered name, params) of the attention's scaling: the configured one under sp;
  under mup `inverse_d` with mult sqrt(d_base), so s = sqrt(d_base)/d (1/sqrt(d) at
  the base width). ModelConfig refuses mup with any scaling but standard."""
  if cfg.parameterization != "mup":
    return cfg.scaling, dict(cfg.scaling_params or {})
  return "inverse_d", {"mult": math.sqrt(cfg.base_width / cfg.num_heads)}


def is_hidden(path) -> bool:
  """Whether the parameter at pytree key `path` is a hidden matrix (trained at lr / m)."""
  names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
  return HIDDEN_LEAF in names


def lr_multipliers(cfg: ModelConfig, params):
  """The pytree of `params`' learning-rate multipliers: 1/m on hidden matrices, 1 elsewhere."""
  m = width_mult(cfg)
  return jax.tree_util.tree_map_with_path(lambda path, _: 1.0 / m if is_hidden(path) else 1.0,
                                          params)
