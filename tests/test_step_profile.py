"""benchmarks/step_profile.py: a train step's ops, timed and mapped to their source lines."""

import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import step_profile  # noqa: E402

from attnscale.numerics import layers  # noqa: E402


def test_ops_map_to_the_library_line_and_direction():
  def loss(w, x):
    return jnp.sum(jnp.tanh(layers.matmul(x, w)))

  w, x = jnp.ones((8, 16)), jnp.ones((4, 8))
  hlo = jax.jit(jax.grad(loss)).lower(w, x).compile().as_text()
  instructions, frames = step_profile.hlo_index(hlo)
  sites = {name: (step_profile.direction(op_name), step_profile.site(frames.get(frame, [])))
           for name, (_, op_name, frame) in instructions.items()}
  dots = [s for name, s in sites.items() if "dot" in name or "fusion" in name]
  assert any(where.startswith("numerics/layers.py:") and "matmul" in where
             for _, where in dots), sites
  assert {"forward", "backward"} <= {d for d, _ in sites.values()}, sites


@pytest.mark.parametrize("checkout", ["/home/me/attnscale", "/home/me/code", "attnscale"])
def test_a_site_is_the_same_whatever_the_checkout_s_folder_is_called(checkout):
  """A clone into a folder named attnscale (git's default) must not shift the site
  to 'attnscale/numerics/...'."""
  chain = [(f"{checkout}/attnscale/numerics/layers.py", 42, "matmul")]
  assert step_profile.site(chain) == "numerics/layers.py:42 matmul"


def test_the_command_profiles_a_train_step(tfds_dir):
  args = step_profile.parse_args([
      "--config=configs/shakespeare_char.py:preset=test", f"--set=data_dir={tfds_dir}",
      "--steps=2", "--rounds=1", "--top=50"])
  table = step_profile.profile(args)
  lines = table.splitlines()
  assert lines[0].startswith("# ") and "step unprofiled" in lines[1], table
  from attnscale.core import cpu_kernel  # the CPU's attention: native where it built
  kernel = "core/cpu_kernel/" if cpu_kernel.available() else "core/xla_attention.py"
  assert kernel in table and "| backward |" in table, table
  shares = [float(line.split("|")[2].strip().rstrip("%")) for line in lines[4:]]
  assert abs(sum(shares) - 100.0) < 1.0, table
