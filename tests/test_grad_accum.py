"""Gradient accumulation (config.grad_accum_steps): the global batch in micro-batches
gives the one-batch step's loss, gradient, attention statistics, output-logit stats,
z-loss and update, also when the micro-batches hold different numbers of targets;
bad values fail in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnscale import tasks
from attnscale.runtime import configlib, steps
from attnscale.runtime import train_state as ts
from configs import shakespeare_char


def _one_step(accum_steps, batch, z_loss=0.0):
  config = shakespeare_char.get_config("preset=test")
  config.update_from_flattened_dict({"model.dropout": 0.0, "attn_metrics": True,
                                     "grad_accum_steps": accum_steps, "z_loss": z_loss})
  configlib.validate(config, num_devices=jax.device_count())
  mesh = ts.make_mesh(config)
  graphdef, state, shardings = ts.create_state(config, mesh)
  task = tasks.task_class(config).without_data(config)
  step = steps.make_train_step(graphdef, task, config, shardings, ts.batch_sharding(mesh))
  state, metrics = step(state, batch)
  return jax.device_get((metrics, state["params"]))


def _uneven_batch():
  tokens = jax.random.randint(jax.random.key(1), (8, 33), 0, 65)
  # Rows weigh 32, 20, 0, ... targets: the micro-batches' shares differ, so an
  # unweighted mean of their losses would be wrong.
  lengths = jnp.array([32, 20, 0, 7, 32, 1, 15, 32])
  weights = (jnp.arange(32)[None, :] < lengths[:, None]).astype(jnp.float32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights}


@pytest.mark.parametrize("z_loss", [0.0, 0.1])
def test_accumulated_step_equals_the_one_batch_step(z_loss):
  """With z-loss too: its term weighs each micro-batch by its targets, the largest
  output logit is the max over micro-batches and the mean log Z their weighted mean."""
  batch = _uneven_batch()
  want_metrics, want_params = _one_step(1, batch, z_loss)
  keys = ("loss", "grad_norm", "attn_max_logit", "attn_entropy", "out_max_logit",
          "out_log_z") + (("z_loss",) if z_loss else ())
  assert set(keys) <= set(want_metrics)
  for accum in (2, 4):
    metrics, params = _one_step(accum, batch, z_loss)
    for key in keys:
      np.testing.assert_allclose(metrics[key], want_metrics[key], rtol=2e-5, err_msg=key)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want_params)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_loss_and_grads_weighs_micro_batches_by_their_targets():
  """The helper alone: a mean over weighted targets, reached in 4 micro-batches."""
  x_B = jnp.arange(8.0)
  w_B = jnp.array([1.0, 0.0, 3.0, 1.0, 0.0, 0.0, 2.0, 1.0])

  def loss_fn(params, batch, key):
    del key
    total = jnp.sum(batch["w"] * (params * batch["x"]) ** 2)
    count = jnp.sum(batch["w"])
    return total / jnp.maximum(count, 1.0), {"loss_sum": total, "count": count}

  want = steps.loss_and_grads(loss_fn, 1.5, {"x": x_B, "w": w_B}, jax.random.key(0), 1)
  got = steps.loss_and_grads(loss_fn, 1.5, {"x": x_B, "w": w_B}, jax.random.key(0), 4)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("accum, message", [
    (3, r"config.batch_size \(8\) must be divisible by config.grad_accum_steps x the number "
        r"of devices \(3 x 1 = 3\)"),
    (0, r"config.grad_accum_steps must be an integer >= 1, got 0")])
def test_bad_grad_accum_steps_is_one_line(accum, message):
  config = shakespeare_char.get_config("preset=test")
  config.grad_accum_steps = accum
  with pytest.raises(ValueError, match=message):
    configlib.validate(config, num_devices=1)
