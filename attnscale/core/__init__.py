"""The attention math: pure JAX, no Flax (a notebook can use it alone).

    attention.py         attention(), attention_weights(): the reference and fused paths
    fused.py             the fused path: the scaling folded into q, the kernel picked by target
    xla_attention.py     the fused path's XLA kernel (what the others refuse)
    cpu_kernel/          the fused path's CPU kernel: FlashAttention-2 in C++ via jax.ffi
    splash_attention.py  the fused path's TPU kernel (Pallas splash attention)
    scalings.py          the registry of scalings: formula, source, learned parameters
    length_scalings.py   the scalings whose temperature grows with the sequence (log-n, YaRN)
    visibility.py        which keys each query sees; sums over exactly those
    positions.py         rotary positions
    sharding.py          the mesh's axes and the activation layout every model keeps
    normalizers.py       the row normalisers beyond softmax (softpick, ReLU/L, stick-breaking)
    differential.py      differential attention: two maps on the one kernel
    selective.py         selective attention's logit bias
    head_outputs.py      what a layer does to each head's output before the projection (XSA,
                         head-wise RMSNorm)

May import checks alone (no other package of attnscale).
"""

# Every scaling registers on import: scalings.py's, then length_scalings.py's, so that
# any import of the package (`from attnscale.core import scalings`) has them all.
from attnscale.core import length_scalings, scalings  # noqa: F401
