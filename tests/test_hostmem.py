"""hostmem: which glibc malloc tunables train.py re-executes with, and that it does;
the notebook kernel that starts with them."""

import json
import os
import subprocess
import sys

import pytest

from attnscale.runtime import hostmem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def linux_glibc(monkeypatch):
  """A Linux/glibc 2.36 machine whose THP mode is `madvise` (set .mode to change it)."""
  state = type("State", (), {"mode": "madvise"})()
  monkeypatch.setattr(sys, "platform", "linux")
  monkeypatch.setattr(hostmem, "_glibc_version", lambda: (2, 36))
  monkeypatch.setattr(hostmem, "_thp_mode", lambda: state.mode)
  return state


def test_modes(linux_glibc):
  assert hostmem.tunables_environ("huge", environ={})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  reuse = hostmem.tunables_environ("reuse", environ={})["GLIBC_TUNABLES"]
  assert "hugetlb=1" in reuse and "mmap_max=0" in reuse and "arena_max=1" in reuse
  assert hostmem.tunables_environ(environ={})["GLIBC_TUNABLES"] == reuse  # the default
  env = {"ATTNSCALE_MALLOC": "reuse", "PATH": "/bin"}
  assert hostmem.tunables_environ(environ=env) == {**env, "GLIBC_TUNABLES": reuse}
  assert hostmem.tunables_environ("system", environ={}) is None


def test_nothing_to_do(linux_glibc, monkeypatch):
  # The user's own tunables win.
  assert hostmem.tunables_environ(environ={"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}) is None
  # THP "always" makes pages huge already; "never" refuses them: only reuse's other settings.
  for mode in ("always", "never"):
    linux_glibc.mode = mode
    assert hostmem.tunables_environ("huge", environ={}) is None
    assert "hugetlb" not in hostmem.tunables_environ("reuse", environ={})["GLIBC_TUNABLES"]
  linux_glibc.mode = "madvise"
  monkeypatch.setattr(hostmem, "_glibc_version", lambda: (2, 31))  # no hugetlb tunable
  assert hostmem.tunables_environ(environ={}) is None
  monkeypatch.setattr(hostmem, "_glibc_version", lambda: None)  # musl, macOS
  assert hostmem.tunables_environ(environ={}) is None


def test_bad_mode_is_a_one_line_error(linux_glibc):
  with pytest.raises(ValueError, match=r"^ATTNSCALE_MALLOC must be one of \['huge', 'reuse', "
                                       r"'system'\], got 'fast'$"):
    hostmem.tunables_environ(environ={"ATTNSCALE_MALLOC": "fast"})


def test_reexec_runs_the_same_command_with_the_tunables():
  script = ("import os, sys; from attnscale.runtime import hostmem; hostmem.reexec_with_tunables(); "
            "print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:], sys.flags.dont_write_bytecode)")
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "ATTNSCALE_MALLOC")}
  proc = subprocess.run([sys.executable, "-B", "-c", script, "a", "--b=1"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120, check=True)
  tunables, rest = proc.stdout.strip().split(" ", 1)
  expected = hostmem.tunables_environ(environ=env)  # None where this machine needs nothing
  assert tunables == (expected["GLIBC_TUNABLES"] if expected else "None")
  assert rest == "['a', '--b=1'] 1"  # arguments and interpreter options survive


def test_train_py_bad_mode_exits_with_one_line_error(tmp_path):
  env = {**os.environ, "ATTNSCALE_MALLOC": "fast"}
  env.pop("GLIBC_TUNABLES", None)
  proc = subprocess.run([sys.executable, "train.py", "--config=configs/shakespeare_char.py",
                         f"--workdir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1].startswith("error: ATTNSCALE_MALLOC must be one of")
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_hands_a_reused_heaps_free_pages_back():
  # Under "reuse" free() keeps a step's pages for the next step; train.py calls
  # trim() after compilation, evaluations and checkpoints so the process does
  # not keep its peak. 256 MB freed stays resident until trim() returns it.
  script = (
      "import numpy as np; from attnscale.runtime import hostmem\n"
      "def rss(): return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
      "x = np.ones(2**25); del x; kept = rss()\n"
      "hostmem.trim(); print(kept - rss())\n")
  env = {**os.environ, "GLIBC_TUNABLES": hostmem.MODES["reuse"]}
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120, check=True)
  assert int(proc.stdout.strip().splitlines()[-1]) > 200_000  # kB handed back


def test_install_kernel_starts_a_kernel_with_the_tunables(linux_glibc, tmp_path):
  """The notebook kernel (`python -m attnscale.runtime.hostmem install-kernel`): a
  kernel Jupyter starts from its kernel.json has train.py's tunables set."""
  jupyter_client = pytest.importorskip("jupyter_client")
  from jupyter_client.kernelspec import KernelSpecManager
  folder = hostmem.install_kernel(prefix=str(tmp_path))
  reuse = hostmem.tunables_environ("reuse", environ={})["GLIBC_TUNABLES"]
  with open(os.path.join(folder, "kernel.json")) as f:
    assert json.load(f)["env"] == {"GLIBC_TUNABLES": reuse}
  specs = KernelSpecManager(kernel_dirs=[os.path.dirname(folder)])
  km = jupyter_client.KernelManager(kernel_name=hostmem.KERNEL_NAME, kernel_spec_manager=specs)
  km.start_kernel()
  try:
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    reply = kc.execute("import os; tunables = os.environ.get('GLIBC_TUNABLES')",
                       user_expressions={"t": "tunables"}, reply=True, timeout=60)
    assert reply["content"]["user_expressions"]["t"]["data"]["text/plain"] == repr(reuse)
    kc.stop_channels()
  finally:
    km.shutdown_kernel(now=True)
