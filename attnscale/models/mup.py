"""muP for Adam (`model.parameterization = "mup"`) and the depth rule
(`model.depth_alpha`): the parameterisation's rules, in one place.

Yang et al. 2022, "Tensor Programs V: Tuning Large Neural Networks via Zero-Shot
Hyperparameter Transfer" (arXiv 2203.03466, Table 3 and appendix J), as the
microsoft/mup package (MuReadout, MuAdam, `attn_mult / d`) and EleutherAI's
nanoGPT-mup implement it. With m = width / base_width (the width multiplier):

    hidden matrices (q, k, v, out, gate, MLP up/down, MLM dense)
                         init std  init_std / sqrt(m)    (~ 1/sqrt(fan_in))
                         Adam LR   lr / m
    embeddings (token, position) and gains/biases/scaling params
                         init and LR unchanged
    readout (tied output logits)   x @ E^T a_out / m     (muP's output multiplier)
    attention logits     q.k a_attn sqrt(d_base) / d, d_base = base_width / num_heads
                         (1/d instead of 1/sqrt(d); equal to 1/sqrt(d) at m = 1)

a_out = `model.mup_output_mult` and a_attn = `model.mup_attn_mult` are muP's base
multipliers (microsoft/mup's `output_mult` and `attn_mult`), hyperparameters one
tunes at the base width and then keeps; both default to 1, sp's values.

At width == base_width (and the base multipliers 1) every factor is 1 (exactly: 1.0, sqrt(1.0), 4/4), so mup
and sp compute the same numbers; the programs differ only by the multiplications
by 1.0 (docs/experiments/width.md, "The parameterisation").

The residual outputs' 1/sqrt(2 L) stays (depth, not width). Weight decay is
AdamW's, decoupled and applied with the group's learning rate (mup's MuAdamW with
`decoupled_wd=True`: the decay step is lr / m * wd * W on hidden matrices).

Depth (`model.depth_alpha` = alpha > 0, with sp or mup). With
r = num_layers / base_depth, each pre-LN block computes

    x + r^-alpha Attn(LN(x)),  then  x + r^-alpha MLP(LN(x))

(alpha = 1: CompleteP, Dey et al. 2025, "Don't be lazy: CompleteP enables
compute-efficient deep transformers", arXiv 2505.01618, Table 1; alpha = 1/2:
depth-muP, Yang et al. 2023, "Tensor Programs VI", arXiv 2310.02244, and Bordelon
et al. 2023), as EleutherAI's nanoGPT-mup `completep` branch implements it:

    residual outputs (out, MLP down)  init std / sqrt(2 base_depth), not / sqrt(2 L):
                                      the branch multiplier carries the depth
    block parameters (matrices and    Adam LR x r^(alpha - 1)  (1 under CompleteP)
      LayerNorm gains)
    Adam's epsilon                    x r^-alpha  (x 1/m too under mup, as nanoGPT-mup)
    embeddings, final LN, readout     unchanged

At num_layers == base_depth every factor is exactly 1. With depth_alpha = 0
(the default) none of these multiplications exists in the program.
"""

from __future__ import annotations

import math

import jax

from attnscale.models.config import ModelConfig

# The leaves trained at lr / m: the Dense layers' weight matrices (attnscale.numerics.layers).
HIDDEN_LEAF = "kernel"
BLOCKS = "blocks"  # the transformer blocks' list (attnscale/models/transformer.py)


def width_mult(cfg: ModelConfig) -> float:
  """m = width / base_width under mup; 1 under sp."""
  return cfg.width / cfg.base_width if cfg.parameterization == "mup" else 1.0


def depth_mult(cfg: ModelConfig) -> float:
  """r = num_layers / base_depth under the depth rule; 1 without it."""
  return cfg.num_layers / cfg.base_depth if cfg.depth_alpha else 1.0


def residual_mult(cfg: ModelConfig) -> float | None:
  """Each residual branch's multiplier r^-alpha; None (no multiplication) when off."""
  return depth_mult(cfg) ** -cfg.depth_alpha if cfg.depth_alpha else None


def residual_init_std(cfg: ModelConfig) -> float:
  """The residual outputs' (attention out, MLP down) init std: the hidden std over
  sqrt(2 L), with L = base_depth under the depth rule (its multiplier does the rest)."""
  depth = cfg.base_depth if cfg.depth_alpha else cfg.num_layers
  return hidden_init_std(cfg) / math.sqrt(2 * depth)


def adam_eps_mult(cfg: ModelConfig) -> float:
  """Adam's epsilon multiplier: r^-alpha / m under the depth rule (nanoGPT-mup's
  CompleteP), 1 without it (mup alone keeps epsilon, as microsoft/mup's MuAdam)."""
  if not cfg.depth_alpha:
    return 1.0
  return depth_mult(cfg) ** -cfg.depth_alpha / width_mult(cfg)


def hidden_init_std(cfg: ModelConfig) -> float:
  """The hidden matrices' init std: init_std under sp, init_std sqrt(base_width / width)
  under mup (std ~ 1/sqrt(fan_in), equal to sp's at the base width)."""
  if cfg.parameterization != "mup":
    return cfg.init_std
  return cfg.init_std * math.sqrt(cfg.base_width / cfg.width)


def readout_mult(cfg: ModelConfig) -> float | None:
  """The output logits' multiplier a_out/m under mup; None (no multiplication) under sp."""
  if cfg.parameterization != "mup":
    return None
  return cfg.mup_output_mult * cfg.base_width / cfg.width


def attention_scaling(cfg: ModelConfig) -> tuple[str, dict]:
  """(registered name, params) of the attention's scaling: the configured one under sp;
  under mup `inverse_d` with mult a_attn sqrt(d_base), so s = a_attn sqrt(d_base)/d
  (1/sqrt(d) at the base width with a_attn = 1). ModelConfig refuses mup with any
  scaling but standard."""
  if cfg.parameterization != "mup":
    return cfg.scaling, dict(cfg.scaling_params or {})
  return "inverse_d", {"mult": cfg.mup_attn_mult * math.sqrt(cfg.base_width / cfg.num_heads)}


def _names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def is_hidden(path) -> bool:
  """Whether the parameter at pytree key `path` is a hidden matrix (trained at lr / m)."""
  return HIDDEN_LEAF in _names(path)


def in_block(path) -> bool:
  """Whether the parameter at pytree key `path` belongs to a transformer block."""
  return BLOCKS in _names(path)


def has_lr_multipliers(cfg: ModelConfig) -> bool:
  """Whether any parameter's learning rate is not the configured one."""
  return cfg.parameterization == "mup" or (cfg.depth_alpha not in (0, 1)
                                            and cfg.num_layers != cfg.base_depth)


def lr_multipliers(cfg: ModelConfig, params):
  """The pytree of `params`' learning-rate multipliers: 1/m on hidden matrices (mup),
  times r^(alpha - 1) on every block parameter (the depth rule), 1 elsewhere."""
  m = width_mult(cfg)
  depth = depth_mult(cfg) ** (cfg.depth_alpha - 1)  # r = 1 when the rule is off

  def mult(path, _):
    return (1.0 / m if is_hidden(path) else 1.0) * (depth if in_block(path) else 1.0)

  return jax.tree_util.tree_map_with_path(mult, params)
