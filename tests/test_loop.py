"""The one training loop (attnscale/runtime/loop.py) and what it stands on: the
config read once per start (attnscale/config/run.py), every metric key named once
(metric_keys.py).

Needs $ATTNSCALE_DATA (CI sets it).
"""

import pytest

from attnscale import testing
from attnscale.config import schema
from attnscale.runtime import metric_keys, metrics_writer, provenance


@pytest.fixture(scope="module")
def counted_run(tmp_path_factory):
  """A 2-step test-preset run, counting the ConfigDict -> ModelConfig conversions."""
  calls = []
  convert = schema.model_config

  def counting(config):
    calls.append(1)
    return convert(config)

  with pytest.MonkeyPatch.context() as m:
    m.setattr(schema, "model_config", counting)
    run = testing.train_tiny_run(tmp_path_factory, steps=2,
                                 overrides={"log_every": 1, "eval_every": 2})
  return run, len(calls)


def test_the_config_is_read_once_per_start(counted_run):
  run, conversions = counted_run
  assert run.metrics["step"] == 2
  assert conversions == 1, (
      "the train path converts config.model once (run_config.read) and passes the "
      "RunConfig down: a second conversion means a module rebuilt it")


def test_a_single_run_records_its_pack_size_and_slot(counted_run):
  run, _ = counted_run
  record = provenance.read(run.workdir)[-1]
  assert (record["pack_size"], record["slot"]) == (1, 0)


def test_the_metric_keys_are_the_recorded_strings(counted_run):
  # Committed records and tables use these strings: they never change.
  assert (metric_keys.LOSS, metric_keys.GRAD_NORM, metric_keys.LR, metric_keys.LOSS_LAST20,
          metric_keys.ELAPSED_S, metric_keys.STEPS_PER_S, metric_keys.TOKENS_PER_S,
          metric_keys.VAL_LOSS) == (
      "train/loss", "train/grad_norm", "train/lr", "train/loss_last20", "train/elapsed_s",
      "train/steps_per_s", "train/tokens_per_s", "val/loss")
  assert metric_keys.attention_key(metric_keys.MAX_LOGIT, 3) == "train/attn/max_logit/layer_3"
  assert metric_keys.CLIPPED_HEADS == "train/attn/clipped_heads"
  assert (metric_keys.OUT_MAX_LOGIT, metric_keys.OUT_LOG_Z, metric_keys.Z_LOSS) == (
      "train/out/max_logit", "train/out/log_z", "train/z_loss")
  assert [metric_keys.attention_key(p, 0) for p in metric_keys.PER_LAYER[4:]] == [
      f"train/attn/{name}/layer_0" for name in ("sink_rate", "sink_heads", "top_key_weight",
                                                "max_act", "act_ratio", "kurtosis",
                                                "first_value_ratio", "sink_rate_heads")]
  run, _ = counted_run
  rows = metrics_writer.read_rows(run.workdir)
  written = {k for row in rows for k in row if k != "step"}
  named = {v for k, v in vars(metric_keys).items() if k.isupper() and isinstance(v, str)}
  unnamed = {k for k in written if k not in named and not k.startswith(metric_keys.PER_LAYER)}
  assert not unnamed, f"keys written but not named in metric_keys: {sorted(unnamed)}"
  assert {metric_keys.LOSS, metric_keys.VAL_LOSS, metric_keys.LOSS_LAST20} <= written
  assert any(k.startswith(metric_keys.MAX_LOGIT) for k in written)  # the preset's attn_metrics
  assert any(k.startswith(metric_keys.SINK_RATE) for k in written)  # its sink_metrics_rows
  assert metric_keys.OUT_LOG_Z in written  # on every run
