"""Number formats and scale: what the models compute in.

    precision.py       formats (fp16, bf16, e4m3, e5m2), rounding, simulated fp8
    layers.py          linear layers as 2-D products (XLA:CPU's fast layout), fp8 inputs
    layer_norm.py      the model's LayerNorm on the kernel model.layernorm_impl names
    unit_scaling.py    unit-scaled ops and residual weighting (Graphcore, u-muP)
    scale_tracking.py  per-tensor std / absmax / underflow of one step, per format

May import attnscale.core.
"""
