"""z-loss (config.z_loss, PaLM: arXiv 2204.02311) through the train step and the loop:
the step minimises cross-entropy + coef * mean (log Z)^2 and logs the cross-entropy,
the term and the output logits' health, exactly as written out on a tiny model; bad
values fail in one line; a pack takes it per run (a traced switch, as qk_clip); a
tiny run's metrics.jsonl holds the new keys. Gradient accumulation:
tests/test_grad_accum.py; a packed run: tests/test_packed.py; the pure functions:
tests/test_losses.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import tasks, testing
from attnscale.config import labels
from attnscale.runtime import configlib, metric_keys, metrics_writer, packing, steps
from attnscale.runtime import train_state as ts
from configs import shakespeare_char

COEF = 0.1  # large, so that the term moves the gradient well past float rounding


def _config(**overrides):
  config = shakespeare_char.get_config("preset=test")
  config.update_from_flattened_dict({"model.dropout": 0.0, **overrides})
  return config


def _batch():
  tokens = jax.random.randint(jax.random.key(2), (8, 33), 0, 65)
  lengths = jnp.array([32, 20, 0, 7, 32, 1, 15, 32])  # padded rows: weighted means
  weights = (jnp.arange(32)[None, :] < lengths[:, None]).astype(jnp.float32)
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights}


def _first_step(config, batch):
  """(metrics of the first train step, the written-out reference of that step)."""
  mesh = ts.make_mesh(config)
  graphdef, state, shardings = ts.create_state(config, mesh)
  w_BT = batch["weights"]

  def direct(params):  # cross-entropy + coef * sum_t w_t (log Z_t)^2 / sum_t w_t
    logits_BTV = nnx.merge(graphdef, params)(batch["inputs"])
    total, count = tasks.cross_entropy(logits_BTV, batch["targets"], w_BT)
    log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
    z = jnp.sum(w_BT * log_z_BT**2) / count
    real_max = jnp.max(jnp.where(w_BT[..., None] > 0, logits_BTV, -jnp.inf))
    return total / count + config.z_loss * z, {
        "loss": total / count, "z_loss": config.z_loss * z, "out_max_logit": real_max,
        "out_log_z": jnp.sum(w_BT * log_z_BT) / count}

  (_, want), grads = jax.value_and_grad(direct, has_aux=True)(state["params"])
  want["grad_norm"] = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads)))
  task = tasks.task_class(config).without_data(config)
  step = steps.make_train_step(graphdef, task, config, shardings, ts.batch_sharding(mesh))
  _, metrics = step(state, batch)
  return jax.device_get(metrics), jax.device_get(want)


def test_z_loss_adds_coef_times_the_mean_squared_log_z():
  batch = _batch()
  metrics, want = _first_step(_config(z_loss=COEF), batch)
  for key in ("loss", "z_loss", "out_max_logit", "out_log_z", "grad_norm"):
    np.testing.assert_allclose(metrics[key], want[key], rtol=2e-5, err_msg=key)
  # The logged loss is the cross-entropy, whatever the coefficient; the gradient is not.
  off, _ = _first_step(_config(z_loss=0.0), batch)
  assert "z_loss" not in off
  np.testing.assert_allclose(off["loss"], metrics["loss"], rtol=1e-6)
  np.testing.assert_allclose(off["out_log_z"], metrics["out_log_z"], rtol=1e-6)
  assert abs(off["grad_norm"] - metrics["grad_norm"]) > 1e-3 * off["grad_norm"]


@pytest.mark.parametrize("value", [-1e-4, float("nan"), float("inf")])
def test_bad_z_loss_is_one_line(value):
  with pytest.raises(ValueError, match=r"^config.z_loss must be a finite number >= 0 "
                                       r"\(PaLM: 1e-4; 0 = off\), got"):
    configlib.validate(_config(z_loss=value), num_devices=1)


@pytest.mark.parametrize("value", [-1])
def test_bad_sink_metrics_rows_is_one_line(value):
  config = _config()
  config.sink_metrics_rows = value
  with pytest.raises(ValueError, match=r"^config.sink_metrics_rows must be an integer >= 0"):
    configlib.validate(config, num_devices=1)


def test_z_loss_is_a_traced_switch_of_a_pack():
  """Runs with other coefficients share a pack; z-loss on in one and off in another
  do not (the branch is the program), as qk_clip."""
  a, b, off = _config(z_loss=1e-4), _config(z_loss=1e-3), _config(z_loss=0.0)
  packing.check_packable([a, b])
  assert packing.pack_key(a) == packing.pack_key(b) != packing.pack_key(off)
  with pytest.raises(ValueError, match="config.z_loss must be on"):
    packing.check_packable([a, off])


def test_run_label_names_z_loss():
  assert labels.run_label(_config(z_loss=1e-4)) == "standard+z_loss0.0001"
  assert labels.run_label(_config()) == "standard"


def test_tiny_run_logs_z_loss_and_output_logits(tmp_path_factory):
  """Every log row holds the term and the output logits' health; at coefficient 1 the
  term is mean (log Z)^2, about the mean log Z squared (log Z varies little here)."""
  overrides = {"num_train_steps": 6, "log_every": 2, "eval_every": 6,
               "checkpoint_every": 6, "z_loss": 1.0}
  run = testing.train_tiny_run(tmp_path_factory, overrides=overrides, name="z_loss")
  rows = [r for r in metrics_writer.read_rows(run.workdir) if metric_keys.LOSS in r]
  assert [r["step"] for r in rows] == [2, 4, 6]
  for row in rows:
    for key in (metric_keys.Z_LOSS, metric_keys.OUT_MAX_LOGIT, metric_keys.OUT_LOG_Z):
      assert np.isfinite(row[key]), key
    assert row[metric_keys.Z_LOSS] == pytest.approx(row[metric_keys.OUT_LOG_Z] ** 2, rel=0.2)
