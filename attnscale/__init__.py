"""attnscale: how should dot-product attention be scaled?

The library: `attention` (pure functional, with a `scale_fn`) and the registry of
scalings in `attnscale.scalings`.
"""

from attnscale import scalings
from attnscale import unit_scaling  # registers the "umup" scaling
from attnscale.attention import attention, attention_weights
from attnscale.scalings import Scaled
from attnscale.visibility import VisibleKeys

__all__ = ["attention", "attention_weights", "scalings", "unit_scaling", "Scaled", "VisibleKeys"]
__version__ = "0.1.0"
