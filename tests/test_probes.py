"""The synthetic probe tasks (trigger, mqar, max_retrieval): a hand-built solution
scores accuracy 1, the generator is deterministic and the same for every label at a
seed, no answer leaks into the input, the causal model cannot see the answer, the
length evaluation grows (and fixes) MQAR's pairs, one-line errors, and a tiny run
trained and evaluated end to end with the sink measures on the trigger rows."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnscale import models, tasks
from attnscale.config import schema
from attnscale.runtime import configlib, train_lib
from attnscale.tasks import mqar, synthetic, trigger
from configs import probes

TASK_NAMES = probes.TASKS


def config(task, size="test", **overrides):
  c = probes.get_config(f"preset={task}_{size}")
  c.update_from_flattened_dict(overrides)
  return c


def oracle_metrics(task, batch):
  """eval_metrics of a model that outputs the hand-built solution."""
  solution_BT = task.solve(batch["inputs"], task.probe)
  logits_BTV = 30.0 * jax.nn.one_hot(solution_BT, task.config.model.vocab_size)
  _, sums = task.loss(lambda inputs, **kw: logits_BTV, batch)
  return task.eval_metrics({k: float(v) for k, v in sums.items()})


@pytest.mark.usefixtures("strict_rank_promotion")
@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("size", ("test", "cpu"))
def test_the_hand_built_solution_scores_one(name, size):
  task = tasks.get_task(config(name, size))
  for batch in [task.train_batch(3), next(iter(task.eval_batches()))]:
    m = oracle_metrics(task, batch)
    assert m["val_targets"] > 0
    for key in ("accuracy", "sequence_accuracy", "last_accuracy"):
      assert m[key] == 1.0, (key, m)
    assert m["val_loss"] < 1e-6
    w = batch["weights"] > 0
    np.testing.assert_array_equal(task.solve(batch["inputs"], task.probe)[w],
                                  batch["targets"][w])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_a_wrong_answer_scores_below_one(name):
  task = tasks.get_task(config(name, "cpu"))
  batch = task.train_batch(0)
  wrong = dict(batch, targets=(batch["targets"] + 1) % task.config.model.vocab_size)
  solution_BT = task.solve(batch["inputs"], task.probe)
  logits = 30.0 * jax.nn.one_hot(solution_BT, task.config.model.vocab_size)
  _, sums = task.loss(lambda inputs, **kw: logits, wrong)
  assert task.eval_metrics({k: float(v) for k, v in sums.items()})["accuracy"] == 0.0


@pytest.mark.parametrize("name", TASK_NAMES)
def test_the_generator_is_deterministic_and_the_same_for_every_label(name):
  a = tasks.get_task(config(name, "cpu"))
  # Another label at the same seed: other model fields, other learning rate.
  b = tasks.get_task(config(name, "cpu", **{"model.normalizer": "relu", "learning_rate": 0.1,
                                            "model.sink": "none", "model.num_layers": 3}))
  for step in (0, 7):
    for key, value in a.train_batch(step).items():
      np.testing.assert_array_equal(value, b.train_batch(step)[key])
  assert not np.array_equal(a.train_batch(0)["inputs"], a.train_batch(1)["inputs"])
  other_seed = tasks.get_task(config(name, "cpu", seed=1))
  assert not np.array_equal(a.train_batch(0)["inputs"], other_seed.train_batch(0)["inputs"])
  # The evaluation rows do not depend on the run's seed, and differ from training's.
  for x, y in zip(a.eval_batches(), other_seed.eval_batches()):
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
  assert not np.array_equal(next(iter(a.eval_batches()))["inputs"], a.train_batch(0)["inputs"])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_no_answer_leaks_into_the_input(name):
  """Each target is a function of the inputs at 0 .. t only: changing the inputs
  after t changes no target up to t; and the answer is never the input token at
  its own position where the task does not make it so (trigger, mqar: the trigger
  or the repeated key stands there)."""
  task = tasks.get_task(config(name, "cpu"))
  batch = task.train_batch(2)
  inputs_BT = batch["inputs"]
  rng = np.random.default_rng(0)
  for t in (3, 17, inputs_BT.shape[1] // 2):
    changed_BT = inputs_BT.copy()
    changed_BT[:, t + 1:] = rng.integers(0, task.config.model.vocab_size,
                                         changed_BT[:, t + 1:].shape)
    np.testing.assert_array_equal(task.solve(changed_BT, task.probe)[:, :t + 1],
                                  task.solve(inputs_BT, task.probe)[:, :t + 1])
  if name != "max_retrieval":  # there the current item may be the max: its label is the answer
    w = batch["weights"] > 0
    assert not np.any(inputs_BT[w] == batch["targets"][w])
  if name == "trigger":  # NULL is never an input; the answers are value tokens
    assert not np.any(inputs_BT == trigger.NULL)
    at_trigger = inputs_BT == trigger.TRIGGER
    assert at_trigger.any() and np.all(batch["targets"][at_trigger] >= trigger.FIRST_VALUE)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_the_causal_model_cannot_see_the_answer(name):
  """The logits at t of a causal model are the same whatever comes after t (the next
  targets included): what the model predicts at a scored position is computed from
  what is before it."""
  c = config(name, "test")
  task = tasks.get_task(c)
  model = models.build(schema.model_config(c), rngs=nnx.Rngs(params=0))
  inputs_BT = jnp.asarray(task.train_batch(0)["inputs"])
  t = inputs_BT.shape[1] // 2
  other_BT = inputs_BT.at[:, t + 1:].set((inputs_BT[:, t + 1:] + 1) % c.model.vocab_size)
  np.testing.assert_array_equal(model(inputs_BT)[:, :t + 1], model(other_BT)[:, :t + 1])


def test_mqar_follows_zoologys_layout():
  task = tasks.get_task(config("mqar", "cpu"))
  args = task.probe
  batch = task.train_batch(0)
  N, V = args.num_pairs, args.vocab_size
  for row, target, w in zip(batch["inputs"], batch["targets"], batch["weights"]):
    keys, values = row[0:2 * N:2], row[1:2 * N:2]
    assert len(set(keys)) == N and np.all((keys >= 1) & (keys < V // 2))
    assert len(set(values)) == N and np.all(values >= V // 2)
    queries = np.flatnonzero(w)
    assert len(queries) == N and np.all(queries >= 2 * N) and np.all((queries - 2 * N) % 2 == 0)
    assert sorted(row[queries]) == sorted(keys)  # each key queried once
    assert set(target[queries]) == set(values)


def test_mqar_lengths_grow_the_pairs_and_fix_them():
  args = mqar.MQARArgs(vocab_size=256, num_pairs=8)
  variants = mqar.MQARTask.args_at_length(args, 256, 64)
  assert variants[""].num_pairs == 32 and variants["pairs_fixed"].num_pairs == 8
  with pytest.raises(ValueError, match=r"mqar: 4 pairs need 4 x 4 <= the length"):
    mqar.MQARTask.check_args(dataclasses.replace(args, num_pairs=4), 14)
  with pytest.raises(ValueError, match="distinct keys need config.probe.vocab_size >= 266"):
    mqar.MQARTask.check_args(dataclasses.replace(args, num_pairs=132), 1024)


def test_trigger_targets_are_the_rounded_mean():
  # BOS, values 0 1 1 (mean 2/3 -> 1), trigger, value 3, trigger (mean 5/4 -> 1),
  # then values 0 0 (sum 5 over 6), trigger (5/6 -> 1), and 1 1 1 1 -> 9/10 -> 1.
  v = lambda x: trigger.FIRST_VALUE + x
  T = trigger.TRIGGER
  row = np.array([[trigger.BOS, v(0), v(1), v(1), T, v(3), T, v(0), v(2), T]])
  got = trigger.TriggerTask.solve(row, trigger.TriggerArgs())
  want = [trigger.NULL] * 4 + [v(1), trigger.NULL, v(1), trigger.NULL, trigger.NULL, v(1)]
  np.testing.assert_array_equal(got[0], want)
  # Half up: 1 and 2 -> 1.5 -> 2.
  row = np.array([[trigger.BOS, v(1), v(2), T]])
  assert trigger.TriggerTask.solve(row, trigger.TriggerArgs())[0, 3] == v(2)


def test_max_retrieval_targets_are_the_running_max():
  from attnscale.tasks import max_retrieval
  args = max_retrieval.MaxRetrievalArgs(num_priorities=10, num_labels=3)
  P = 10
  row = np.array([[4, P + 0, 7, P + 1, 2, P + 2, 9, P + 0, 8, P + 2]])
  got = max_retrieval.MaxRetrievalTask.solve(row, args)[0, 1::2]
  np.testing.assert_array_equal(got, [P + 0, P + 1, P + 1, P + 0, P + 0])


def test_one_line_errors():
  c = config("mqar")
  c.model.vocab_size = 65
  with pytest.raises(ValueError, match=re.escape(
      "model.vocab_size (65) must equal task 'mqar''s vocabulary (64): set "
      "--config.model.vocab_size=64")):
    configlib.validate(c)
  c = config("trigger")
  with c.unlocked():
    c.probe.num_pair = 3
  with pytest.raises(ValueError, match=r"config.probe.num_pair is not an argument of task "
                                       r"'trigger' \(one of \['concentration', "):
    configlib.validate(c)
  with pytest.raises(ValueError, match=r"config.probe.trigger_rate must be in \(0, 1\)"):
    configlib.validate(config("trigger", **{"probe.trigger_rate": 1.5}))
  with pytest.raises(ValueError, match="model.causal must be True for task 'mqar'"):
    configlib.validate(config("mqar", **{"model.causal": False, "model.positions": "rope"}))
  with pytest.raises(ValueError, match="max_retrieval: 80 items with distinct priorities"):
    configlib.validate(config("max_retrieval", **{"seq_len": 160, "model.block_size": 160}))


@pytest.mark.slow
def test_trained_and_evaluated_with_sinks_by_row_and_lengths(tmp_path):
  """The trigger task through train.py's library and eval.py: accuracy by row kind
  in eval.json, the sink measures on the trigger and no-trigger rows in eval.json
  and in the training log; MQAR's lengths with pairs grown and fixed."""
  from attnscale.evaluation import eval_lib
  c = config("trigger", num_train_steps=6, log_every=3)
  workdir = str(tmp_path / "trigger")
  train_lib.train_and_evaluate(c, workdir)
  result = eval_lib.evaluate_run(workdir, lengths=[8, 16])
  for key in ("accuracy", "accuracy_trigger", "accuracy_no_trigger", "sequence_accuracy"):
    assert 0 <= result[key] <= 1, key
  layer = result["attention"][0]
  for key in ("sink_rate_trigger", "sink_rate_no_trigger", "top_key_weight_no_trigger",
              "uniform_sink_rate_no_trigger", "first_value_ratio", "act_ratio"):
    assert np.isfinite(layer[key]), key
  assert len(layer["heads"]["sink_rate_no_trigger"]) == c.model.num_heads
  assert set(result["lengths"]) == {"8", "16"} and "accuracy" in result["lengths"]["8"]
  assert "first-key weight" in eval_lib.format_summary(result, c)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    logged = [json.loads(line) for line in f]
  assert any("train/attn/sink_rate_no_trigger/layer_1" in row for row in logged)
  assert any("train/attn/first_value_ratio/layer_0" in row for row in logged)

  c = config("mqar", num_train_steps=2)
  workdir = str(tmp_path / "mqar")
  train_lib.train_and_evaluate(c, workdir)
  by_length = eval_lib.evaluate_run(workdir, lengths=[16, 32])["lengths"]
  assert by_length["32"]["args"]["num_pairs"] == 4
  assert by_length["32"]["pairs_fixed"]["args"]["num_pairs"] == 2
  assert by_length["32"]["val_targets"] == 4 * c.probe.eval_examples
  with pytest.raises(ValueError, match=r"--lengths: 17: mqar rows must have an even length"):
    eval_lib.evaluate_run(workdir, lengths=[17])


def test_the_eval_rows_cover_eval_examples_once():
  task = tasks.get_task(config("trigger", **{"probe.eval_examples": 20}))
  rows = sum(int((b["weights"].sum(1) > 0).sum()) for b in task.eval_batches())
  assert rows == 20
  assert synthetic.EVAL_SEED != task.config.seed


@pytest.mark.usefixtures("strict_rank_promotion")  # the measures' broadcasting, as the rest's
def test_sink_measures_by_query_group_against_their_definitions():
  """A model whose first layer's weights are known: the per-group first-key weight
  is the mean over that group's rows of p_i0, the uniform yardstick the mean of
  1/(i+1), softmax's row mass 1; the training log's keys name each group."""
  from attnscale.core.attention import attention_weights
  from attnscale.evaluation import diagnostics
  from attnscale.runtime import loop
  c = config("trigger")
  task = tasks.get_task(c)
  model = models.build(schema.model_config(c), rngs=nnx.Rngs(params=1))
  batch = task.train_batch(5)
  groups = task.query_groups(batch)
  stats = diagnostics.task_attention_stats(model, task, batch)
  call = model.blocks[0].attention_call(model.embed_tokens(jnp.asarray(batch["inputs"])))
  _, p_BNTS = attention_weights(call.q_BTNH, call.k_BSKH, mask=None, **call.options())
  T = batch["inputs"].shape[1]
  for name, in_BT in groups.items():
    counted = np.asarray(in_BT) & (np.arange(T) > 0)[None, :]
    want = np.asarray(p_BNTS)[..., 0].transpose(1, 0, 2)[:, counted].mean(-1)
    np.testing.assert_allclose(stats[0]["heads"][f"sink_rate_{name}"], want, rtol=1e-5)
    uniform = np.broadcast_to(1.0 / (np.arange(T) + 1), counted.shape)[counted].mean()
    np.testing.assert_allclose(stats[0][f"uniform_sink_rate_{name}"], uniform, rtol=1e-5)
    np.testing.assert_allclose(stats[0][f"row_mass_{name}"], 1.0, rtol=1e-5)
  v_norm = np.linalg.norm(np.asarray(call.v_BSKH), axis=-1)  # [B, S, K]
  np.testing.assert_allclose(stats[0]["heads"]["first_value_norm"], v_norm[:, 0].mean(0),
                             rtol=1e-5)
  row = loop.layer_stats_row(stats)
  assert "train/attn/sink_rate_no_trigger/layer_1" in row
  assert "train/attn/row_mass_trigger/layer_0" in row


def test_the_probes_sweep_points_are_valid_configs():
  """Every point of the probes sweep (its first stage: every label at three rates)
  builds a config that passes train.py's checks; the labels are the declared ones."""
  from attnscale.experiments import sweeps
  from configs import probes_sweeps
  points = sweeps.load_sweep("configs/probes.py", "probes", None)
  presets = {p.arg.split(",")[0] for p in points}
  assert presets == {"preset=trigger_cpu", "preset=mqar_cpu", "preset=max_retrieval_cpu"}
  per_label = 3  # stage 1 of the staged search: 2^-(e-1), 2^-e, 2^-(e+1)
  assert len(points) == per_label * (len(probes_sweeps.SINK_LABELS)
                                     + 2 * len(probes_sweeps.LENGTH_LABELS))
  for p in points:
    c = probes.get_config(p.arg)
    c.update_from_flattened_dict(dict(p.overrides))
    configlib.validate(c)
  assert any("--lengths=64,128,256,512,1024" in p.eval_flags for p in points)
