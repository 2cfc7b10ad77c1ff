"""Test helpers that are part of the library, so tests and notebooks share them.

Random q, k, v; padding masks; every registered scaling with test parameters; a
localhost file server for the data builders' download branches; the environment
of a subprocess with fake CPU devices; train.py in a subprocess, waiting on it,
an entry point's one-line error, and a fingerprint of a run directory; a tiny run trained in-process (`train_tiny_run`);
a notebook executed at its small size (`execute_notebook`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

# (id, name, params): every registered name at least once, plus variants.
SCALING_CASES = [
    ("standard", "standard", {}),
    ("none", "none", {}),
    ("key_norm_sum", "key_norm_sum", {}),
    ("key_norm_mean", "key_norm_mean", {}),
    ("key_norm_power_2", "key_norm_power", {"p": 2.0}),
    ("key_norm_power_0.5", "key_norm_power", {"p": 0.5}),
    ("cosine", "cosine", {"temperature": 6.0}),
    ("qk_layernorm", "qk_layernorm", {}),
    ("fully_scaled", "fully_scaled", {}),
    ("umup", "umup", {}),
    ("qk_rmsnorm", "qk_rmsnorm", {}),
    ("inverse_d", "inverse_d", {}),
    ("log_n", "log_n", {}),
    ("log_n_per_head", "log_n", {"s": (0.3, 0.5, 0.7, 0.9)}),  # random_qkv's N = 4
    ("log_n_ratio", "log_n_ratio", {"train_len": 4}),  # sharper past 4 keys
    ("temperature_tuning", "temperature_tuning", {"floor_scale": 3, "beta": 0.5}),
    ("yarn", "yarn", {"train_len": 4}),  # sharper past 4 keys
    ("log_n_power_2", "log_n_power", {"train_len": 4, "p": 2.0, "gamma": 1.5}),
    ("n_power", "n_power", {"train_len": 4, "a": 0.5}),
    ("scale_invariant", "scale_invariant", {"tau": 2.0}),  # a_t, m_t move within 10 keys
]


def subprocess_env(xla_flags: Sequence[str] = (), **extra: str) -> dict[str, str]:
  """os.environ plus `extra`, with `xla_flags` added to the XLA_FLAGS already set
  (the tests' -O0, tests/conftest.py), replacing any of the same name.

  PYTHONFAULTHANDLER=1: a child that a test stops for taking too long prints
  every thread's Python stack as it goes (`stop_with_stacks`)."""
  names = {f.split("=", 1)[0] for f in xla_flags}
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=", 1)[0] not in names]
  return dict(os.environ, PYTHONFAULTHANDLER="1", **extra,
              XLA_FLAGS=" ".join(kept + list(xla_flags)))


def stop_with_stacks(procs: Sequence[subprocess.Popen], grace_s: float = 10.0) -> None:
  """Ends every process of `procs` that still runs, each printing its threads'
  Python stacks to its stderr first: SIGABRT, which `faulthandler` takes in a
  process started with PYTHONFAULTHANDLER=1 (`subprocess_env`) and dumps the
  stacks before the abort; SIGKILL for what is left after `grace_s`.

  A test that waits for several processes calls it when time runs out, so that
  a hang shows where each process was, not only that one did not exit.
  """
  running = [p for p in procs if p.poll() is None]
  for p in running:
    p.send_signal(signal.SIGABRT)
  deadline = time.monotonic() + grace_s
  for p in running:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def wait_all(procs: Sequence[subprocess.Popen], timeout_s: float,
             describe: Callable[[], str]) -> None:
  """Waits for every process of `procs`; if one still runs after `timeout_s`,
  stops them all with their stacks (`stop_with_stacks`) and fails with
  `describe()` (their logs, stacks included)."""
  deadline = time.monotonic() + timeout_s
  while any(p.poll() is None for p in procs):
    if time.monotonic() > deadline:
      late = [i for i, p in enumerate(procs) if p.poll() is None]
      stop_with_stacks(procs)
      raise AssertionError(f"processes {late} did not exit within {timeout_s:.0f} s; their "
                           f"stacks are in their logs:\n{describe()}")
    time.sleep(0.05)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def start_train_py(workdir, log_path, *flags: str, cache_dir=None,
                   config: str = "configs/shakespeare_char.py:preset=test") -> subprocess.Popen:
  """train.py `--config=config --workdir=workdir *flags` in a subprocess on the CPU,
  from the repository root; its stdout and stderr are appended to `log_path`.

  `cache_dir`: a persistent XLA cache the runs of one test share, so that the
  run compiles once and every process runs the same executable.
  """
  env = subprocess_env(JAX_PLATFORMS="cpu")
  if cache_dir is not None:
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  with open(log_path, "a") as log:
    return subprocess.Popen(
        [sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}", *flags],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def assert_one_line_error(proc: subprocess.CompletedProcess, *names: str) -> str:
  """An entry point's bad-input exit: status nonzero, no traceback, and one
  `error:` line on stderr (its last) that holds every one of `names`; returns it."""
  assert proc.returncode != 0, proc.stdout + proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
  for name in names:
    assert name in errors[0], errors[0]
  return errors[0]


def wait_for(proc: subprocess.Popen, condition: Callable[[], bool], what: str,
             log_path=None, timeout_s: float = 240.0) -> None:
  """Polls `condition()` until it holds while `proc` runs. If the process ends
  first or time runs out: kills it and fails, naming `what` and quoting the end
  of `log_path`."""
  deadline = time.monotonic() + timeout_s
  while not condition():
    ended, late = proc.poll() is not None, time.monotonic() > deadline
    if ended or late:
      _stop(proc)
      raise AssertionError(f"ended before {what}: {_tail(log_path)}" if ended else
                           f"no {what} after {timeout_s:.0f} s: {_tail(log_path)}")
    time.sleep(0.01)


def finish(proc: subprocess.Popen, log_path, returncode: int = 0,
           timeout_s: float = 300.0) -> str:
  """Waits for `proc` (killed after `timeout_s`), asserts its exit status and
  returns what it wrote to `log_path`."""
  try:
    proc.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    _stop(proc)
    raise AssertionError(f"did not exit within {timeout_s:.0f} s; its stacks are at the end: "
                         f"{_tail(log_path, 6000)}") from None
  finally:
    _stop(proc)
  output = _tail(log_path, None)
  assert proc.returncode == returncode, output[-3000:]
  return output


def _stop(proc: subprocess.Popen) -> None:
  stop_with_stacks([proc])  # only a process still running: a timeout or a failed wait


def _tail(log_path, chars: int | None = 3000) -> str:
  if log_path is None:
    return ""
  with open(log_path) as f:
    text = f.read()
  return text if chars is None else text[-chars:]


def snapshot(path) -> dict[str, str] | None:
  """{relative path: sha256 or "dir"} of everything under `path` (None if absent)."""
  if not os.path.exists(path):
    return None
  out = {}
  for root, dirs, files in os.walk(path):
    for d in dirs:
      out[os.path.relpath(os.path.join(root, d), path)] = "dir"
    for name in files:
      with open(os.path.join(root, name), "rb") as f:
        out[os.path.relpath(os.path.join(root, name), path)] = hashlib.sha256(
            f.read()).hexdigest()
  return out


def cpu_devices_env(num_devices: int, **extra: str) -> dict[str, str]:
  """`subprocess_env` for a JAX subprocess on the CPU with `num_devices` fake devices."""
  return subprocess_env([f"--xla_force_host_platform_device_count={num_devices}"],
                        JAX_PLATFORMS="cpu", **extra)


def scaling_params(ids=None):
  """`pytest.param(name, params)` for each case (those in `ids` if given)."""
  import pytest  # a test dependency, not the library's
  return [pytest.param(name, params, id=i) for i, name, params in SCALING_CASES
          if ids is None or i in ids]


def random_qkv(seed=0, B=2, T=12, S=12, N=4, K=2, H=8, dtype=jnp.float32):
  """q [B, T, N, H], k and v [B, S, K, H], standard normal."""
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(kq, (B, T, N, H), dtype)
  k = jax.random.normal(kk, (B, S, K, H), dtype)
  v = jax.random.normal(kv, (B, S, K, H), dtype)
  return q, k, v


def padding_mask(lengths, S):
  """[B, 1, 1, S] key mask: True for the first lengths[b] keys."""
  return (jnp.arange(S)[None, :] < jnp.asarray(lengths)[:, None])[:, None, None, :]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):

  def log_message(self, *args):  # Keeps pytest's captured output clean.
    pass


@contextlib.contextmanager
def serve_directory(directory):
  """Serves `directory` on 127.0.0.1 (an ephemeral port); yields the base URL.

  The builders' online branches are tested against it: no test leaves the machine.
  """
  handler = functools.partial(_QuietHandler, directory=str(directory))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield f"http://127.0.0.1:{server.server_port}"
  finally:
    server.shutdown()
    server.server_close()


def restore_checkpoint(config, workdir: str, step: int | None = None):
  """The train state `config`'s run saved in `workdir` at `step` (default: the
  latest), restored in this process onto its default mesh, as numpy arrays."""
  from attnscale.runtime import checkpoints as ckpt  # orbax: only end-to-end tests need it
  from attnscale.runtime import train_state as ts

  _, state, shardings = ts.create_state(config, ts.make_mesh(config))
  checkpoints = ckpt.Checkpoints(workdir, config.keep_checkpoints)
  try:
    return jax.device_get(checkpoints.restore(state, shardings, step=step))
  finally:
    checkpoints.close()


class TinyRun(NamedTuple):
  """A trained run: its config, its directory, the training's final metrics
  (`train_and_evaluate`'s) and its eval.json (None: not evaluated)."""

  config: object
  workdir: str
  metrics: dict
  eval: dict | None


def train_tiny_run(tmp_path_factory, arg: str = "preset=test", *, steps: int | None = None,
                   name: str = "run", config=None, overrides: dict | None = None,
                   evaluate: bool = False) -> TinyRun:
  """A tiny run through the library (`train_lib.train_and_evaluate`), as the
  tests' module fixtures train it: configs/shakespeare_char.py's `arg` (or
  `config`, built by the caller) with `overrides` by dotted name, `steps` steps
  (None: the config's), in a new directory `name` of `tmp_path_factory` (pytest's, or anything with
  `mktemp`). `evaluate`: then eval.py's `evaluate_run` (a 1-character sample),
  so the run has both a checkpoint and an eval.json.

  The character LM reads tiny Shakespeare from $ATTNSCALE_DATA: without it the
  test is skipped (prepared in a new TFDS directory of `tmp_path_factory`).
  """
  from attnscale.runtime import train_lib
  if config is None:
    if not os.environ.get("ATTNSCALE_DATA"):
      import pytest  # a test dependency, not the library's
      pytest.skip("needs ATTNSCALE_DATA (CI sets it) or network access")
    from configs import shakespeare_char
    config = shakespeare_char.get_config(arg)
    config.data_dir = str(tmp_path_factory.mktemp("tfds"))
  if steps is not None:
    config.num_train_steps = steps
  config.update_from_flattened_dict(overrides or {})
  workdir = str(tmp_path_factory.mktemp(name))
  metrics = train_lib.train_and_evaluate(config, workdir)
  result = None
  if evaluate:
    from attnscale.evaluation import eval_lib
    eval_lib.evaluate_run(workdir, sample_length=1)
    with open(os.path.join(workdir, "eval.json")) as f:
      result = json.load(f)
  return TinyRun(config, workdir, metrics, result)


def assert_trained_and_evaluated(run: TinyRun, label: str) -> None:
  """A `train_tiny_run(..., evaluate=True)` that came through whole: every step run,
  a finite loss, gradient norm and validation loss, eval.json under the run label
  `label`, and finite diagnostics for every layer with one entry per query head."""
  assert run.metrics["step"] == run.config.num_train_steps, run.metrics
  for key in ("loss", "grad_norm", "val_loss"):
    assert math.isfinite(run.metrics[key]), (key, run.metrics)
  assert run.eval["scaling"] == label, run.eval["scaling"]
  heads = run.config.model.num_heads
  assert len(run.eval["attention"]) == run.config.model.num_layers
  for layer in run.eval["attention"]:
    assert all(math.isfinite(v) for k, v in layer.items() if k != "heads"), layer
    assert all(len(v) == heads for v in layer["heads"].values()), layer["heads"]


def fake_run(root, name: str, arg: str, overrides: dict, records: Sequence[dict], *,
             done: bool = True, config_module=None) -> str:
  """A run directory as train.py leaves one, without training: config.json
  (configs/shakespeare_char.py's `arg` with `overrides`; `config_module`: another
  config file's module, e.g. configs.bert_small), metrics.jsonl (`records`) and, when
  `done`, a checkpoint directory at the last step (what `run_records.status` reads; a
  run stopped by a NaN has none), for testing what the studies compute from sweeps.
  Returns its path."""
  if config_module is None:
    from configs import shakespeare_char as config_module
  config = config_module.get_config(arg)
  config.update_from_flattened_dict(overrides)
  run = os.path.join(root, name)
  os.makedirs(os.path.join(run, "checkpoints", str(config.num_train_steps) if done else ""))
  with open(os.path.join(run, "config.json"), "w") as f:
    json.dump(config.to_dict(), f)
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  return run


def execute_notebook(path: str, cwd=None, *, timeout_s: float = 180.0, **env: str):
  """Runs the notebook at `path` in a new kernel and returns it with its outputs.

  The kernel runs where Jupyter runs it, in the notebook's own folder (so a
  relative path in the environment would break there as it does for a user;
  `cwd` overrides), on the CPU, with this checkout first on PYTHONPATH
  (whatever attnscale is installed; configs/ too), ATTNSCALE_NOTEBOOK_SMALL=1
  (the notebooks' tiny sizes) and `env`. The outputs it is stored with are
  dropped first. Skips the test without nbformat and nbclient.
  """
  import pytest  # a test dependency, not the library's
  pytest.importorskip("nbformat")
  pytest.importorskip("nbclient")
  env = {"ATTNSCALE_NOTEBOOK_SMALL": "1", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
         **env}
  return run_notebook(path, cwd or os.path.dirname(os.path.abspath(path)), timeout_s, env)


def run_notebook(path: str, cwd, timeout_s: float | None, env: dict[str, str]):
  """`path` executed from a clean slate in `cwd` with `os.environ | env`.

  No timing metadata is recorded (nbclient's default stamps every cell with the
  time it ran), so a notebook executed twice is stored the same way twice.
  """
  import nbclient
  import nbformat
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == "code":
      cell.outputs, cell.execution_count = [], None
      cell.metadata.pop("execution", None)
  kernelspec = dict(nb.metadata.get("kernelspec", {}))
  client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name=notebook_kernel(nb),
                                   record_timing=False,
                                   resources={"metadata": {"path": str(cwd)}})
  client.execute(env={**os.environ, **env})
  if kernelspec:  # stored with the kernel it names, whichever ran it here
    nb.metadata["kernelspec"] = kernelspec
  return nb


def notebook_kernel(nb) -> str:
  """The Jupyter kernel to execute `nb` with: the one its metadata names (the
  notebooks': "attnscale", `hostmem.install_kernel`) where that kernel is installed
  for this Python, else "python3" (ipykernel's own, this interpreter): a kernel of
  that name in another environment would run another attnscale."""
  name = nb.metadata.get("kernelspec", {}).get("name", "python3")
  try:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
  except ImportError:
    return "python3"
  try:
    argv = KernelSpecManager().get_kernel_spec(name).argv
  except NoSuchKernel:
    return "python3"
  same = bool(argv) and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
  return name if same else "python3"


def store_notebook_outputs(path: str) -> None:
  """Executes the notebook at `path` at its full size, as a user opening it from the
  README would (its own folder, this environment), and stores it with its outputs.

  How the committed notebooks get their outputs, so that a reader on the web sees
  the results before running anything (docs/development.md, "Notebooks"):

      python -c 'from attnscale import testing; testing.store_notebook_outputs(
          "notebooks/compare_scalings.ipynb")'
  """
  import nbformat
  nb = run_notebook(path, os.path.dirname(os.path.abspath(path)), None,
                    {"JAX_PLATFORMS": "cpu"})
  nbformat.write(nb, path)


def notebook_outputs(nb, kind: str) -> list:
  """Every code cell's outputs of `kind`: "text" (printed) or a MIME type of the
  displayed ones ("image/png", "text/markdown")."""
  outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
  if kind == "text":
    return [out["text"] for out in outputs if "text" in out]
  return [out["data"][kind] for out in outputs if kind in out.get("data", {})]


# ---------------------------------------------------------------------------
# Deviceless compilation (tests/test_compile_*.py).


def installed(module: str) -> bool:
  """Whether `module` can be imported (its parent package too)."""
  import importlib.util
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:
    return False


def compile_config(preset="nanogpt", scaling="standard", **fields):
  """The shakespeare_char preset in bf16 with every device on fsdp; `fields` by dotted name."""
  from configs import shakespeare_char
  config = shakespeare_char.get_config(f"preset={preset},scaling={scaling}")
  config.update_from_flattened_dict({"model.dtype": "bfloat16", "mesh.data": 1,
                                     "mesh.fsdp": 8, **fields})
  return config


def compile_attention_grad(target: str, fn, *shapes, dtype=jnp.bfloat16) -> str:
  """The compiled HLO of grad(sum(fn(*args))) for `target` (`aot.devices`), args of
  `shapes` sharded over their batch axis on every device: one attention call's
  forward and backward, for kernel options no model config names yet."""
  import numpy as np

  from attnscale.runtime import aot
  devices = aot.devices(target)
  # The training mesh's axes (`train_state.make_mesh`), which splash's shard_map names.
  mesh = jax.sharding.Mesh(np.array(devices).reshape(-1, 1), ("data", "fsdp"))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  args = [jax.ShapeDtypeStruct(s, dtype, sharding=sharding) for s in shapes]
  loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    lowered = jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))).lower(*args)
  return lowered.compile().as_text()


def forget_and_differential_kernels(target: str, normalizers) -> dict[str, str]:
  """The kernel FoX's log forget gate (under each of `normalizers`) and differential
  attention's two maps (with the model's values, 2 head dims wide: splash and
  cuDNN run them in two slices, `fused.by_value_slices`) compile to on `target`,
  forward and backward, batch-sharded over its devices (`compile_attention_grad`):
  {"fox/<normalizer>": kernel, "differential": kernel}."""
  import attnscale
  from attnscale.core.differential import differential_attention
  from attnscale.runtime import hlo
  q, kv, gate, wide = (8, 256, 8, 64), (8, 256, 4, 64), (8, 256, 8), (8, 256, 4, 128)
  kernels = {}
  for normalizer in normalizers:
    fox = lambda q, k, v, lf, normalizer=normalizer: attnscale.attention(
        q, k, v, is_causal=True, normalizer=normalizer, log_forget=lf)
    kernels[f"fox/{normalizer}"] = hlo.attention_kernel(
        compile_attention_grad(target, fox, q, kv, kv, gate))
  diff = lambda q1, q2, k1, k2, v: differential_attention(q1, q2, k1, k2, v, 0.5, is_causal=True)
  kernels["differential"] = hlo.attention_kernel(
      compile_attention_grad(target, diff, q, q, kv, kv, wide))
  return kernels


def check_fsdp_report(report, config, kernel: str) -> None:
  """A compile report of `config` at fsdp=8 (`aot.compile_report`) is FSDP: it fits,
  uses `kernel`, moves no activation, and holds an eighth of every matrix."""
  import numpy as np

  from attnscale.runtime import train_state as ts
  shapes = ts.state_shapes(config)
  params = sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(shapes["params"]))
  for step in ("train_step", "eval_step"):
    row = report[step]
    assert row["memory"]["fits"], (step, row["memory"])
    assert row["kernel"] == kernel, step
    assert row["collectives"]["all-to-all"] == 0, step
    assert row["activation_collectives"] == [], row["activation_collectives"][:3]
    # Every matrix split 8 ways; vectors (gains) replicated: within 1%.
    assert abs(row["memory"]["parameters"] / (params / 8) - 1) < 0.01, step
  # Adam's two moments mirror the parameters (plus a step count).
  assert abs(report["train_step"]["memory"]["optimizer_state"] / (2 * params / 8) - 1) < 0.01
