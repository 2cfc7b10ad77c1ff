"""The soft-cap, the attention sink, the sigmoid, softpick, ReLU/L and stick-breaking
normalisers and FoX's forget gate on the fused path (the XLA kernel; the sinks on
the native CPU kernel where it built, attnscale/core/cpu_kernel): the fused path equals the
reference (values and gradients) for every scaling, and none of the options lets a
query see the future or padding. (Each new normaliser written out: tests/test_normalizers.py.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnscale
from attnscale.core import scalings, xla_attention
from attnscale.testing import padding_mask, random_qkv

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")


@pytest.fixture(autouse=True)
def two_causal_blocks(monkeypatch):
  """Causal blocks of 5 rows: every causal test here (T = 10) runs the kernel's
  blocked path, where the lse and the -log n_i bias are cut per block and put
  back together, at the one small shape all tests share (eager dispatch then
  reuses its compiled primitives: the module stays fast)."""
  monkeypatch.setattr(xla_attention, "MIN_BLOCK_Q", 5)

TOL = dict(rtol=2e-5, atol=2e-5)
N, K = 4, 2  # grouped-query attention everywhere: two query heads per key/value head
SINK_N = jnp.array([0.5, -1.0, 2.0, 0.0])  # one sink logit per query head
# FoX's log forget gate log f_t, [B, T, N]: log sigmoid of gate logits around +1.
LOG_FORGET_BTN = jax.nn.log_sigmoid(1.0 + jax.random.normal(jax.random.key(11), (2, 10, N)))
# id: (attention keywords but the learned input, the learned input: None, a float
# sink, "per_head" (the sink SINK_N) or "forget" (the gate LOG_FORGET_BTN))
OPTIONS = {
    "softcap": (dict(logit_softcap=1.5), None),
    "sink_zero": ({}, 0.0),
    "sink_per_head": ({}, "per_head"),
    "sigmoid": (dict(normalizer="sigmoid"), None),
    "softpick": (dict(normalizer="softpick"), None),
    "relu": (dict(normalizer="relu"), None),
    "stickbreaking": (dict(normalizer="stickbreaking"), None),
    "forget": ({}, "forget"),
    "forget_softpick": (dict(normalizer="softpick"), "forget"),
}
# Stick-breaking needs an order, FoX a causal prefix: no bidirectional calls.
CAUSAL_ONLY = ("stickbreaking", "forget", "forget_softpick")


# The leak tests take the general sink only (0.0 differs from it in value, not in code).
LEAK_OPTIONS = ["softcap", "sink_per_head", "sigmoid", "softpick", "relu", "stickbreaking",
                "forget"]


def _learned(options):
  """The traced input an option learns (the sink or the gate), else SINK_N (unused)."""
  return LOG_FORGET_BTN if OPTIONS[options][1] == "forget" else SINK_N


def _attend(options, name, q, k, v, learned, implementation, **kw):
  keywords, extra = OPTIONS[options]
  sink = learned if extra == "per_head" else None if extra == "forget" else extra
  if extra == "forget":  # the gate of q's positions (a prefix takes a prefix)
    keywords = {**keywords, "log_forget": learned[:, :q.shape[1]]}
  return attnscale.attention(q, k, v, scale_fn=scalings.get(name), sink=sink,
                             implementation=implementation, **keywords, **kw)


@pytest.mark.parametrize("name", scalings.names())
@pytest.mark.parametrize("options", list(OPTIONS))
def test_reference_equals_fused(options, name):
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  mask = padding_mask([10, 6], 10)
  w = jax.random.normal(jax.random.key(7), q.shape)  # a cotangent that sees every output

  def loss(implementation, q, k, v, learned):
    # Causal and bidirectional, both padded, in one loss: one gradient call per path.
    causal = (True,) if options in CAUSAL_ONLY else (True, False)
    outs = [_attend(options, name, q, k, v, learned, implementation, mask=mask,
                    is_causal=is_causal) for is_causal in causal]
    return jnp.sum((outs[0] + 0.5 * outs[-1]) * w), outs

  results = {}
  for impl in ("reference", None):
    (_, outs), grads = jax.value_and_grad(functools.partial(loss, impl), argnums=(0, 1, 2, 3),
                                          has_aux=True)(q, k, v, _learned(options))
    results[impl] = (*outs, *grads)
  for i, (got, want) in enumerate(zip(results[None], results["reference"])):
    np.testing.assert_allclose(got, want, **TOL, err_msg=f"output/gradient {i}")
  if OPTIONS[options][1] in ("per_head", "forget"):
    # The sink logits learn; so does every gate of the unpadded row but the first
    # position's (D_ij never holds log f_0). (Row 1's gates behind its padding shift
    # all its visible keys alike, which softmax ignores. Under softpick a query whose
    # logits are all <= 0 weighs nothing, and its gates get no gradient: most learn.)
    g = np.asarray(results[None][-1])
    g = g[0, 1:] if OPTIONS[options][1] == "forget" else g
    learns = np.abs(g) > 1e-7
    assert np.mean(learns) > 0.8 if "normalizer" in OPTIONS[options][0] else np.all(learns)


def test_causal_tests_run_two_blocks():
  assert xla_attention.causal_blocks(10, 10, xla_attention.default_block_q(10)) == [
      (0, 5, 5), (5, 10, 10)]


@pytest.mark.parametrize("name", scalings.names())
@pytest.mark.parametrize("options", LEAK_OPTIONS)
def test_no_future_leak(options, name):
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  # Eager, not jitted: every test here shares a few shapes, so eager dispatch
  # reuses the compiled primitives where jit would compile each case anew.
  attend = lambda q, k, v: _attend(options, name, q, k, v, _learned(options), None,
                                   is_causal=True)
  full = np.asarray(attend(q, k, v))
  # A prefix alone gives the full sequence's outputs there (what generation computes).
  i = 4
  prefix = np.asarray(attend(q[:, :i + 1], k[:, :i + 1], v[:, :i + 1]))
  np.testing.assert_allclose(full[:, :i + 1], prefix, **TOL)
  # Large later keys and values change nothing before them, not even by rounding.
  noise_k, noise_v = random_qkv(seed=1, T=10, S=10, N=N, K=K)[1:]
  out = np.asarray(attend(q, k.at[:, i + 1:].set(10 * noise_k[:, i + 1:]),
                          v.at[:, i + 1:].set(10 * noise_v[:, i + 1:])))
  np.testing.assert_array_equal(out[:, :i + 1], full[:, :i + 1])
  assert not np.allclose(out[:, i + 1:], full[:, i + 1:])  # the change was real
  gk, gv = jax.grad(lambda k, v: attend(q, k, v)[:, i].sum(), argnums=(0, 1))(k, v)
  assert np.all(np.asarray(gk[:, i + 1:]) == 0) and np.all(np.asarray(gv[:, i + 1:]) == 0)
  assert np.any(np.asarray(gv[:, :i + 1]) != 0)


@pytest.mark.parametrize("is_causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("options", LEAK_OPTIONS)
def test_no_padding_leak(options, is_causal):
  if options in CAUSAL_ONLY and not is_causal:
    pytest.skip(f"{options} is causal only")
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  mask = padding_mask([10, 6], 10)
  for name in scalings.names():
    attend = lambda k, v, name=name: _attend(options, name, q, k, v, _learned(options), None,
                                             mask=mask, is_causal=is_causal)
    base = np.asarray(attend(k, v))
    for k_pad, v_pad in ((100.0, -50.0), (0.0, 0.0)):
      out = np.asarray(attend(k.at[1, 6:].set(k_pad), v.at[1, 6:].set(v_pad)))
      np.testing.assert_array_equal(out, base, err_msg=name)


@pytest.mark.parametrize("options", list(OPTIONS))
def test_fully_masked_row_gives_zeros(options):
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  mask = jnp.ones((1, 1, 10, 10), bool).at[..., 3, :].set(False)  # query 3 sees nothing
  for name in ("standard", "fully_scaled"):  # fully_scaled: an output factor c_i too
    for impl in (None, "reference"):
      f = lambda q, k, v, s, name=name, impl=impl: _attend(options, name, q, k, v, s, impl,
                                                           mask=mask, is_causal=True)
      learned = _learned(options)
      assert np.all(np.asarray(f(q, k, v, learned)[:, 3]) == 0), (name, impl)
      grads = jax.grad(lambda *a, f=f: f(*a).sum(), argnums=(0, 1, 2, 3))(q, k, v, learned)
      assert all(np.all(np.isfinite(g)) for g in grads), (name, impl)


def test_softcap_bounds_the_logits():
  q, k, _ = random_qkv(T=10, S=10, N=N, K=K)
  c = 2.0
  for name in scalings.names():
    for is_causal in (False, True):
      kw = dict(scale_fn=scalings.get(name), is_causal=is_causal, mask=padding_mask([10, 6], 10))
      raw, _ = attnscale.attention_weights(10 * q, 10 * k, **kw)
      capped, _ = attnscale.attention_weights(10 * q, 10 * k, logit_softcap=c, **kw)
      visible = np.isfinite(np.asarray(raw))
      assert np.array_equal(np.isfinite(np.asarray(capped)), visible)  # same keys seen
      assert np.all(np.abs(np.asarray(capped)[visible]) <= c), name
      np.testing.assert_allclose(np.asarray(capped)[visible],
                                 c * np.tanh(np.asarray(raw)[visible] / c), rtol=1e-5, atol=1e-6)


def test_sink_weights_written_out():
  # p_ij = exp(l_ij) / (exp(b_h) + sum_k exp(l_ik)) over the visible keys.
  q, k, _ = random_qkv(T=10, S=10, N=N, K=K)
  logits, plain = attnscale.attention_weights(q, k, is_causal=True)
  for sink in (0.0, SINK_N):
    _, probs = attnscale.attention_weights(q, k, is_causal=True, sink=sink)
    b_1N11 = jnp.broadcast_to(jnp.asarray(sink), (N,)).reshape(1, N, 1, 1)
    e = jnp.exp(logits)  # exp(-inf) = 0 for the future keys
    np.testing.assert_allclose(probs, e / (jnp.exp(b_1N11) + e.sum(-1, keepdims=True)), **TOL)
    # Each row keeps sigmoid(lse_i - b) of its weight: the rest sinks.
    lse = jax.nn.logsumexp(logits, axis=-1)
    np.testing.assert_allclose(probs.sum(-1), jax.nn.sigmoid(lse - b_1N11[..., 0]), **TOL)
  # A sink far below every logit is no sink.
  _, far = attnscale.attention_weights(q, k, is_causal=True, sink=-60.0)
  np.testing.assert_allclose(far, plain, **TOL)


def test_sink_is_not_a_key():
  # The sink changes no n_i: log_n's and fully_scaled's factors are those without it,
  # so with a sink far below the logits the output is the plain one.
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  for name in ("log_n", "fully_scaled", "key_norm_mean"):
    for impl in (None, "reference"):
      kw = dict(scale_fn=scalings.get(name), is_causal=True, implementation=impl)
      np.testing.assert_allclose(attnscale.attention(q, k, v, sink=-60.0, **kw),
                                 attnscale.attention(q, k, v, **kw), **TOL)


def test_traced_sink_under_jit():
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  f = lambda b: attnscale.attention(q, k, v, is_causal=True, sink=b).sum()
  want = jax.grad(lambda b: attnscale.attention(q, k, v, is_causal=True, sink=b,
                                                implementation="reference").sum())(SINK_N)
  np.testing.assert_allclose(jax.jit(jax.grad(f))(SINK_N), want, **TOL)


def test_options_compose():
  # A soft-cap with a sink, a soft-cap with sigmoid, on both paths, bf16 inputs too.
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  mask = padding_mask([10, 6], 10)
  for kw in (dict(logit_softcap=1.0, sink=SINK_N), dict(logit_softcap=1.0, normalizer="sigmoid")):
    kw = dict(scale_fn=scalings.get("fully_scaled"), mask=mask, is_causal=True, **kw)
    want = attnscale.attention(q, k, v, implementation="reference", **kw)
    np.testing.assert_allclose(attnscale.attention(q, k, v, **kw), want, **TOL)
    got = attnscale.attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), **kw)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(got.astype(jnp.float32), want, atol=0.05)


def test_sigmoid_weights_written_out():
  # Query 0 sees key 0 only (n_0 = 1, log n_0 = 0): its output is sigmoid(l_00) v_0,
  # every later key weighing exactly 0.
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  out = attnscale.attention(q, k, v, normalizer="sigmoid", is_causal=True)
  logit = jnp.einsum("nh,nh->n", q[0, 0], jnp.repeat(k[0, 0], N // K, axis=0)) / np.sqrt(8)
  want = jax.nn.sigmoid(logit)[:, None] * jnp.repeat(v[0, 0], N // K, axis=0)
  np.testing.assert_allclose(out[0, 0], want, **TOL)


@pytest.mark.parametrize("kwargs,match", [
    (dict(logit_softcap=0.0), r"logit_softcap must be > 0 or None, got 0.0"),
    (dict(logit_softcap=-1.0), r"logit_softcap must be > 0 or None, got -1.0"),
    (dict(logit_softcap=float("nan")), r"logit_softcap must be > 0 or None, got nan"),
    (dict(logit_softcap=float("inf")), r"logit_softcap must be finite"),
    (dict(sink=jnp.zeros(3)), r"sink must be a scalar or have shape \[heads\] = \(4,\), "
                              r"got shape \(3,\)"),
    (dict(sink=jnp.zeros((1, 4))), r"sink must be a scalar or have shape \[heads\]"),
    (dict(sink=0.0, normalizer="sigmoid"), r"sink needs normalizer='softmax'"),
    (dict(logit_softcap=1.0, implementation="cudnn"),
     r"implementation='cudnn' cannot take logit_softcap"),
    (dict(sink=0.0, implementation="cudnn"), r"implementation='cudnn' cannot take a sink"),
    (dict(normalizer="sigmoid", implementation="cudnn"),
     r"normalizer='sigmoid' has no cuDNN kernel"),
])
def test_bad_options(kwargs, match):
  q, k, v = random_qkv(T=10, S=10, N=N, K=K)
  with pytest.raises(ValueError, match=match) as e:
    attnscale.attention(q, k, v, **kwargs)
  assert "\n" not in str(e.value)
  if "implementation" not in kwargs:  # analysis refuses the same values
    with pytest.raises(ValueError, match=match):
      attnscale.attention_weights(q, k, **kwargs)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the GPU kernel choice")
@pytest.mark.parametrize("options", list(OPTIONS))
def test_gpu_options_run_the_xla_kernel(options):
  # jax.nn's cuDNN call takes none of the options: the default falls back to
  # attnscale's XLA kernel (checked in the compiled program) and agrees.
  q, k, v = (x.astype(jnp.bfloat16) for x in random_qkv(T=128, S=128, N=N, K=K, H=64))
  learned = (jax.nn.log_sigmoid(jnp.ones((2, 128, N))) if OPTIONS[options][1] == "forget"
             else SINK_N)
  f = lambda q, k, v: _attend(options, "standard", q, k, v, learned, None, is_causal=True)
  text = jax.jit(jax.grad(lambda *a: f(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))
                 ).lower(q, k, v).compile().as_text()
  assert "__cudnn$fmha" not in text
  want = _attend(options, "standard", q, k, v, learned, "reference", is_causal=True)
  np.testing.assert_allclose(f(q, k, v).astype(jnp.float32), want.astype(jnp.float32),
                             atol=0.05)
