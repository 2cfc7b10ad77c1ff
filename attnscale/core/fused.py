"""The fused path of `attnscale.core.attention.attention`: the scaling folded into
q, one scale-1 kernel, the output factor after it.

    q''_i = s_i q'_i,   z_i = c_i * kernel(q'', k', v)_i

`fold` applies the scaling (under `jax.checkpoint`); `fused` picks the kernel
(`kernel_for`) by the platform the program is compiled for (`target_platform`:
the mesh's device kind, so a TPU program compiled on a CPU host gets splash) and
calls it: splash attention on a TPU (`attnscale.core.splash_attention`), cuDNN
flash attention on a GPU (bf16/fp16 softmax without soft-cap or sink), the native
CPU flash-attention kernel on a CPU (`attnscale.core.cpu_kernel`, C++ through
jax.ffi, built at first use; softmax with or without a sink, any mask, float32 or
bfloat16), the XLA kernel (`attnscale.core.xla_attention`) elsewhere and for
what those refuse (`kernel_for` is the one rule).
Every kernel returns the same z, tested against the reference
(tests/test_attention.py, tests/test_splash_scalings.py).

Dimension legend: B batch, T query length, S key/value length, N query heads,
K key/value heads, H head dim.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from attnscale.core import cpu_kernel, xla_attention
from attnscale.core.visibility import upcast

Array = jax.Array


class AttentionStats(NamedTuple):
  """Per-query health of one attention call (`attention(..., return_stats=True)`).

  Float32, [B, T, N], no gradient; the definitions of eval.py's diagnostics
  (`attnscale.evaluation.diagnostics`, from `attention_weights`), per query:

  * max_logit: max_j l_ij over the visible keys, l the scaled and soft-capped
    logit (without sigmoid's -log n_i); -inf for a query that sees no key.
  * entropy: -sum_j p_ij log p_ij over the visible keys, nats. Softmax: of the
    weights, lse_i - sum_j p_ij l_ij. With a sink, of the keys' weights p_ij =
    w_i s_ij (w_i = sigmoid(lse_i - b) < 1, s_i the softmax over the keys):
    w_i H(s_i) - w_i log w_i, the sink's own weight left out. Sigmoid: of the
    unnormalised weights sigmoid(l_ij - log n_i) (no distribution, so only
    comparable between sigmoid runs); softpick, ReLU/L and stick-breaking
    (`attnscale.core.normalizers`) likewise, of their weights, which sum to at
    most 1 (ReLU/L: to anything). With FoX's gate, l_ij includes its bias D_ij;
    with selective attention, its -F_ij.
    0 for a query that sees no key.
  """

  max_logit_BTN: Array
  entropy_BTN: Array


def broadcast(x, shape) -> Array:
  """x broadcast to `shape` explicitly (a scalar, [N], [B, T, N], ... per query)."""
  x = upcast(x)
  return jnp.broadcast_to(x.reshape((1,) * (len(shape) - x.ndim) + x.shape), shape)


def per_query(x_BTN, shape_BTNH) -> Array:
  """A factor broadcastable to [B, T, N] -> [B, T, N, 1], to multiply [B, T, N, H]."""
  return broadcast(x_BTN, shape_BTNH[:3])[..., None]


def fold(scale_fn, q_BTNH, k_BSKH, keys, dtype):
  """(s_i q'_i, k', c_i): the scaling folded into q, in the kernel's dtype.

  Under `jax.checkpoint`: the backward pass recomputes the scaling's per-vector
  math (norms, cosines, sums over keys: O(B T N H)) from q and k instead of
  keeping its float32 intermediates, so a scaling costs about what standard
  costs in activation memory (cosine at the nanogpt preset in bf16 on TPU v5e-8:
  1.17x standard's per-device memory stored, 1.05x recomputed; `compile.py`).
  """
  def fold(q_BTNH, k_BSKH):
    scaled = scale_fn(q_BTNH, k_BSKH, keys)
    q_BTNH = upcast(scaled.q) * per_query(scaled.logit_scale, scaled.q.shape)
    c = scaled.output_scale
    return q_BTNH.astype(dtype), scaled.k.astype(dtype), None if c is None else upcast(c)
  return jax.checkpoint(fold)(q_BTNH, k_BSKH)


def fused(q_BTNH, k_BSKH, v_BSKH, keys, implementation, normalizer, logit_softcap, sink,
          return_stats=False, log_forget_BTN=None, logit_mod=None, *, logit_bias_BTS=None):
  """Calls a fused kernel with scale 1 on the folded q (`fold`); returns (z, sink factor,
  `AttentionStats` or None).

  The kernel (`kernel_for`): "splash" (`attnscale.core.splash_attention`, TPU;
  soft-cap and sink inside the kernel, padding as segment ids), "cudnn"
  (`jax.nn.dot_product_attention`'s cuDNN flash attention, GPU; right padding
  as sequence lengths), or "xla" (`attnscale.core.xla_attention`: causal blocks,
  matmul layouts; jax.nn's own XLA path is 3x slower on CPU). The sink factor
  sigmoid(lse_i - b), [B, T, N], multiplies the output (None without a sink,
  or where the kernel applied the sink itself). Stats (`return_stats`): from
  the XLA kernel itself, or for splash and cuDNN (which return no row max or
  weighted logit sum) from the XLA kernel run with an empty value head dim: its
  logits and softmax again, no p @ v product, no gradient. FoX's log forget
  gate (`log_forget_BTN`, [B, T, N]) runs the XLA kernel, which builds its bias;
  so does `logit_mod`, the scaling's per-pair logit transform
  (`ScaleInvariant.logit_mod`), and a [B, T, S] logit bias (`logit_bias_BTS`,
  selective attention's -F, `attnscale.core.selective`).
  """
  dtype = v_BSKH.dtype
  kernel = kernel_for(implementation, q_BTNH.shape, k_BSKH.shape, dtype, keys.mask_BNTS,
                      normalizer, logit_softcap, sink, log_forget=log_forget_BTN is not None,
                      logit_mod=logit_mod, pair_bias=logit_bias_BTS is not None,
                      return_stats=return_stats)
  z_BTNH = None
  if kernel == "native":
    z_BTNH, lse_BTN = cpu_kernel.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, keys.mask_BNTS,
                                                       keys.is_causal)
    # sum_j p_ij = sigmoid(lse_i - b), as the XLA kernel's (`_xla`); lse = -inf (no key): 0.
    sink_BTN = None if sink is None else jax.nn.sigmoid(lse_BTN - broadcast(sink, lse_BTN.shape))
    return z_BTNH, sink_BTN, None
  if kernel == "splash":
    z_BTNH = by_value_slices(lambda v: _splash(q_BTNH, k_BSKH, v, keys, logit_softcap, sink),
                             v_BSKH, q_BTNH.shape[-1])
  elif kernel == "cudnn":
    try:
      z_BTNH = by_value_slices(lambda v: _cudnn(q_BTNH, k_BSKH, v, keys), v_BSKH,
                               q_BTNH.shape[-1])
    except Exception:  # noqa: BLE001 - cuDNN refuses some shapes/dtypes/versions at trace time
      if implementation == "cudnn":
        raise
  if z_BTNH is None:
    return _xla(q_BTNH, k_BSKH, v_BSKH, keys, normalizer, logit_softcap, sink, return_stats,
                log_forget_BTN, logit_mod, logit_bias_BTS)
  if not return_stats:
    return z_BTNH, None, None
  # The stats-only pass: v with head dim 0 makes the kernel's p @ v empty.
  B, S, K, _ = v_BSKH.shape
  _, _, stats = _xla(*jax.lax.stop_gradient((q_BTNH, k_BSKH, jnp.zeros((B, S, K, 0), dtype))),
                     keys, normalizer, logit_softcap, sink, True)
  return z_BTNH, None, stats


def by_value_slices(kernel, v_BSKV: Array, width: int) -> Array:
  """kernel(v) for a kernel whose values must be `width` (q's head dim) wide:
  v's head dim V cut into slices of `width` (the last one zero-padded), one call
  each, outputs concatenated; one plain call when V = width.

  Exact, the output being linear in v (and a sink's factor per query, not per
  value dim); each slice recomputes the logits, so V = 2 width (differential
  attention's values) costs splash or cuDNN two calls, as Ye et al.'s
  multihead_flashdiff_1 runs FlashAttention twice. The XLA kernel and the
  reference take any V in one call.
  """
  V = v_BSKV.shape[-1]
  if V == width:
    return kernel(v_BSKV)
  num = -(-V // width)
  v_BSKV = jnp.pad(v_BSKV, ((0, 0),) * 3 + ((0, num * width - V),))
  z_BTNV = jnp.concatenate([kernel(v_BSKV[..., i * width:(i + 1) * width])
                            for i in range(num)], axis=-1)
  return z_BTNV[..., :V]


def target_platform() -> str:
  """"tpu", "gpu" or "cpu": the platform the program being traced is compiled for.

  The device kind of the mesh it is traced under (`jax.sharding.use_abstract_mesh`;
  `attnscale.runtime.steps` traces every step under its mesh), so that a program compiled
  on a CPU host for a TPU slice or for GPUs (`compile.py`) gets that platform's
  kernel; outside a mesh, `jax.default_backend()`.
  """
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  platform = getattr(device, "platform", None) or jax.default_backend()
  return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


def kernel_for(implementation, q_shape, k_shape, dtype, mask_BNTS, normalizer,
               logit_softcap, sink, log_forget: bool = False, *, logit_mod=None,
               pair_bias: bool = False, return_stats: bool = False) -> str:
  """The fused kernel a call runs: "splash", "cudnn", "native" or "xla" (see `fused`).

  None picks by `target_platform()`: splash on a TPU unless
  `splash_attention.unsupported_reason` names a reason; cuDNN on a GPU for
  bf16/fp16 softmax with no soft-cap and no sink (jax.nn neither takes a tanh
  nor returns lse); on a CPU the native kernel wherever `native_refusal` names
  no reason (softmax, with or without a sink; no soft-cap; float32 or bfloat16;
  no stats; one device; the library built); the XLA kernel otherwise, for FoX's
  forget gate (`log_forget`: neither splash nor jax.nn takes a T x S bias built
  in the kernel), for a [B, T, S] logit bias (`pair_bias`, selective
  attention's: `attention` refuses it on splash and cuDNN), and always for a
  scaling with a per-pair logit transform (`logit_mod`: none of the others
  takes one). "native" asks for the native kernel and gets the XLA kernel
  where `native_refusal` names a reason (a build that failed has warned once).
  """
  if logit_mod is not None:
    if implementation in ("splash", "cudnn"):
      raise ValueError(f"implementation={implementation!r} cannot take this scaling's per-pair "
                       "logit transform (scale_invariant): use None, 'xla' or 'reference'")
    return "xla"
  if implementation in ("xla", "splash", "cudnn"):
    return implementation
  if log_forget or pair_bias:
    return "xla"
  platform = target_platform()
  if implementation == "native" or platform == "cpu":
    refusal = native_refusal(dtype, normalizer, logit_softcap, return_stats)
    return "native" if refusal is None else "xla"
  # Splash takes a key (padding) mask [B|1, 1, 1, S] as segment ids; not a per-head
  # or per-query one.
  custom_mask = mask_BNTS is not None and (mask_BNTS.shape[2] != 1 or mask_BNTS.shape[1] != 1)
  if platform == "tpu" and _splash_lib().unsupported_reason(
      q_shape, k_shape, normalizer=normalizer, has_custom_mask=custom_mask) is None:
    return "splash"
  plain = normalizer == "softmax" and logit_softcap is None and sink is None
  if platform == "gpu" and plain and dtype in (jnp.bfloat16, jnp.float16):
    return "cudnn"  # cuDNN's fused attention takes half precision only
  return "xla"


def native_program_refusal() -> str | None:
  """Why no native CPU kernel (attention's, LayerNorm's) can run in the program being
  traced, or None: it must be compiled for the CPU, for one device (XLA cannot
  partition a custom call over a mesh's axes)."""
  mesh = jax.sharding.get_abstract_mesh()
  if target_platform() != "cpu":
    return f"the program is compiled for {target_platform()}, not the CPU"
  if not mesh.empty and mesh.size != 1:
    return f"a mesh of {mesh.size} devices"
  return None


def native_refusal(dtype, normalizer, logit_softcap, return_stats=False) -> str | None:
  """Why the native CPU kernel cannot run a call, or None where it can (the rest of
  the rule, a per-pair transform, FoX's gate, a [T, S] bias, is `kernel_for`'s).

  It is FlashAttention-2's softmax with the row log-sum-exp (a sink works from
  that), float32 or bfloat16 inputs, on the CPU, for a program of one device
  (XLA cannot partition a custom call over a mesh's axes); no soft-cap (its tanh
  and derivative would sit in every tile), no other normaliser, no stats (the
  diagnostics' row max and entropy come from the XLA kernel).
  """
  program = native_program_refusal()
  if program is not None:
    return program
  if normalizer != "softmax":
    return f"normalizer={normalizer!r} (softmax only)"
  if logit_softcap is not None:
    return "a logit soft-cap"
  if return_stats:
    return "return_stats (the XLA kernel computes the stats)"
  if jnp.dtype(dtype) not in cpu_kernel.DTYPES:
    return f"dtype {jnp.dtype(dtype).name} (float32 or bfloat16 only)"
  if not cpu_kernel.available():
    return "the native library did not build"
  return None


def _key_mask_BS(keys, batch: int) -> Array | None:
  """The key (padding) mask as [B, S] (None: no mask); only for a [B|1, 1, 1, S] mask."""
  if keys.mask_BNTS is None:
    return None
  mask = keys.mask_BNTS
  return jnp.broadcast_to(mask[:, 0, 0, :], (batch, keys.kv_len))


def _splash(q_BTNH, k_BSKH, v_BSKH, keys, logit_softcap, sink):
  """Splash attention inside shard_map over the mesh's batch axes (`attnscale.core.splash_attention`)."""
  mask = keys.mask_BNTS
  if mask is not None and (mask.shape[2] != 1 or mask.shape[1] != 1):
    raise ValueError("implementation='splash' takes a key (padding) mask [B, 1, 1, S] only "
                     f"(it becomes segment ids), got mask shape {tuple(mask.shape)}")
  mesh = jax.sharding.get_abstract_mesh()
  sink_N = None if sink is None else broadcast(sink, (q_BTNH.shape[2],))
  return _splash_lib().dot_product_attention(
      q_BTNH, k_BSKH, v_BSKH, is_causal=keys.is_causal,
      kv_mask_BS=_key_mask_BS(keys, q_BTNH.shape[0]), logit_softcap=logit_softcap,
      sink_N=sink_N, mesh=None if mesh.empty else mesh,
      interpret=target_platform() != "tpu")


def _splash_lib():
  # Imported on first use: it loads Pallas's TPU kernels, which a CPU or GPU run never needs.
  from attnscale.core import splash_attention
  return splash_attention


def _cudnn(q_BTNH, k_BSKH, v_BSKH, keys):
  """cuDNN flash attention; right padding goes in as sequence lengths, not a mask.

  A key mask [B, 1, 1, S] that is right padding (keys [0, n_b) visible in row b,
  BERT's [CLS] ... [SEP] [PAD]...) becomes `key_value_seq_lengths` n_b, so no
  [B, N, T, S] bias is built; whether it is right padding is checked on the
  device (O(B S)), and any other key mask runs the XLA kernel instead (a
  `lax.cond`, so the answer is exact either way). A custom T x S mask goes to
  cuDNN as a mask.
  """
  cudnn = lambda mask=None, lengths=None: jax.nn.dot_product_attention(
      q_BTNH, k_BSKH, v_BSKH, mask=mask, scale=1.0, is_causal=keys.is_causal,
      key_value_seq_lengths=lengths, implementation="cudnn")
  mask = keys.mask_BNTS
  if mask is None:
    return cudnn()
  if mask.shape[1:3] != (1, 1):
    return cudnn(mask=mask)
  B, S = q_BTNH.shape[0], keys.kv_len
  visible_BS = _key_mask_BS(keys, B)
  n_B = visible_BS.sum(axis=-1, dtype=jnp.int32)
  right_padding = jnp.all(visible_BS == (jnp.arange(S)[None, :] < n_B[:, None]))
  # A row with no visible key: length 1 keeps cuDNN finite; `attention` zeroes the row.
  return jax.lax.cond(right_padding,
                      lambda: cudnn(lengths=jnp.maximum(n_B, 1)),
                      lambda: xla_attention.dot_product_attention(
                          q_BTNH, k_BSKH, v_BSKH, mask, keys.is_causal))


def cpu_batch_chunk(q_shape, k_shape, is_causal: bool) -> int | None:
  """Batch rows per pass of the XLA kernel (`xla_attention.default_batch_chunk`) for
  bidirectional attention in a program compiled for one CPU device; None (the
  whole batch at once) otherwise.

  Measured (docs/benchmarks.md): the small BERT's step (bidirectional, one
  [B, N, T, S] block) 5-8% faster with groups of 2 rows, on one thread and on
  two; the causal char LM's step 5-13% slower (its query blocks already cut the
  logits, and smaller products parallelise worse), so causal attention keeps
  its blocks alone. Not on an accelerator (not cache-bound), nor over a mesh of
  several devices (the batch axis is sharded; a loop over groups of its rows
  would fight that).
  """
  mesh = jax.sharding.get_abstract_mesh()
  devices = jax.device_count() if mesh.empty else mesh.size
  if is_causal or target_platform() != "cpu" or devices != 1:
    return None
  B, T, N, _ = q_shape
  return xla_attention.default_batch_chunk(B, N, T, k_shape[1])


def _xla(q_BTNH, k_BSKH, v_BSKH, keys, normalizer, logit_softcap, sink, return_stats=False,
         log_forget_BTN=None, logit_mod=None, logit_bias_BTS=None):
  """The XLA kernel; returns (z, sink factor or None, `AttentionStats` or None)."""
  bias_BTN = None
  if normalizer == "sigmoid":
    # -log n_i per query: O(B T N), from the causal prefix and the key mask.
    n_BTN = keys.count()
    bias_BTN = -jnp.log(jnp.maximum(n_BTN, 1.0))
  out = xla_attention.dot_product_attention(
      q_BTNH, k_BSKH, v_BSKH, keys.mask_BNTS, keys.is_causal, normalizer=normalizer,
      logit_softcap=logit_softcap, logit_bias_BTN=bias_BTN, log_forget_BTN=log_forget_BTN,
      logit_mod=logit_mod, logit_bias_BTS=logit_bias_BTS,
      return_lse=sink is not None,
      return_stats=return_stats,
      batch_chunk=cpu_batch_chunk(q_BTNH.shape, k_BSKH.shape, keys.is_causal))
  if sink is None and not return_stats:
    return out, None, None
  z_BTNH, rest = out[0], list(out[1:])
  sink_BTN = stats = None
  if sink is not None:
    lse_BTN = rest.pop(0)
    # sum_j p_ij = Z / (Z + e^b) = sigmoid(lse_i - b), with Z = sum_j e^(l_ij) = e^(lse_i).
    sink_BTN = jax.nn.sigmoid(lse_BTN - broadcast(sink, lse_BTN.shape))
  if return_stats:
    max_BTN, entropy_BTN = rest.pop(0)
    if bias_BTN is not None:  # the logit itself, as the diagnostics: without -log n_i
      max_BTN = max_BTN - broadcast(bias_BTN, max_BTN.shape)
    if sink is not None:
      # The keys' weights w s_ij, w = sigmoid(lse - b): -sum w s log(w s) = w H(s) - w log w.
      w_BTN = jax.lax.stop_gradient(sink_BTN)
      log_w_BTN = jax.nn.log_sigmoid(jax.lax.stop_gradient(lse_BTN)
                                     - broadcast(sink, lse_BTN.shape))
      entropy_BTN = w_BTN * entropy_BTN - w_BTN * jax.lax.stop_gradient(log_w_BTN)
    stats = AttentionStats(max_BTN, entropy_BTN)
  return z_BTNH, sink_BTN, stats
