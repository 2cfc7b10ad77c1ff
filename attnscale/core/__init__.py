"""The attention math: pure JAX, no Flax (a notebook can use it alone).

    attention.py         attention(), attention_weights(): the reference and fused paths
    xla_attention.py     the fused path's XLA kernel (CPU, and what the others refuse)
    splash_attention.py  the fused path's TPU kernel (Pallas splash attention)
    scalings.py          the registry of scalings: formula, source, learned parameters
    visibility.py        which keys each query sees; sums over exactly those
    positions.py         rotary positions
    sharding.py          the mesh's axes and the activation layout every model keeps

Imports nothing else of attnscale.
"""
