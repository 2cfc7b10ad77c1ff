"""The staged learning-rate search (attnscale/experiments/lr_search.py) on synthetic
losses: no training, milliseconds."""

import math

import pytest

from attnscale.experiments import lr_search
from attnscale.experiments.lr_search import Trial


def run_to_end(starts, loss_of_exponent, **kwargs):
  """Drives the search as sweep.py does: run what it asks for, ask again, until
  the list stops growing. Returns the final trials and every intermediate list."""
  finished: dict[Trial, float] = {}
  history = []
  while True:
    trials = lr_search.search(starts, lambda t: finished.get(t), **kwargs)
    history.append(trials)
    new = [t for t in trials if t not in finished]
    if not new:
      return trials, history
    for t in new:  # each finished run's loss depends on its rate (and a little on its seed)
      finished[t] = loss_of_exponent(t.exponent) + 0.001 * t.seed


def exponents(trials, label="a", seed=0):
  return [t.exponent for t in trials if t.label == label and t.seed == seed]


def test_first_call_asks_for_three_rates_around_each_start():
  trials = lr_search.search({"a": 9, "b": 5}, lambda t: None)
  assert trials == [Trial("a", 8), Trial("a", 9), Trial("a", 10),
                    Trial("b", 4), Trial("b", 5), Trial("b", 6)]
  assert trials[0].learning_rate == 2.0**-8 and trials[0].seed == 0


def test_best_at_an_edge_walks_one_rate_at_a_time_until_bracketed_then_adds_seeds():
  # The best rate is 2^-6, three steps above the start 2^-9.
  trials, _ = run_to_end({"a": 9}, lambda e: 1.0 + (e - 6) ** 2, more_seeds=(1, 2))
  assert exponents(trials) == [8, 9, 10, 7, 6, 5]  # 2^-5 is worse: bracketed at 2^-6
  assert trials[-2:] == [Trial("a", 6, 1), Trial("a", 6, 2)]


def test_best_inside_the_first_three_needs_nothing_more():
  trials, history = run_to_end({"a": 9}, lambda e: abs(e - 9.2), more_seeds=(1,))
  assert exponents(trials) == [8, 9, 10]
  assert trials[-1] == Trial("a", 9, 1)
  assert len(history) == 3  # stage 1, stage 2, nothing new


def test_all_diverged_tries_smaller_rates():
  # NaN (diverged) above 2^-10; the best finite is 2^-11.
  loss = lambda e: math.nan if e < 10 else 1.0 + (e - 11) ** 2
  trials, _ = run_to_end({"a": 5}, loss, bounds=(3, 12), more_seeds=(1,))
  assert exponents(trials) == [4, 5, 6, 7, 8, 9, 10, 11, 12]
  assert trials[-1] == Trial("a", 11, 1)


def test_the_search_stays_within_its_bounds():
  # Smaller is always better: the search stops at the bound 2^-12, seeds there.
  trials, _ = run_to_end({"a": 11}, lambda e: -e, bounds=(3, 12), more_seeds=(1,))
  assert exponents(trials) == [10, 11, 12] and trials[-1] == Trial("a", 12, 1)
  # Larger is always better: stops at 2^-3.
  trials, _ = run_to_end({"a": 5}, lambda e: e, bounds=(3, 12), more_seeds=(1,))
  assert exponents(trials) == [4, 5, 6, 3] and trials[-1] == Trial("a", 3, 1)
  # Every rate within the bounds diverges: no seeds, nothing to report.
  trials, _ = run_to_end({"a": 10}, lambda e: math.nan, bounds=(3, 12), more_seeds=(1,))
  assert exponents(trials) == [9, 10, 11, 12] and all(t.seed == 0 for t in trials)


def test_a_tie_goes_to_the_smaller_rate():
  assert lr_search.best_exponent({8: 2.0, 9: 1.5, 10: 1.5}) == 10
  assert lr_search.best_exponent({8: math.nan, 9: math.nan}) is None


def test_a_label_waits_for_its_runs_while_the_others_go_on():
  # a's 2^-9 has not finished; b's three have, best at the edge 2^-4.
  done = {Trial("a", 8): 2.0, Trial("a", 10): 2.1,
          Trial("b", 4): 1.0, Trial("b", 5): 1.1, Trial("b", 6): 1.2}
  trials = lr_search.search({"a": 9, "b": 5}, done.get, more_seeds=(1,))
  assert exponents(trials, "a") == [8, 9, 10]
  assert exponents(trials, "b") == [4, 5, 6, 3]
  assert all(t.seed == 0 for t in trials)  # no label is bracketed yet


def test_stage_two_comes_after_every_labels_stage_one_and_the_list_only_grows():
  loss = {"a": lambda e: abs(e - 6.2), "b": lambda e: abs(e - 9.1)}
  finished = {}
  history = []
  while True:
    trials = lr_search.search({"a": 9, "b": 9}, finished.get, more_seeds=(1, 2))
    history.append(trials)
    new = [t for t in trials if t not in finished]
    if not new:
      break
    for t in new[:1]:  # one run finishes at a time
      finished[t] = loss[t.label](t.exponent)
  for before, after in zip(history, history[1:]):
    assert set(before) <= set(after)
  seeds = [t for t in trials if t.seed]
  assert seeds == [Trial("a", 6, 1), Trial("a", 6, 2), Trial("b", 9, 1), Trial("b", 9, 2)]
  assert trials[-len(seeds):] == seeds


def test_points_are_sweep_points_of_the_labels_scalings_and_overrides():
  labels = {"standard": ("standard", {}), "sink_zero": ("standard", {"model.sink": "zero"})}
  points = lr_search.points("test", labels, {"standard": 7, "sink_zero": 7}, None)
  # Each point carries its label (the run's config.label), apart from the overrides
  # that name its directory.
  assert points[0] == {"arg": "preset=test,scaling=standard,seed=0",
                       "overrides": {"learning_rate": 2.0**-6}, "label": "standard"}
  assert points[3] == {"arg": "preset=test,scaling=standard,seed=0",
                       "overrides": {"learning_rate": 2.0**-6, "model.sink": "zero"},
                       "label": "sink_zero"}
  assert len(points) == 6


def test_a_search_per_width_declares_the_label_and_the_width_is_a_field():
  """axis_search runs one search per (label, width), "sp@32", and its runs declare
  "sp" (config.label), their width in model.width: what the transfer study reads."""
  from attnscale.experiments import sweep_builders, sweeps
  sweep = sweep_builders.axis_search("test", {"sp": ("standard", {})}, "model.width",
                                     (16, 32), {"sp": 7}, bounds=(3, 12))
  points = sweep.points(None)
  assert {p["label"] for p in points} == {"sp"}
  assert sorted({p["overrides"]["model.width"] for p in points}) == [16, 32]
  listed = sweep_builders.listed("test", [("standard", {"model.width": 64}, (0, 1), "sp"),
                                          ("standard", {}, (0,))])
  assert [p.get("label") for p in listed.points(None)] == ["sp", "sp", None]
  assert [sweeps.Point(p["arg"], tuple(p["overrides"].items()), (), p.get("label", ""))
          .name for p in points[:1]] == ["test-standard-0-lr0.015625-width16"]


@pytest.mark.parametrize("start", [4, 8, 11])
def test_any_start_finds_the_same_best(start):
  trials, _ = run_to_end({"a": start}, lambda e: (e - 7.4) ** 2, more_seeds=(1,))
  assert trials[-1] == Trial("a", 7, 1)


def test_transfer_runs_targets_at_the_sources_best():
  """Width study: once the small model's best is bracketed, the big one also
  runs at that rate (seed 0) even though its own search never goes there."""
  loss = {"small": lambda e: abs(e - 7.1), "big": lambda e: abs(e - 11.1)}
  finished = {}
  while True:
    trials = lr_search.search({"small": 7, "big": 11}, finished.get,
                              more_seeds=(1,), transfer={"small": ["big"]})
    new = [t for t in trials if t not in finished]
    if not new:
      break
    finished |= {t: loss[t.label](t.exponent) for t in new}
  assert exponents(trials, "big") == [10, 11, 12, 7]
  assert trials[-1] == Trial("big", 7, 0)
  # A rate the target's own search tried is not run twice.
  again = lr_search.search({"small": 7, "big": 7}, lambda t: 1.0, transfer={"small": ["big"]})
  assert len(again) == len(set(again))


def test_protocol_runs_three_seeds_at_every_near_best_rate_and_picks_on_the_mean():
  # Seed noise of +-0.03 around a parabola with its minimum between 2^-9 and 2^-10:
  # 2^-10 wins on seed 0 alone (by 0.01), 2^-9 on the mean of three seeds.
  offsets = {(9, 0): 0.01, (9, 1): -0.03, (9, 2): -0.03, (10, 0): 0.0, (10, 1): 0.0,
             (10, 2): 0.0}
  finished: dict[Trial, float] = {}
  while True:
    trials = lr_search.search({"a": 9}, lambda t: finished.get(t), more_seeds=(),
                              band_seeds=(1, 2))
    new = [t for t in trials if t not in finished]
    if not new:
      break
    for t in new:
      finished[t] = 1.0 + 0.02 * abs(t.exponent - 9.6) ** 2 + offsets.get((t.exponent, t.seed),
                                                                       0.01 * t.seed)
  rates = {}
  for t in trials:
    rates.setdefault(t.exponent, set()).add(t.seed)
  # Seed 0: 2^-10 best, 2^-9 0.014 behind (inside the 0.02-nat band), 2^-8 and 2^-11
  # 0.048 and 0.036 behind (outside); on three seeds 2^-10 is not measurably worse.
  assert rates[9] == rates[10] == {0, 1, 2}
  assert rates[8] == {0} and rates[11] == {0}
  means = {e: sum(finished[Trial("a", e, s)] for s in seeds) / len(seeds)
           for e, seeds in rates.items()}
  assert min(means, key=means.get) == 9
  assert lr_search.best_exponent({e: finished[Trial("a", e, 0)] for e in rates}) == 10


def test_protocol_treats_a_rate_with_one_diverged_seed_as_diverged():
  loss = lambda t: math.nan if (t.exponent == 6 and t.seed == 2) else 1.0 + 0.01 * abs(t.exponent - 6)
  finished: dict[Trial, float] = {}
  while True:
    trials = lr_search.search({"a": 7}, lambda t: finished.get(t), more_seeds=(),
                              band_seeds=(1, 2), bounds=(3, 12))
    new = [t for t in trials if t not in finished]
    if not new:
      break
    finished.update({t: loss(t) for t in new})
  seeds_at = lambda e: {t.seed for t in trials if t.exponent == e}
  assert seeds_at(6) == {0, 1, 2}  # in the band on seed 0, then a seed diverged
  assert seeds_at(7) == {0, 1, 2}  # the best on the mean once 2^-6 is out


def test_a_run_that_learned_nothing_counts_as_diverged():
  # Every rate from 2^-7 up ends at the "unigram" (5.0 plus noise); below, a
  # real optimum at 2^-9. Without `no_learning` the noise among the failures
  # picks a best inside the rates tried and the search stops there.
  def loss(e):
    return {4: 5.01, 5: 5.00, 6: 5.02, 7: 5.01}.get(e, 1.0 + (e - 9) ** 2 / 10)
  stuck, _ = run_to_end({"a": 5}, loss, more_seeds=(1,))
  assert exponents(stuck) == [4, 5, 6] and exponents(stuck, seed=1) == [5]  # a failure, seeded
  found, _ = run_to_end({"a": 5}, loss, more_seeds=(1,), no_learning=4.0)
  assert exponents(found) == [4, 5, 6, 7, 8, 9, 10] and exponents(found, seed=1) == [9]
  # Only finished runs are judged: an unfinished one still makes the label wait.
  assert lr_search.search({"a": 5}, lambda t: None, no_learning=4.0) == [
      Trial("a", 4), Trial("a", 5), Trial("a", 6)]


def test_window_runs_seed_0_around_the_settled_best_without_moving_it():
  """window=2: once the best (2^-6) is bracketed, seed 0 also runs 2^-4 and 2^-8,
  the rates within two octaves that the search skipped; bounds still hold, and a
  window rate better than the best (a second valley) does not move it."""
  loss = lambda e: 1.0 + (e - 6) ** 2 if e != 4 else 0.5
  trials, _ = run_to_end({"a": 6}, loss, more_seeds=(1,), window=2, bounds=(3, 12))
  assert exponents(trials) == [5, 6, 7, 4, 8]
  assert Trial("a", 6, 1) in trials and Trial("a", 4, 1) not in trials  # best stays 2^-6
  bounded, _ = run_to_end({"a": 6}, lambda e: abs(e - 6.1), more_seeds=(), window=2,
                          bounds=(5, 12))
  assert exponents(bounded) == [5, 6, 7, 8]  # 2^-4 is outside the bounds
  none, _ = run_to_end({"a": 6}, lambda e: abs(e - 6.1), more_seeds=())
  assert exponents(none) == [5, 6, 7]


def test_window_seeds_run_every_window_rate_once():
  """window_seeds: seeds 1 and 2 at each of the five window rates, the band's own
  included once (its seeds came with the protocol), the seed-0 trials unchanged."""
  loss = lambda e: 1.0 + 0.1 * (e - 6) ** 2  # noqa: E731
  plain, _ = run_to_end({"a": 6}, loss, more_seeds=(), band_seeds=(1, 2), window=2)
  seeded, _ = run_to_end({"a": 6}, loss, more_seeds=(), band_seeds=(1, 2), window=2,
                         window_seeds=(1, 2))
  assert seeded[:len(plain)] == plain  # the same search, then the new seeds
  assert len(seeded) == len(set(seeded))
  for seed in (0, 1, 2):
    assert sorted(exponents(seeded, seed=seed)) == [4, 5, 6, 7, 8]


def _drive(starts, loss, **kwargs):
  """run_to_end with a loss of the whole trial (rate and seed); checks that every
  list holds the one before it (the sweep's list of points only grows)."""
  finished, before = {}, set()
  while True:
    trials = lr_search.search(starts, finished.get, **kwargs)
    assert before <= set(trials) and len(trials) == len(set(trials))
    before = set(trials)
    new = [t for t in trials if t not in finished]
    if not new:
      return trials, finished
    finished |= {t: loss(t) for t in new}


def test_protocol_seeds_a_window_rate_that_lands_in_the_band():
  """A second valley at 2^-4 (seed 0 within the band's 0.02 nats of the best's mean)
  is in a study's band, which reads every rate: seeds 1 and 2 run there too. 2^-8,
  0.4 worse, gets none, and the search's best stays 2^-6."""
  loss = lambda t: (1.005 if t.exponent == 4 else 1.0 + 0.1 * (t.exponent - 6) ** 2) + (
      0.001 * t.seed)
  trials, _ = _drive({"a": 6}, loss, more_seeds=(), band_seeds=(1, 2), window=2)
  assert sorted(exponents(trials)) == [4, 5, 6, 7, 8]
  for seed in (1, 2):
    assert sorted(exponents(trials, seed=seed)) == [4, 6]
  # Without the protocol no seeds are added: `more_seeds` alone.
  plain, _ = _drive({"a": 6}, loss, more_seeds=(1,), window=2)
  assert exponents(plain, seed=1) == [6] and not exponents(plain, seed=2)


def test_protocol_seeds_a_transfer_rate_that_lands_in_the_band_and_keeps_them():
  """A flat target: the source's best (2^-7) costs it 0.004 on seed 0, inside its band,
  so seeds 1 and 2 run there; once they show it worse they stay in the list."""
  loss = {"small": lambda t: abs(t.exponent - 7.1),
          "big": lambda t: 1.0 + 0.001 * abs(t.exponent - 11) + (
              0.3 if (t.exponent, t.seed) in ((7, 1), (7, 2)) else 0.0)}
  trials, finished = _drive({"small": 7, "big": 11}, lambda t: loss[t.label](t),
                            more_seeds=(), band_seeds=(1, 2), transfer={"small": ["big"]})
  assert {t.seed for t in trials if t.label == "big" and t.exponent == 7} == {0, 1, 2}
  assert lr_search.search({"small": 7, "big": 11}, finished.get, more_seeds=(),
                          band_seeds=(1, 2), transfer={"small": ["big"]}) == trials
  # The target's own best is unmoved: its search reads only its own rates.
  assert sorted(exponents(trials, "big", seed=1)) == [7, 10, 11, 12]


def test_length_search_chooses_each_laws_gamma_on_the_held_out_length(tmp_path):
  """sweep_builders.length_search: stage 1 is every gamma at seed 0 (and the
  baselines at every seed); a law's other seeds come once its gammas are all
  finished, at the gamma with the lowest seed-0 loss at `choose_at` (a diverged
  run counts as worst)."""
  import json

  from attnscale.experiments import sweep_builders, sweeps

  sweep = sweep_builders.length_search(
      "test", ("standard",), ("log_n_power,p=1", "n_power,a=0.1"), (0.5, 1, 2), ("rope",),
      "--lengths=32,64,128", (0, 1, 2), learning_rate=0.01, choose_at=64)

  def names(points):
    return [sweeps.Point(p["arg"], tuple(sorted(p["overrides"].items()))).name for p in points]

  first = sweep.points(None)
  assert len(first) == 1 + 2 * 3 + 2  # seed 0: baseline + 2 laws x 3 gammas; baseline seeds 1, 2
  assert sweep.points(str(tmp_path)) == first  # nothing finished: nothing more
  assert all(p["eval"] == ["--lengths=32,64,128", "--length=100"] for p in first)

  def finish(point, loss=None, diverged=False):
    run_dir = tmp_path / names([point])[0]
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"num_train_steps": 10}))
    if diverged:
      (run_dir / "metrics.jsonl").write_text('{"step": 3, "train/loss": NaN}\n')
      return
    (run_dir / "eval.json").write_text(json.dumps(
        {"step": 10, "lengths": {"64": {"val_loss": loss}}}))

  # log_n_power: gamma 2 best at 64; n_power: gamma 0.5 diverged, gamma 1 best.
  losses = {"log_n_power,p=1": (3.0, 2.5, 2.0), "n_power,a=0.1": (None, 1.5, 1.7)}
  for p in first:
    scaling = p["arg"].split("scaling=")[1].rsplit(",seed=", 1)[0]
    law, _, gamma = scaling.rpartition(",gamma=")
    if law in losses and p["arg"].endswith("seed=0"):
      loss = losses[law][(0.5, 1.0, 2.0).index(float(gamma))]
      finish(p, loss, diverged=loss is None)
  more = sweep.points(str(tmp_path))[len(first):]
  assert [p["arg"] for p in more] == [
      "preset=test,scaling=log_n_power,p=1,gamma=2,seed=1",
      "preset=test,scaling=log_n_power,p=1,gamma=2,seed=2",
      "preset=test,scaling=n_power,a=0.1,gamma=1,seed=1",
      "preset=test,scaling=n_power,a=0.1,gamma=1,seed=2"]
