"""attnscale: how should dot-product attention be scaled?

The library in a line: `attnscale.attention(q, k, v, scale_fn=attnscale.scalings.get(name))`,
pure functional attention with a pluggable scaling, and the registry of scalings.

Packages, by layer, lowest first (each may import only those before it):

    core/         the attention math: attention, kernels (XLA, splash), scalings,
                  visibility, positions, sharding. Pure JAX, no Flax.
    numerics/     number formats and scale: precision, unit scaling, scale tracking, layers
    models/       the model variants (Flax NNX) behind one contract
    data/, tasks/ datasets (TFDS, no TensorFlow) and what a config trains on
    config/       a run's config: every top-level field declared once (`RunConfig`),
                  read and checked once at start (fields.py beside checks.py: how a
                  field is declared, which tasks use too)
    runtime/      the entry points' flags, the one start-up, state, steps, the training
                  loop, checkpoints, metrics, compiling for accelerators
    evaluation/   whole-split evaluation, length evaluation, attention diagnostics
    experiments/  sweeps, their results, tables and figures
    studies/      the scale studies (`python -m attnscale.studies`)
    commands/     the command lines: attnscale-train, -eval, -sweep, -compile (the
                  repository's train.py, eval.py, sweep.py, compile.py call them)

`import attnscale` is light: the public names below load on first use, so an entry
point's flag parsing (`attnscale.runtime.cli`) imports no JAX.
"""

import importlib

# Public name -> (module, attribute or None for the module itself).
_PUBLIC = {
    "attention": ("attnscale.core.attention", "attention"),
    "attention_weights": ("attnscale.core.attention", "attention_weights"),
    "scalings": ("attnscale.core.scalings", None),
    "Scaled": ("attnscale.core.scalings", "Scaled"),
    "VisibleKeys": ("attnscale.core.visibility", "VisibleKeys"),
    "unit_scaling": ("attnscale.numerics.unit_scaling", None),
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name):
  if name not in _PUBLIC:
    raise AttributeError(f"module 'attnscale' has no attribute {name!r}")
  module, attribute = _PUBLIC[name]
  value = importlib.import_module(module)
  return value if attribute is None else getattr(value, attribute)
