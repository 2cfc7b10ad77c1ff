"""Pure functional dot-product attention with a pluggable scaling.

    z_i = c_i * sum_j p_ij v_j,   p_i = normalizer_j(l_ij),   l_ij = cap(mod_ij((q'_i . k'_j) * s_i))

where (q', k', s_i, c_i) come from the scaling (`attnscale.scalings`) and only the
keys visible to query i (mask, causality) take part. mod_ij is the identity
unless the scaling has a per-pair transform `scale_fn.logit_mod(l, i, j)` of
positions i, j (scale-invariant attention's; the XLA kernel takes it, so such
a scaling runs there on every platform). cap is the optional logit soft-cap
c tanh(x / c), and FoX's forget gate optionally adds D_ij = sum_{l=j+1}^{i}
log f_l; the normalizer is softmax (optionally with an attention sink: an extra
exp(b) in the denominator), sigmoid(l_ij - log n_i), or one of
`attnscale.core.normalizers` (softpick, ReLU/L, stick-breaking). Two
implementations:

* "reference": plain einsums, the T x S logits materialised, softmax in float32 (or wider).
  This is the definition.
* the fused path (default, `attnscale.core.fused`): s_i folded into q, c_i applied
  to the output, and one scale-1 kernel call, so one kernel serves every scaling:
  splash attention (`attnscale.core.splash_attention`, Pallas) on a TPU, cuDNN flash attention
  (`jax.nn.dot_product_attention`) on a GPU, the native CPU flash-attention kernel
  (`attnscale.core.cpu_kernel`, C++ through jax.ffi) on a CPU, `attnscale.core.xla_attention`
  elsewhere and for what those cannot take (every normaliser but softmax, and FoX's gate,
  everywhere; soft-cap and sink on cuDNN; soft-cap and stats on the native kernel;
  `fused.kernel_for` is the rule).

The kernel follows the platform the program is compiled *for*, not the host's:
the device kind of the mesh the step is traced under
(`jax.sharding.get_abstract_mesh()`, which `attnscale.runtime.steps` sets), else
`jax.default_backend()`. So a TPU program compiled on a CPU host
(`compile.py`) holds splash, and an H100 program cuDNN.

Dimension legend: B batch, T query length, S key/value length, N query heads,
K key/value heads (K divides N: grouped-query attention), H head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnscale.core import fused as fused_lib
from attnscale.core import normalizers as normalizers_lib
from attnscale.core import scalings as scalings_lib
from attnscale.core import selective as selective_lib
from attnscale.core.fused import AttentionStats
from attnscale.core.visibility import VisibleKeys, upcast

Array = jax.Array

IMPLEMENTATIONS = (None, "reference", "xla", "native", "cudnn", "splash")
NORMALIZERS = ("softmax", "sigmoid", *normalizers_lib.ROW_NORMALIZERS)


def attention(q_BTNH: Array,
              k_BSKH: Array,
              v_BSKH: Array,
              *,
              scale_fn: scalings_lib.ScaleFn | None = None,
              mask: Array | None = None,
              is_causal: bool = False,
              implementation: str | None = None,
              normalizer: str = "softmax",
              logit_softcap: float | None = None,
              sink: float | Array | None = None,
              log_forget: Array | None = None,
              selective: bool = False,
              return_stats: bool = False) -> Array | tuple[Array, AttentionStats]:
  """Multi-head dot-product attention with the scaling `scale_fn`.

  Args:
    q_BTNH: queries [batch, q_len, heads, head_dim].
    k_BSKH: keys [batch, kv_len, kv_heads, head_dim], kv_heads dividing heads.
    v_BSKH: values [batch, kv_len, kv_heads, value_dim]: the keys' shape but for
      the head dim, which may differ (differential attention's values are two
      head dims wide, `attnscale.core.differential`). Splash and cuDNN take
      value_dim = head_dim only, so there the fused path runs them once per
      head_dim-wide slice of v (`fused.fused`).
    scale_fn: a scaling from `attnscale.scalings.get(name, ...)` or any callable
      with the same signature; None means standard (1/sqrt(head_dim)).
    mask: boolean, broadcastable to [batch, heads, q_len, kv_len]; True = may
      attend (padding and any custom pattern). Masked keys count nowhere: not
      in key-norm sums, not in n.
    is_causal: query i attends to keys j <= i only (top-left aligned).
    implementation: None (fused: splash on a TPU where it takes the call,
      cuDNN on a GPU for bf16/fp16 softmax with no soft-cap and no sink, the
      native kernel on a CPU where it takes the call, else "xla"), "xla" (fused,
      `attnscale.core.xla_attention`), "native" (fused, `attnscale.core.cpu_kernel`
      where `fused.native_refusal` names no reason, else "xla"), "cudnn" (fused, cuDNN
      flash attention; errors where cuDNN refuses, and for sigmoid, a soft-cap
      or a sink, which jax.nn's cuDNN call cannot take), "splash" (fused,
      `attnscale.core.splash_attention`; in Pallas interpret mode off a TPU, which
      is slow and meant for tests; errors where splash refuses), or
      "reference".
    normalizer: "softmax", or "sigmoid": p_ij = sigmoid(l_ij - log n_i) with n_i
      the number of keys query i sees, Ramapuram et al. 2024, "Theory,
      Analysis, and Best Practices for Sigmoid Self-Attention" (arXiv
      2409.04431). No row normalisation; the fused path runs it in the XLA kernel.
      Or "softpick" (Zuhri et al. 2025, arXiv 2504.20966): relu(e^l_ij - 1) /
      sum_k |e^l_ik - 1|; "relu" (Wortsman et al. 2023, arXiv 2309.08586):
      relu(l_ij) / n_i; "stickbreaking" (Tan et al. 2025, arXiv 2410.17980):
      sigmoid(l_ij) prod_{j<k<=i} (1 - sigmoid(l_ik)), causal only. Their
      formulas, stable forms and sources: `attnscale.core.normalizers`. The
      fused path runs them in the XLA kernel; splash and cuDNN have none.
    logit_softcap: c > 0: each scaled logit l -> c * tanh(l / c), so |l| <= c,
      before masking and the normalizer. Gemma Team 2024, "Gemma 2: Improving
      Open Language Models at a Practical Size" (arXiv 2408.00118; c = 50 for
      attention). A tanh cannot be folded into q, so the fused path runs it in
      the XLA kernel. None = off.
    sink: an attention sink logit b, a scalar or [heads] (one per query head,
      traced arrays welcome: a model learns it): softmax only, p_ij = exp(l_ij) /
      (exp(b) + sum_k exp(l_ik)), so a query may put weight on nothing. b = 0
      is the off-by-one softmax (Miller 2023, "Attention Is Off By One"); a
      learned b per head is gpt-oss's (OpenAI 2025, gpt-oss model card). The
      sink is not a key: it changes no n_i and no scaling's sums. The fused
      path takes lse_i = log sum_j exp(l_ij) from the XLA kernel and multiplies
      its output by sum_j p_ij = sigmoid(lse_i - b). None = off.
    log_forget: FoX's forget gate (Lin et al. 2025, "Forgetting Transformer",
      arXiv 2503.02130): log f_t [batch, q_len, heads] (<= 0; a model computes
      log sigmoid(w_h . x_t + b_h) per head, traced arrays welcome), for causal
      self-attention (q_len = kv_len). Adds D_ij = sum_{l=j+1}^{i} log f_l to the
      logit l_ij after the soft-cap, with any normalizer; only positions
      j < l <= i enter query i's bias, so no future gate leaks. The fused path
      builds D per causal block in the XLA kernel. None = off.
    selective: selective attention (Leviathan et al. 2024, "Selective Attention
      Improves Transformer", arXiv 2410.02703), causal self-attention only:
      every head's logits minus F_ij = sum_{k<i} relu(l0_kj), l0 head 0's
      logits, the first key and the diagonal left out
      (`attnscale.core.selective`). F is [batch, q_len, kv_len]: O(B T^2) memory
      a call and head 0's logits again, so the fused path runs the XLA kernel
      (it adds -F per causal block); splash and cuDNN refuse it.
    return_stats: also return the `AttentionStats` of the call (each query's
      largest logit and entropy). The fused path takes them from the kernel:
      the XLA kernel's row max, log-sum-exp and weighted logit sum per causal
      block; splash and cuDNN return neither, so there a stats-only pass of
      the XLA kernel (the logits again, no p @ v, no gradient) computes them.

  Returns:
    [batch, q_len, heads, value_dim] in q's dtype. A query that sees no key gets
    zeros. With `return_stats`, (that, `AttentionStats`).
  """
  mask_BNTS = _check_inputs(q_BTNH, k_BSKH, v_BSKH, mask, implementation, normalizer)
  logit_softcap, sink = _check_options(q_BTNH.shape[2], implementation, normalizer,
                                       logit_softcap, sink)
  log_forget = _check_forget(q_BTNH.shape, k_BSKH.shape[1], is_causal, implementation,
                             normalizer, log_forget)
  _check_selective(q_BTNH.shape[1], k_BSKH.shape[1], is_causal, implementation, selective)
  B, T, N, H = q_BTNH.shape
  S, K = k_BSKH.shape[1], k_BSKH.shape[2]
  keys = VisibleKeys(mask_BNTS, is_causal, T, S, N, K)
  scale_fn = scale_fn or scalings_lib.Standard()
  logit_mod = getattr(scale_fn, "logit_mod", None)
  if implementation == "reference":
    scaled = scale_fn(q_BTNH, k_BSKH, keys)
    out_scale_BTN = scaled.output_scale
  else:
    q_BTNH_folded, k_BSKH_folded, out_scale_BTN = fused_lib.fold(
        scale_fn, q_BTNH, k_BSKH, keys, v_BSKH.dtype)
  if mask_BNTS is not None:
    # A query with no visible key returns zeros, never NaN or a mean of values.
    n_BTN = keys.count()
    base = 1.0 if out_scale_BTN is None else fused_lib.broadcast(out_scale_BTN, n_BTN.shape)
    out_scale_BTN = jnp.where(n_BTN > 0, base, 0.0)

  if implementation == "reference":
    z_BTNH, stats = _reference(scaled, v_BSKH, keys, normalizer, logit_softcap, sink,
                               return_stats, log_forget, logit_mod, selective)
  else:
    # Selective attention's -F from head 0 of the folded q and k, as the kernel's logits.
    bias_BTS = (selective_lib.head0_bias(q_BTNH_folded, k_BSKH_folded, mask_BNTS,
                                         logit_softcap, logit_mod) if selective else None)
    z_BTNH, sink_BTN, stats = fused_lib.fused(q_BTNH_folded, k_BSKH_folded, v_BSKH, keys,
                                              implementation, normalizer, logit_softcap,
                                              sink, return_stats, log_forget, logit_mod,
                                              logit_bias_BTS=bias_BTS)
    if sink_BTN is not None:
      out_scale_BTN = sink_BTN if out_scale_BTN is None else sink_BTN * fused_lib.broadcast(
          out_scale_BTN, sink_BTN.shape)
  if out_scale_BTN is not None:
    z_BTNH = z_BTNH * fused_lib.per_query(out_scale_BTN, z_BTNH.shape)
  z_BTNH = z_BTNH.astype(q_BTNH.dtype)
  if not return_stats:
    return z_BTNH
  # A query that sees no key: no logit (-inf) and no entropy (0), as the diagnostics.
  seen_BTN = jnp.broadcast_to(keys.count(), stats.max_logit_BTN.shape) > 0
  return z_BTNH, AttentionStats(jnp.where(seen_BTN, stats.max_logit_BTN, -jnp.inf),
                                jnp.where(seen_BTN, stats.entropy_BTN, 0.0))


def attention_weights(q_BTNH: Array,
                      k_BSKH: Array,
                      *,
                      scale_fn: scalings_lib.ScaleFn | None = None,
                      mask: Array | None = None,
                      is_causal: bool = False,
                      normalizer: str = "softmax",
                      logit_softcap: float | None = None,
                      sink: float | Array | None = None,
                      log_forget: Array | None = None,
                      selective: bool = False) -> tuple[Array, Array]:
  """The reference path's logits and attention weights, for analysis.

  `logit_softcap`, `sink`, `log_forget` and `selective` as in `attention`.

  Returns:
    (logits_BNTS, probs_BNTS), float32 (or wider): the scaled (and soft-capped)
    logits (-inf where a key is not visible) and the normalised weights p_ij (0
    where not visible; with a sink a row sums to sigmoid(lse_i - b) < 1). The
    output is c_i * probs @ v; `attention` applies c_i.
  """
  v_BSKH = jnp.zeros_like(k_BSKH)
  mask_BNTS = _check_inputs(q_BTNH, k_BSKH, v_BSKH, mask, "reference", normalizer)
  logit_softcap, sink = _check_options(q_BTNH.shape[2], "reference", normalizer,
                                       logit_softcap, sink)
  log_forget = _check_forget(q_BTNH.shape, k_BSKH.shape[1], is_causal, "reference",
                             normalizer, log_forget)
  _check_selective(q_BTNH.shape[1], k_BSKH.shape[1], is_causal, "reference", selective)
  B, T, N, _ = q_BTNH.shape
  S, K = k_BSKH.shape[1], k_BSKH.shape[2]
  keys = VisibleKeys(mask_BNTS, is_causal, T, S, N, K)
  scale_fn = scale_fn or scalings_lib.Standard()
  scaled = scale_fn(q_BTNH, k_BSKH, keys)
  logits_BKGTS, p_BKGTS = _logits_and_probs(scaled, keys, B, normalizer, logit_softcap, sink,
                                            log_forget, getattr(scale_fn, "logit_mod", None),
                                            selective)
  return logits_BKGTS.reshape(B, N, T, S), p_BKGTS.reshape(B, N, T, S)


def _reference(scaled, v_BSKH, keys, normalizer, logit_softcap, sink, return_stats=False,
               log_forget_BTN=None, logit_mod=None, selective=False):
  """The definition: materialised logits, float32 normaliser, einsums; (z, stats or None)."""
  B, S, K, H = v_BSKH.shape
  T, N = keys.q_len, keys.num_heads
  logits_BKGTS, p_BKGTS = _logits_and_probs(scaled, keys, B, normalizer, logit_softcap, sink,
                                            log_forget_BTN, logit_mod, selective)
  z_BTKGH = jnp.einsum("bkgts,bskh->btkgh", p_BKGTS, upcast(v_BSKH))
  z_BTNH = z_BTKGH.reshape(B, T, N, H)
  if not return_stats:
    return z_BTNH, None
  logits_BKGTS, p_BKGTS = jax.lax.stop_gradient((logits_BKGTS, p_BKGTS))
  plogp_BKGTS = jnp.where(p_BKGTS > 0, p_BKGTS * jnp.log(jnp.maximum(p_BKGTS, 1e-30)), 0.0)
  to_BTN = lambda x_BKGT: x_BKGT.reshape(B, N, T).transpose(0, 2, 1)
  return z_BTNH, AttentionStats(to_BTN(jnp.max(logits_BKGTS, axis=-1)),
                                to_BTN(-plogp_BKGTS.sum(axis=-1)))


def _logits_and_probs(scaled, keys, B, normalizer, logit_softcap=None, sink=None,
                      log_forget_BTN=None, logit_mod=None, selective=False):
  T, S, N, K = keys.q_len, keys.kv_len, keys.num_heads, keys.num_kv_heads
  G, H = N // K, scaled.q.shape[-1]
  # Group query heads by their key/value head: n = k * G + g.
  q_BTKGH = upcast(scaled.q).reshape(B, T, K, G, H)
  logits_BKGTS = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, upcast(scaled.k))
  s_BTN = fused_lib.broadcast(scaled.logit_scale, (B, T, N))
  s_BKGT1 = s_BTN.reshape(B, T, K, G).transpose(0, 2, 3, 1)[..., None]
  logits_BKGTS = logits_BKGTS * s_BKGT1
  if logit_mod is not None:  # a per-pair transform of positions i, j (scale_invariant)
    logits_BKGTS = logit_mod(logits_BKGTS, jnp.arange(T).reshape(1, 1, 1, T, 1),
                             jnp.arange(S).reshape(1, 1, 1, 1, S))
  if logit_softcap is not None:
    logits_BKGTS = jnp.tanh(logits_BKGTS / logit_softcap) * logit_softcap
  if selective:  # -F from head 0 (k = 0, g = 0) before FoX's bias, for every head
    f_BTS = selective_lib.selection_bias(
        logits_BKGTS[:, 0, 0], selective_lib.visible_BTS(keys.mask_BNTS, T, S))
    logits_BKGTS = logits_BKGTS - f_BTS[:, None, None]
  if log_forget_BTN is not None:
    # D_ij = c_i - c_j, c_i = sum_{l <= i} log f_l (FoX); the T x S matrix, as the logits.
    c_BKGT = jnp.cumsum(upcast(log_forget_BTN), axis=1).reshape(-1, T, K, G).transpose(
        0, 2, 3, 1)
    logits_BKGTS = logits_BKGTS + (c_BKGT[..., :, None] - c_BKGT[..., None, :])

  visible_BNTS = jnp.ones((1, 1, T, S), bool)
  if keys.is_causal:
    visible_BNTS = visible_BNTS & jnp.tril(jnp.ones((T, S), bool))[None, None]
  if keys.mask_BNTS is not None:
    visible_BNTS = visible_BNTS & keys.mask_BNTS
  visible_BKGTS = jnp.broadcast_to(visible_BNTS, (B, N, T, S)).reshape(B, K, G, T, S)
  logits_BKGTS = jnp.where(visible_BKGTS, logits_BKGTS, -jnp.inf)

  if normalizer == "softmax":
    max_BKGT1 = jnp.max(logits_BKGTS, axis=-1, keepdims=True)
    if sink is None:
      # A row with no visible key has max -inf: shift by 0 instead (its weights are 0).
      max_BKGT1 = jnp.where(jnp.isfinite(max_BKGT1), max_BKGT1, 0.0)
    else:
      # The sink's term joins the shift, so neither it nor the keys' terms overflow.
      sink_1KG11 = fused_lib.broadcast(sink, (N,)).reshape(1, K, G, 1, 1)
      max_BKGT1 = jnp.maximum(max_BKGT1, sink_1KG11)
    max_BKGT1 = jax.lax.stop_gradient(max_BKGT1)
    e_BKGTS = jnp.where(visible_BKGTS, jnp.exp(logits_BKGTS - max_BKGT1), 0.0)
    denom_BKGT1 = e_BKGTS.sum(axis=-1, keepdims=True)
    if sink is not None:
      denom_BKGT1 = denom_BKGT1 + jnp.exp(sink_1KG11 - max_BKGT1)
    p_BKGTS = e_BKGTS / jnp.where(denom_BKGT1 > 0, denom_BKGT1, 1.0)
  elif normalizer in normalizers_lib.ROW_NORMALIZERS:
    p_BKGTS = normalizers_lib.weights(normalizer, logits_BKGTS, visible_BKGTS)
  else:
    n_BTN = jnp.broadcast_to(keys.count(), (B, T, N))
    log_n_BKGT1 = jnp.log(jnp.maximum(n_BTN, 1.0)).reshape(B, T, K, G).transpose(0, 2, 3, 1)
    p_BKGTS = jnp.where(visible_BKGTS,
                        jax.nn.sigmoid(logits_BKGTS - log_n_BKGT1[..., None]), 0.0)
  return logits_BKGTS, p_BKGTS


def _check_options(num_heads, implementation, normalizer, logit_softcap, sink):
  """Validates the soft-cap and the sink; returns them as (float | None, Array | None)."""
  if logit_softcap is not None:
    logit_softcap = float(logit_softcap)  # a static number: the kernel's constant
    if not logit_softcap > 0:
      raise ValueError(f"logit_softcap must be > 0 or None, got {logit_softcap!r}")
    if logit_softcap == float("inf"):
      raise ValueError("logit_softcap must be finite (None turns the soft-cap off), got inf")
    if implementation == "cudnn":
      raise ValueError("implementation='cudnn' cannot take logit_softcap (jax.nn's cuDNN "
                       "attention has no soft-cap): use None or 'xla'")
  if normalizer != "softmax" and implementation in ("cudnn", "splash"):
    kernel = {"cudnn": "cuDNN", "splash": "splash"}[implementation]
    raise ValueError(f"normalizer={normalizer!r} has no {kernel} kernel: implementation "
                     f"must be None, 'xla' or 'reference', got {implementation!r}")
  if sink is None:
    return logit_softcap, None
  if normalizer != "softmax":
    raise ValueError(f"sink needs normalizer='softmax' (it adds exp(sink) to the softmax's "
                     f"denominator; {normalizer} has none), got {normalizer!r}")
  sink = upcast(sink)
  if sink.shape not in ((), (num_heads,)):
    raise ValueError(f"sink must be a scalar or have shape [heads] = ({num_heads},), "
                     f"got shape {tuple(sink.shape)}")
  if implementation == "cudnn":
    raise ValueError("implementation='cudnn' cannot take a sink (jax.nn's cuDNN attention "
                     "returns no log-sum-exp): use None or 'xla'")
  return logit_softcap, sink


def _check_forget(q_shape, kv_len, is_causal, implementation, normalizer, log_forget):
  """Validates FoX's log forget gate and stick-breaking's order; returns the gate or None."""
  if normalizer in normalizers_lib.CAUSAL_ONLY and not is_causal:
    raise ValueError(f"normalizer={normalizer!r} needs is_causal=True (it breaks the stick "
                     f"from the nearest key back: bidirectional attention has no such order)")
  if log_forget is None:
    return None
  B, T, N, _ = q_shape
  log_forget = jnp.asarray(log_forget)
  if log_forget.shape not in ((B, T, N), (1, T, N)):
    raise ValueError(f"log_forget must have shape [batch, q_len, heads] = {[B, T, N]}, "
                     f"got shape {tuple(log_forget.shape)}")
  if not (is_causal and kv_len == T):
    raise ValueError(f"log_forget needs causal self-attention (is_causal=True, q_len = "
                     f"kv_len), got is_causal={is_causal}, q_len {T}, kv_len {kv_len}")
  if implementation in ("cudnn", "splash"):
    raise ValueError(f"implementation={implementation!r} cannot take log_forget (its kernel "
                     f"takes no per-key bias): use None or 'xla'")
  return log_forget


def _check_selective(T, S, is_causal, implementation, selective):
  """Validates selective attention's needs: causal self-attention on a kernel with a [T, S] bias."""
  if not selective:
    return
  if not (is_causal and T == S):
    raise ValueError(f"selective needs causal self-attention (is_causal=True, q_len = "
                     f"kv_len), got is_causal={is_causal}, q_len {T}, kv_len {S}")
  if implementation in ("cudnn", "splash"):
    raise ValueError(f"implementation={implementation!r} cannot take selective (its kernel "
                     f"takes no [q_len, kv_len] logit bias here): use None, 'xla' or "
                     f"'reference'")


def _check_inputs(q, k, v, mask, implementation, normalizer):
  """Validates shapes and options; returns the mask as rank 4 (or None)."""
  for name, x in (("q", q), ("k", k), ("v", v)):
    if x.ndim != 4:
      raise ValueError(f"{name} must have rank 4 [batch, len, heads, head_dim], "
                       f"got shape {tuple(x.shape)}")
  if not q.dtype == k.dtype == v.dtype:
    raise ValueError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
  if k.shape[:3] != v.shape[:3]:
    raise ValueError(f"k and v must have the same [batch, kv_len, kv_heads] (v's head dim "
                     f"may differ), got k {tuple(k.shape)} and v {tuple(v.shape)}")
  if q.shape[0] != k.shape[0]:
    raise ValueError(f"q and k must have the same batch size, got {q.shape[0]} "
                     f"and {k.shape[0]}")
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"q and k must have the same head_dim, got {q.shape[-1]} "
                     f"and {k.shape[-1]}")
  if q.shape[2] % k.shape[2]:
    raise ValueError(f"kv_heads ({k.shape[2]}) must divide heads ({q.shape[2]})")
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, "
                     f"got {implementation!r}")
  if normalizer not in NORMALIZERS:
    raise ValueError(f"normalizer must be one of {NORMALIZERS}, got {normalizer!r}")
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise ValueError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
  full = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
  if mask.ndim > 4 or any(m not in (1, f) for m, f in zip(mask.shape[::-1], full[::-1])):
    raise ValueError(f"mask must broadcast to [batch, heads, q_len, kv_len] = "
                     f"{list(full)}, got shape {tuple(mask.shape)}")
  return mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
