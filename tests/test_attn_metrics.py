"""Attention health in the training log: the fused path's per-query stats equal
the reference's for every scaling and option, and a real train.py-path run logs what
eval.py's diagnostics compute on the same parameters and batch: the attention health
of the step's forward pass, and the sinks and massive activations of the extra pass
on config.sink_metrics_rows rows, which leaves training as it was."""

import functools
import glob
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

import attnscale
from attnscale import testing
from attnscale.core import scalings, xla_attention
from attnscale.testing import padding_mask, random_qkv

pytestmark = pytest.mark.usefixtures("strict_rank_promotion")

# The grid of the brief (testing.SCALING_CASES' ids) and the options; K = 2 < N = 4
# everywhere, so every case is grouped-query attention.
CASES = {
    "standard": ("standard", {}),
    "cosine": ("cosine", {"temperature": 6.0}),
    "qk_rmsnorm": ("qk_rmsnorm", {}),
    "key_norm_sum": ("key_norm_sum", {}),
    "yarn": ("yarn", {"train_len": 4}),
}
OPTIONS = {
    "plain": {},
    "softcap": {"logit_softcap": 1.5},
    "sink_learned": {"sink": jnp.array([0.5, -1.0, 2.0, 0.0])},
    "sink_zero": {"sink": 0.0},
    "sigmoid": {"normalizer": "sigmoid"},
    "softpick": {"normalizer": "softpick"},
    "relu": {"normalizer": "relu"},
    "stickbreaking": {"normalizer": "stickbreaking"},
    "forget": {"log_forget": jax.nn.log_sigmoid(1.0 + jax.random.normal(jax.random.key(4),
                                                                       (2, 10, 4)))},
}


@pytest.fixture(autouse=True)
def causal_blocks(monkeypatch):
  """Blocks of 5 rows, so the stats are cut per causal block and put back together."""
  monkeypatch.setattr(xla_attention, "MIN_BLOCK_Q", 5)


@functools.cache
def _inputs():
  q, k, v = random_qkv(seed=3, B=2, T=10, S=10, N=4, K=2, H=8)
  return 2.0 * q, k, v, padding_mask([10, 6], 10)  # larger logits: a peaked softmax


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("case", list(CASES))
def test_fused_stats_equal_reference(case, option):
  name, params = CASES[case]
  q, k, v, mask = _inputs()
  kw = dict(scale_fn=scalings.get(name, **params), mask=mask, is_causal=True, **OPTIONS[option])
  z_ref, ref = attnscale.attention(q, k, v, implementation="reference", return_stats=True, **kw)
  z, fused = attnscale.attention(q, k, v, return_stats=True, **kw)
  np.testing.assert_allclose(z, z_ref, rtol=2e-5, atol=2e-5)
  # Padded queries (row 1 past 6) see the real keys: their stats are defined too.
  np.testing.assert_allclose(fused.max_logit_BTN, ref.max_logit_BTN, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(fused.entropy_BTN, ref.entropy_BTN, rtol=1e-4, atol=2e-5)
  assert fused.max_logit_BTN.shape == (2, 10, 4)


def test_stats_carry_no_gradient_and_leave_the_output_alone():
  q, k, v, mask = _inputs()
  # The statistics come from the XLA kernel: the output is compared on it (the native
  # CPU kernel, the default, agrees with it to rounding only).
  kw = dict(mask=mask, is_causal=True, sink=0.0, implementation="xla")
  z = attnscale.attention(q, k, v, **kw)
  z_stats, _ = attnscale.attention(q, k, v, return_stats=True, **kw)
  np.testing.assert_array_equal(z, z_stats)
  stats_loss = lambda q: sum(jnp.sum(s) for s in attnscale.attention(
      q, k, v, return_stats=True, **kw)[1])
  np.testing.assert_array_equal(jax.grad(stats_loss)(q), 0.0)


def test_query_without_keys_gets_minus_inf_and_zero():
  q, k, v, _ = _inputs()
  mask = padding_mask([10, 0], 10)
  for impl in ("reference", None):
    _, stats = attnscale.attention(q, k, v, mask=mask, is_causal=True, implementation=impl,
                                   return_stats=True)
    assert np.all(stats.max_logit_BTN[1] == -np.inf)
    np.testing.assert_array_equal(stats.entropy_BTN[1], 0.0)


def test_health_excludes_padded_queries_as_the_diagnostics():
  from attnscale.evaluation import diagnostics
  from attnscale.runtime import steps
  q, k, v, mask = _inputs()
  query_mask_BT = mask[:, 0, 0, :]
  kw = dict(mask=mask, is_causal=False, sink=jnp.array([0.5, -1.0, 2.0, 0.0]))
  _, stats = attnscale.attention(q, k, v, return_stats=True, **kw)
  health = steps.attention_health([stats], query_mask_BT)
  ref = diagnostics.attention_stats(q, k, v, query_mask_BT=query_mask_BT, **kw)["heads"]
  np.testing.assert_allclose(health["attn_max_logit"][0], ref["max_logit"], rtol=1e-5)
  np.testing.assert_allclose(health["attn_entropy"][0], ref["entropy"], rtol=1e-4)


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
  """3 steps at the test preset, logged and checkpointed every step, no dropout
  (the diagnostics run the model deterministically), sink metrics on 4 of 8 rows."""
  from attnscale.testing import train_tiny_run
  return train_tiny_run(tmp_path_factory, overrides=LOGGED | {"sink_metrics_rows": SINK_ROWS})


SINK_ROWS = 4
LOGGED = {"num_train_steps": 3, "log_every": 1, "checkpoint_every": 1, "keep_checkpoints": 5,
          "eval_every": 2, "model.dropout": 0.0}


def test_logged_health_equals_eval_diagnostics(logged_run):
  """The row logged at step s is the forward pass of step s: the parameters after
  step s - 1 on the batch of step s - 1 (`task.train_batch(s - 1)`)."""
  from attnscale import tasks
  from attnscale.evaluation import diagnostics, eval_lib
  from attnscale.runtime import metrics_writer
  workdir = logged_run.workdir
  config = eval_lib.load_config(workdir)
  task = tasks.get_task(config)
  rows = {r["step"]: r for r in metrics_writer.read_rows(workdir) if "train/loss" in r}
  for step in (2, 3):
    model, _, _ = eval_lib.restore(config, workdir, step - 1)
    layers = diagnostics.task_attention_stats(model, task, task.train_batch(step - 1))
    row = rows[step]
    for i, layer in enumerate(layers):
      np.testing.assert_allclose(row[f"train/attn/max_logit/layer_{i}"], layer["max_logit"],
                                 rtol=1e-4)
      np.testing.assert_allclose(row[f"train/attn/entropy/layer_{i}"], layer["entropy"],
                                 rtol=1e-4)
      np.testing.assert_allclose(row[f"train/attn/max_logit_heads/layer_{i}"],
                                 layer["heads"]["max_logit"], rtol=1e-4)
      np.testing.assert_allclose(row[f"train/attn/entropy_heads/layer_{i}"],
                                 layer["heads"]["entropy"], rtol=1e-4)


def test_logged_sinks_and_activations_equal_eval_diagnostics(logged_run):
  """The row logged at step s holds the diagnostics of the parameters after step s
  (its checkpoint) on the first sink_metrics_rows rows of the batch of step s - 1."""
  from attnscale import tasks
  from attnscale.evaluation import diagnostics, eval_lib
  from attnscale.runtime import metric_keys as keys
  from attnscale.runtime import metrics_writer
  workdir = logged_run.workdir
  config = eval_lib.load_config(workdir)
  task = tasks.get_task(config)
  rows = {r["step"]: r for r in metrics_writer.read_rows(workdir) if keys.LOSS in r}
  assert sorted(rows) == [1, 2, 3]
  for step, row in rows.items():
    model, _, _ = eval_lib.restore(config, workdir, step)
    batch = {k: v[:SINK_ROWS] for k, v in task.train_batch(step - 1).items()}
    layers = diagnostics.task_attention_stats(model, task, batch)
    for i, layer in enumerate(layers):
      for prefix, name in keys.LAYER_STATS.items():
        np.testing.assert_allclose(row[keys.attention_key(prefix, i)], layer[name],
                                   rtol=1e-4, err_msg=f"{name} {i} at step {step}")
      np.testing.assert_allclose(row[keys.attention_key(keys.SINK_RATE_HEADS, i)],
                                 layer["heads"]["sink_rate"], rtol=1e-4)
    # The output logits' health is logged on every run; the z-loss term only when on.
    assert np.isfinite(row[keys.OUT_MAX_LOGIT]) and np.isfinite(row[keys.OUT_LOG_Z])
    assert keys.Z_LOSS not in row


@pytest.fixture(scope="module")
def unsunk_run(tmp_path_factory):
  """`logged_run` with sink_metrics_rows=0 (module-scoped as it is: both train before
  `causal_blocks` changes the kernel's blocks)."""
  from attnscale.testing import train_tiny_run
  return train_tiny_run(tmp_path_factory, overrides=LOGGED | {"sink_metrics_rows": 0},
                        name="no_sinks")


def test_the_extra_pass_leaves_training_as_it_was(logged_run, unsunk_run):
  """sink_metrics_rows=0: the same losses, gradient norms, validation and parameters
  bit for bit, and no sink entries."""
  from attnscale.runtime import metrics_writer
  off = unsunk_run
  from attnscale.runtime import metric_keys as keys
  sink = (*keys.LAYER_STATS, keys.SINK_RATE_HEADS)
  timing = (keys.ELAPSED_S, keys.STEPS_PER_S, keys.TOKENS_PER_S)
  strip = lambda row: {k: v for k, v in row.items()
                       if not k.startswith(sink) and k not in timing}
  on_rows = [strip(r) for r in metrics_writer.read_rows(logged_run.workdir)]
  off_rows = metrics_writer.read_rows(off.workdir)
  assert on_rows == [strip(r) for r in off_rows]
  assert not any(k.startswith(sink) for r in off_rows for k in r)
  assert any(k.startswith(sink) for r in metrics_writer.read_rows(logged_run.workdir)
             for k in r)
  a = testing.restore_checkpoint(logged_run.config, logged_run.workdir)
  b = testing.restore_checkpoint(off.config, off.workdir)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_tensorboard_holds_the_layer_scalars_not_the_lists(logged_run):
  tags = set()
  for path in glob.glob(os.path.join(logged_run.workdir, "tensorboard", "events.*")):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      tags.update(v.tag for v in event.summary.value)
      pos += 12 + length + 4
  assert {"train/attn/max_logit/layer_0", "train/attn/entropy/layer_1",
          "train/attn/sink_rate/layer_0", "train/attn/act_ratio/layer_1",
          "train/out/max_logit", "train/out/log_z"} <= tags
  lists = ("train/attn/max_logit_heads/", "train/attn/entropy_heads/",
           "train/attn/sink_rate_heads/")  # sink_heads is a scalar: the share of sink heads
  assert not any(t.startswith(lists) for t in tags)
  assert "train/attn/sink_heads/layer_0" in tags


@pytest.mark.heavy
@pytest.mark.parametrize("remat", ["full"])
def test_remat_logs_the_same_stats(remat):
  """The stats are sown inside the rematerialised blocks and still come out."""
  from attnscale import tasks
  from attnscale.runtime import steps
  from attnscale.runtime import train_state as ts
  from configs import shakespeare_char

  def metrics_of(remat):
    config = shakespeare_char.get_config("preset=test")
    config.update_from_flattened_dict({"model.dropout": 0.0, "remat": remat})
    mesh = ts.make_mesh(config)
    graphdef, state, shardings = ts.create_state(config, mesh)
    task = tasks.task_class(config).without_data(config)
    step = steps.make_train_step(graphdef, task, config, shardings, ts.batch_sharding(mesh))
    tokens = jax.random.randint(jax.random.key(1), (8, 33), 0, 65)
    return step(state, {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]})[1]

  plain, rematted = metrics_of("none"), metrics_of(remat)
  for key in ("attn_max_logit", "attn_entropy", "loss"):
    np.testing.assert_allclose(rematted[key], plain[key], rtol=1e-6)
  assert plain["attn_max_logit"].shape == (2, 2)
