"""The probes study (attnscale/studies/probes.py) on a synthetic probes_trigger sweep:
run directories as train.py and eval.py leave them (testing.fake_run plus an
eval.json split by trigger rows), no training."""

import csv
import json
import os

import pytest

from attnscale import testing
from attnscale.studies import __main__ as cli
from attnscale.studies import probes
from configs import probes as probes_config
from configs import probes_sweeps

STEPS = probes_config.get_config("preset=trigger_test").num_train_steps
BEST = 7
NOISE = (0.0, 0.01, -0.01)  # training loss by seed, shared by every label
# label -> (sink head's no-trigger first-key weight, its row mass, trigger accuracy)
EFFECTS = {"softmax": (0.95, 1.0, 0.97), "sink_learned": (0.99, 1.0, 0.97),
           # ReLU/L: a large absolute weight in a row of much larger mass: no sink
           "relu": (10.0, 100.0, 0.90), "gate_elementwise": (0.15, 1.0, 0.97)}


def _run(root, label, e, seed):
  scaling, overrides = probes_sweeps.SINK_LABELS[label]
  sink, mass, accuracy = EFFECTS[label]
  loss = 0.1 + 0.01 * (e - BEST) ** 2 + NOISE[seed]
  run = testing.fake_run(
      root, f"{label}-{e}-{seed}", f"preset=trigger_test,scaling={scaling},seed={seed}",
      {"learning_rate": 2.0**-e, **overrides, "label": label},
      [{"step": STEPS, "train/loss": loss, "train/loss_last20": loss}],
      config_module=probes_config)
  jitter = 0.01 * seed
  heads = {"sink_rate_no_trigger": [sink + jitter, 0.01], "row_mass_no_trigger": [mass, 1.0],
           "sink_rate_trigger": [0.002, 0.01], "row_mass_trigger": [mass, 1.0],
           "top_key_weight_no_trigger": [sink + jitter, 0.2], "first_value_ratio": [0.1, 1.0]}
  layer = {"heads": heads, "act_ratio": 5.0, "uniform_sink_rate_no_trigger": 0.06}
  with open(os.path.join(run, "eval.json"), "w") as f:
    json.dump({"step": STEPS, "val_loss": loss + 0.01, "accuracy_trigger": accuracy - jitter,
               "accuracy_no_trigger": 1.0, "attention": [layer, layer]}, f)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
  root = tmp_path_factory.mktemp("probes")
  for label in EFFECTS:
    for e in (BEST - 1, BEST, BEST + 1):
      _run(root, label, e, 0)
    for seed in (1, 2):
      _run(root, label, BEST, seed)
  out = root / "out"
  cli.main(["probes", "--out", str(out), "--workdirs", str(root)])
  return root, out


def _csv(path):
  with open(path) as f:
    return {r["label"]: r for r in csv.DictReader(f)}


def test_labels_and_order_are_the_sweeps(study):
  _, out = study
  table = _csv(out / "probes_trigger.csv")
  assert probes.labels() == tuple(probes_sweeps.SINK_LABELS)
  assert list(table) == [k for k in probes_sweeps.SINK_LABELS if k in EFFECTS]
  assert (out / "probes_trigger.png").stat().st_size > 0


def test_the_sink_is_a_share_of_the_row_and_read_by_its_interval(study):
  _, out = study
  table = _csv(out / "probes_trigger.csv")
  softmax, relu, gate = table["softmax"], table["relu"], table["gate_elementwise"]
  assert softmax["best_lr"] == str(2.0**-BEST) and softmax["seeds"] == "3"
  assert softmax["sink"] == "0.960 [0.935, 0.985]" and softmax["sink_forms"] == "forms"
  # 10 of a row mass of 100 (+ 0.01 a seed): a share of 0.1, below the threshold.
  assert relu["sink"].startswith("0.100 ") and relu["sink_forms"] == "absent"
  assert gate["sink_forms"] == "absent"
  # The trigger rows of the same head, as a share of their own mass.
  assert float(relu["sink_trigger"]) == pytest.approx(0.002 / 100)
  assert float(softmax["value_ratio"]) == pytest.approx(0.1)


def test_comparisons_are_paired_robust_and_family_wise(study):
  _, out = study
  table = _csv(out / "probes_trigger.csv")
  relu = table["relu"]
  # Paired by seed: the shared noise cancels, the difference is exact.
  assert relu["accuracy_trigger_vs_softmax"] == "-7.000 [-7.000, -7.000] paired n=3: worse"
  assert relu["sink_vs_softmax"].endswith("paired n=3: better")
  assert relu["sink_robust"] == "better"  # each tie set is the best rate alone
  assert relu["sink_holm"].endswith("better")
  assert table["softmax"]["sink_vs_softmax"] == "reference"


def test_the_published_expectations_come_first(study):
  _, out = study
  rows = list(csv.DictReader(open(out / "probes_expectations.csv")))
  assert [(r["label"], r["measured"], r["reproduces"]) for r in rows] == [
      ("softmax", "forms", "yes"), ("relu", "absent", "yes")]


def test_one_store_or_folder_is_asked_for(tmp_path):
  with pytest.raises(SystemExit, match="probes: give --workdirs STORE_OR_DIR"):
    cli.main(["probes", "--out", str(tmp_path), "--workdirs", str(tmp_path), str(tmp_path)])
