"""The repository's shell scripts parse (`bash -n`), and the GPU session's steps are the
ones it lists: a lent GPU's minutes are few, so a script that fails to parse there
costs the whole session (benchmarks/gpu_session.sh, benchmarks/probes_gpu.sh, .ci/run)."""

import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.sh"))) + [
    os.path.join(ROOT, ".ci", "run")]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: os.path.relpath(p, ROOT))
def test_the_script_parses(path):
  done = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
  assert done.returncode == 0, done.stderr


def test_the_gpu_sessions_steps_are_the_ones_it_names():
  text = open(os.path.join(ROOT, "benchmarks", "gpu_session.sh")).read()
  arms = set(re.findall(r"^  ([a-z_]+)\) ", text, re.M))
  listed = re.search(r'unknown step \$1 \(([^)]*)\)', text).group(1)
  assert arms == {s.strip() for s in listed.split(",")}
  default = re.search(r'\$\{@:-([^}]*)\}', text).group(1).split()
  assert set(default) <= arms and default[:2] == ["nanogpt", "probes"]


def test_the_probes_gpu_presets_are_valid_configs():
  from attnscale.runtime import configlib
  from configs import probes
  text = open(os.path.join(ROOT, "benchmarks", "probes_gpu.sh")).read()
  for preset in probes.GPU_PRESETS:
    assert preset in text
    for scaling in ("standard", "log_n"):
      configlib.validate(probes.get_config(f"preset={preset},scaling={scaling}"))
