"""Moved to `attnscale.models` (the standard variant: `attnscale.models.transformer`).

Kept so that existing notebooks' imports keep working.
"""

from attnscale.models.base import AttentionCall, gather_positions  # noqa: F401
from attnscale.models.config import DTYPES, HEADS, LN_POSITIONS, ModelConfig  # noqa: F401
from attnscale.models.transformer import (MLP, MLMHead, Attention, Block,  # noqa: F401
                                          Transformer, readout)
