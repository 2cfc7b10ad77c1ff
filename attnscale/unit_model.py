"""Moved to `attnscale.models.unit_transformer` (`model.variant = "unit"`).

Kept so that existing notebooks' imports keep working.
"""

from attnscale.models.unit_transformer import (UnitAttention, UnitBlock, UnitMLP,  # noqa: F401
                                               UnitScaledTransformer, branch_taus,
                                               qk_grad_std)
