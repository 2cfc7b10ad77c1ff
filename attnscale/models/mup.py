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

`model.mup_vector_lr = "per_width"` trains the embeddings, gains and biases at lr / m
too (muP keeps them at lr: "constant", the default). Not muP: an ablation. At the
width where sp's best rate is lr / m (sp's best falls about 1/width here), every
parameter then has sp's rate and only muP's forward pass (readout, attention, hidden
init) differs from sp, which separates what the rates cost from what the forward
pass costs (docs/experiments/transfer.md).

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

Attention under mup (`attention_scaling`): each scaling's registration declares its
rule (`attnscale.core.scalings.MupRule`, beside the scaling with the reason for it):
the keyword that multiplies its logits becomes mult x a_attn x width(d_base, d), so
that the logits are a_attn sqrt(d_base)/d times q.k; a scaling whose logits have no
width exponent (a learned temperature bounds them) is kept, with a_attn = 1; one
registered with the reason no rule is defined is refused by ModelConfig in one line,
and so is one that declares nothing.

u-muP (`model.parameterization = "umup"`, the unit variant): Blake et al. 2024,
"u-muP: The Unit-Scaled Maximal Update Parametrization" (arXiv 2407.17465, Table 2),
as graphcore-research/unit-scaling 0.3.5 implements it (`unit_scaling/optim.py`
`lr_scale_func_adam`, `_get_fan_in`, `lr_scale_for_depth`; `_modules.py` tags
Embedding weights "weight", LayerNorm/RMSNorm gains "norm", LinearReadout "output",
and `DepthSequential` sets mup_scaling_depth = L, the number of layers, on every
parameter of the transformer stack). Adam's learning rate per parameter:

    hidden matrices (in a block)   lr L^-1/2 fan_in^-1/2   (fan_in = the input axis)
    norm gains, vectors in a block lr L^-1/2
    embeddings (token, position)   lr D^-1/2  (the library's "fan_in" of an embedding
                                   is its output width D)
    readout (untied), final norm   lr
    attention                      u-muP's `umup` scaling (mult/d logits, unit output)
    readout op                     `linear_readout`: logits x / fan_in (not / sqrt(fan_in))
    residual                       u-muP's rule (`model.unit.residual_rule="umup"`, taus
                                   from `transformer_residual_scaling_rule`), as before

The multipliers are absolute (no base width): u-muP's learning rate is of order 1
(the paper's best is about 2^1.5), far above sp's.
"""

from __future__ import annotations

import math

import jax

from attnscale.core import scalings
from attnscale.models.config import ModelConfig

# The leaves trained at lr / m: the Dense layers' weight matrices (attnscale.numerics.layers).
HIDDEN_LEAF = "kernel"
BLOCKS = "blocks"  # the transformer blocks' list (attnscale/models/transformer.py)


# model.parameterization values that are muP (the rules above) and u-muP.
MUP, UMUP = "mup", "umup"


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
  """(registered name, params) of the attention's scaling: the configured one under sp
  (and umup); under mup, the one its `scalings.MupRule` gives (the module docstring):
  `use`'s scaling if it names one, its `mult` keyword times a_attn times
  width(d_base, d). Every factor is exactly 1 at the base width with a_attn = 1
  (sqrt(1.0) = 1.0), so mup equals sp there."""
  params = dict(cfg.scaling_params or {})
  if cfg.parameterization != MUP:
    return cfg.scaling, params
  rule = scalings.entry(cfg.scaling).mup  # a MupRule: ModelConfig refused the rest
  if rule.mult is None:
    return cfg.scaling, params
  name, params = (rule.use, {}) if rule.use else (cfg.scaling, params)
  mult = params.get(rule.mult, 1.0) * cfg.mup_attn_mult
  if rule.width is not None:
    mult *= rule.width(cfg.base_width / cfg.num_heads, cfg.head_dim)
  return name, params | {rule.mult: mult}


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
  return cfg.parameterization in (MUP, UMUP) or (cfg.depth_alpha not in (0, 1)
                                            and cfg.num_layers != cfg.base_depth)


def lr_multipliers(cfg: ModelConfig, params):
  """The pytree of `params`' learning-rate multipliers: 1/m on hidden matrices (mup;
  on every parameter with mup_vector_lr = "per_width"), times r^(alpha - 1) on every
  block parameter (the depth rule), 1 elsewhere."""
  if cfg.parameterization == UMUP:
    return jax.tree_util.tree_map_with_path(
        lambda path, p: umup_lr_multiplier(cfg, path, p.shape), params)
  m = width_mult(cfg)
  depth = depth_mult(cfg) ** (cfg.depth_alpha - 1)  # r = 1 when the rule is off

  vector = 1.0 / m if cfg.mup_vector_lr == "per_width" else 1.0

  def mult(path, _):
    return (1.0 / m if is_hidden(path) else vector) * (depth if in_block(path) else 1.0)

  return jax.tree_util.tree_map_with_path(mult, params)


# The unit model's embedding tables (attnscale/models/unit_transformer.py): u-muP's
# "weight" type with the library's embedding fan_in, the output width D.
UMUP_EMBEDDINGS = ("embed", "pos_embed")


def umup_lr_multiplier(cfg: ModelConfig, path, shape) -> float:
  """u-muP's Adam learning-rate multiplier of the unit model's parameter at `path`
  (the module docstring's table; unit_scaling 0.3.5's `lr_scale_func_adam`):
  L^-1/2 fan_in^-1/2 on block matrices (fan_in = shape[0], Flax's (in, out); the
  library's torch (out, in) reads shape[1]), L^-1/2 on block vectors, D^-1/2 on the
  embeddings, 1 on the readout and the final norm."""
  names = _names(path)
  depth = cfg.num_layers ** -0.5 if BLOCKS in names else 1.0
  if BLOCKS in names and len(shape) == 2:
    return depth * shape[0] ** -0.5
  if names and names[0] in UMUP_EMBEDDINGS:
    return shape[-1] ** -0.5
  return depth
