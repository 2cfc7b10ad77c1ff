"""The coordinate check (attnscale/studies/coord_check.py): after 3 steps the output
logits' and attention outputs' scale is flat in width (32 -> 512) under mup and
grows under sp; the residual stream's is flat in depth (1 -> 8) under CompleteP
and grows under sp; its table and bad arguments.

Needs $ATTNSCALE_DATA (CI sets it).
"""

import pytest

from attnscale.experiments import reporting
from attnscale.studies import coord_check
from configs import shakespeare_char


def make_config(tfds_dir, arg, **overrides):
  config = shakespeare_char.get_config(arg)
  config.data_dir = tfds_dir
  config.update_from_flattened_dict(overrides)
  return config


@pytest.mark.slow
def test_coord_check_flat_under_mup_grows_under_sp(tfds_dir, tmp_path):
  config = make_config(tfds_dir, "preset=graphcore_cpu", **{
      "model.num_layers": 1, "seq_len": 8, "batch_size": 2})
  r = coord_check.coord_check(config, (32, 512), steps=3)
  for kind in ("logits", "attn_out"):
    assert 0.5 < r.growth("mup", kind) < 2, (kind, r.growth("mup", kind))
    assert r.growth("sp", kind) > 2, (kind, r.growth("sp", kind))
  rows = r.rows()
  assert {row["parameterization"] for row in rows} == {"sp", "mup"}
  assert len(rows) == 2 * len(r.quantities()) * 4  # steps 0..3
  reporting.save_figure(coord_check.plot_coord_check(r), str(tmp_path), "coord_check")
  reporting.write_tables(rows, str(tmp_path), "coord_check", title="t")
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "coord_check.csv", "coord_check.md", "coord_check.png"]


@pytest.mark.slow
def test_depth_check_flat_under_complete_p_grows_under_sp(tfds_dir):
  config = make_config(tfds_dir, "preset=graphcore_cpu", **{"seq_len": 8, "batch_size": 2})
  r = coord_check.coord_check(config, (1, 8), steps=3, parameterizations=("sp", "complete_p"),
                              axis="depth")
  assert 0.5 < r.growth("complete_p", "residual") < 2, r.growth("complete_p", "residual")
  assert r.growth("sp", "residual") > 2, r.growth("sp", "residual")
  assert r.quantities() == list(coord_check.KINDS)  # per-layer kinds: the mean over layers
  assert set(r.rows()[0]) == {"parameterization", "quantity", "step", "L1", "L8", "growth"}


def test_coord_check_bad_widths_fail_in_one_line():
  with pytest.raises(ValueError, match="--widths"):
    coord_check.parse_widths("32")
