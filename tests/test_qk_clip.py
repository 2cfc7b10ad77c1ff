"""QK-clip (`config.qk_clip`): after a clipped step the clipped heads' largest
logit on that batch is tau, heads under tau keep their q and k weights bit for bit,
grouped-query attention shrinks only the query heads, and the scalings whose logits
the projections do not scale are refused in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import tasks
from attnscale.models import base
from attnscale.runtime import configlib, steps
from attnscale.runtime import train_state as ts
from configs import shakespeare_char


def _config(**overrides):
  config = shakespeare_char.get_config("preset=test")
  config.update_from_flattened_dict({"model.dropout": 0.0, "model.num_heads": 4, **overrides})
  return config


def _run(config, tau):
  """One train step from the initial state: (state before, state after, metrics, batch)."""
  config.qk_clip = tau
  mesh = ts.make_mesh(config)
  graphdef, state, shardings = ts.create_state(config, mesh)
  task = tasks.task_class(config).without_data(config)
  step = steps.make_train_step(graphdef, task, config, shardings, ts.batch_sharding(mesh))
  tokens = jax.random.randint(jax.random.key(1), (config.batch_size, config.seq_len + 1), 0, 65)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  before = jax.tree.map(jnp.copy, state)
  after, metrics = step(state, batch)
  return graphdef, task, before, after, metrics, batch


def _max_logit_LN(graphdef, task, params, batch):
  model = nnx.merge(graphdef, params)
  _, stats = base.attention_stats(model, lambda m: task.loss(m, batch))
  return np.asarray(steps.attention_health(stats, None)["attn_max_logit"])


def _qk(params, layer):
  attn = params["blocks"][layer]["attn"]
  return np.asarray(attn["q_proj"]["kernel"][...]), np.asarray(attn["k_proj"]["kernel"][...])


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_clipped_heads_reach_tau_and_the_others_stay(kv_heads):
  # The first step's learning rate is 0 (warm-up): only the clip changes q and k.
  config = _config(**{"model.num_kv_heads": kv_heads})
  graphdef, task, _, plain, metrics, batch = _run(config, 0.0)
  S_LN = np.asarray(metrics["attn_max_logit"])
  tau = float(np.median(S_LN))  # about half the heads above it
  config = _config(**{"model.num_kv_heads": kv_heads})
  graphdef, task, _, clipped, metrics, _ = _run(config, tau)
  np.testing.assert_array_equal(metrics["attn_max_logit"], S_LN)
  hit_LN = S_LN > tau
  assert 0 < hit_LN.sum() < hit_LN.size and int(metrics["attn_clipped_heads"]) == hit_LN.sum()
  after_LN = _max_logit_LN(graphdef, task, clipped["params"], batch)
  # Layer 0 sees the same input after the clip: its clipped heads are at tau (within
  # float32 rounding). Later layers' inputs moved with the clipped heads before them.
  assert hit_LN[0].any()
  assert np.all(after_LN[0][hit_LN[0]] <= tau * (1 + 1e-5))
  np.testing.assert_allclose(after_LN[0][hit_LN[0]], tau, rtol=1e-4)
  np.testing.assert_allclose(after_LN[hit_LN], tau, rtol=1e-2)
  H = config.model.width // 4
  for layer in range(config.model.num_layers):
    q_ref, k_ref = _qk(plain["params"], layer)
    q, k = _qk(clipped["params"], layer)
    for n in range(4):
      cols = slice(n * H, (n + 1) * H)
      factor = tau / S_LN[layer, n]
      if not hit_LN[layer, n]:
        np.testing.assert_array_equal(q[:, cols], q_ref[:, cols])  # bit for bit
      elif kv_heads == 4:
        np.testing.assert_allclose(q[:, cols], q_ref[:, cols] * np.sqrt(factor), rtol=1e-6)
      else:
        np.testing.assert_allclose(q[:, cols], q_ref[:, cols] * factor, rtol=1e-6)
    if kv_heads == 4:
      for n in range(4):
        cols = slice(n * H, (n + 1) * H)
        expect = k_ref[:, cols] * (np.sqrt(tau / S_LN[layer, n]) if hit_LN[layer, n] else 1.0)
        np.testing.assert_allclose(k[:, cols], expect, rtol=1e-6)
        if not hit_LN[layer, n]:
          np.testing.assert_array_equal(k[:, cols], k_ref[:, cols])
    else:  # shared key heads: never touched
      np.testing.assert_array_equal(k, k_ref)


@pytest.mark.parametrize("overrides, words", [
    ({"model.scaling": "cosine"}, "model.scaling='cosine' does not have logits bilinear"),
    ({"model.scaling": "qk_rmsnorm"}, "model.scaling='qk_rmsnorm' does not have logits"),
    ({"model.scaling": "key_norm_sum"}, "model.scaling='key_norm_sum' does not have logits"),
    ({"model.qk_norm": "rmsnorm"}, "model.qk_norm='rmsnorm' normalises q and k"),
    ({"model.logit_softcap": 50.0}, "model.logit_softcap=50 already bounds the logits"),
])
def test_refusals_name_the_reason_in_one_line(overrides, words):
  config = _config(**overrides)
  config.qk_clip = 30.0
  with pytest.raises(ValueError, match="config.qk_clip=30 cannot apply") as e:
    configlib.validate(config)
  assert words in str(e.value) and "\n" not in str(e.value)


def test_every_bilinear_scaling_and_the_unit_variant_pass():
  for scaling in ("standard", "none", "inverse_d", "log_n", "log_n_ratio",
                  "temperature_tuning", "yarn", "fully_scaled", "umup"):
    config = _config(**{"model.scaling": scaling})
    config.qk_clip = 30.0
    configlib.validate(config)
  config = _config(**{"model.variant": "unit", "model.scaling": "fully_scaled"})
  config.qk_clip = 30.0
  configlib.validate(config)


def test_negative_threshold_is_refused():
  config = _config()
  config.qk_clip = -1.0
  with pytest.raises(ValueError, match="config.qk_clip must be >= 0"):
    configlib.validate(config)
