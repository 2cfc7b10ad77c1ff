"""Model variants behind one contract (`base.Model`), chosen by `model.variant`.

    standard  transformer.Transformer             GPT / BERT (nanoGPT's architecture)
    unit      unit_transformer.UnitScaledTransformer  unit-scaled, residual-weighted

    base.py         the contract and what every variant shares (attention layer, stats)
    config.py       `ModelConfig`: every variant's hyperparameters (`config.model`)
    mup.py          muP for Adam (`model.parameterization`) and the depth rule
    layer_stats.py  per-layer attention and residual-stream statistics in one forward pass

A new variant is one file with a `base.Model` subclass plus one line in
`VARIANTS`; its own config fields go in a sub-config of `ModelConfig`.

May import checks, fields, core and numerics.
"""

from __future__ import annotations

from flax import nnx

from attnscale.models.base import AttentionCall, Model, ScalingParams, gather_positions
from attnscale.models.config import VARIANTS, ModelConfig, UnitConfig
from attnscale.models.transformer import Transformer
from attnscale.models.unit_transformer import UnitScaledTransformer

# models.config.VARIANTS, which ModelConfig checks `variant` against.
VARIANTS.update({
    "standard": Transformer,
    "unit": UnitScaledTransformer,
})


def build(cfg: ModelConfig, *, rngs: nnx.Rngs) -> Model:
  """The model `cfg.variant` names, initialised from `rngs`."""
  return VARIANTS[cfg.variant](cfg, rngs=rngs)


__all__ = ["AttentionCall", "Model", "ModelConfig", "ScalingParams", "Transformer",
           "UnitConfig", "UnitScaledTransformer", "VARIANTS", "build", "gather_positions"]
