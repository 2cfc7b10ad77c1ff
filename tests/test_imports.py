"""config.imports: the user's own modules (a scaling, model variant or task outside
attnscale/), imported before the config is checked by train.py, compile.py, eval.py
and the studies, and saved in config.json so that a run's evaluation imports them."""

import json
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from attnscale import testing
from attnscale.config import imports as config_imports
from attnscale.core import scalings

# A scaling of the user's own: standard attention at half the logits' scale.
MODULE = textwrap.dedent('''
    import dataclasses

    from attnscale import scalings


    @dataclasses.dataclass(frozen=True)
    class HalfStandard:
      def __call__(self, q, k, keys):
        return scalings.Scaled(q, k, logit_scale=0.5 * q.shape[-1] ** -0.5)


    scalings.register("{name}")(HalfStandard)
''')


def _write(path, name):
  path.write_text(MODULE.format(name=name))
  return path


@pytest.fixture
def registry():
  """Forgets the scalings and modules a test imports (the registry is global)."""
  names, modules = set(scalings.names()), set(sys.modules)
  yield
  for name in set(scalings.names()) - names:
    scalings._REGISTRY.pop(name)
  for module in set(sys.modules) - modules:
    if module.startswith("user_"):
      del sys.modules[module]


def _config(*imports):
  return ml_collections.ConfigDict({"imports": imports})


def test_a_module_name_or_a_path(tmp_path, registry, monkeypatch):
  _write(tmp_path / "user_half_a.py", "user_half_a")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert config_imports.import_modules(_config("user_half_a")) == ["user_half_a"]
  assert "user_half_a" in scalings.names()
  (tmp_path / "sub").mkdir()
  path = _write(tmp_path / "sub" / "user_half_b.py", "user_half_b")
  assert config_imports.import_modules(_config(str(path))) == ["user_half_b"]
  assert config_imports.import_modules(_config(str(path))) == ["user_half_b"]  # not run twice
  assert "user_half_b" in scalings.names()
  assert config_imports.import_modules(ml_collections.ConfigDict({})) == []  # a config without


@pytest.mark.parametrize("entry, message", [
    ("no_such_user_module", "config.imports: no module named 'no_such_user_module'"),
    ("/no/such/file.py", "config.imports: no such file '/no/such/file.py'"),
    ("broken", "config.imports: {path} failed to import: ZeroDivisionError: division by zero"),
    ("needs", "config.imports: {path} failed to import: ModuleNotFoundError: No module named "
     "'not_installed_here'"),
])
def test_one_line_errors_naming_config_imports(tmp_path, registry, entry, message):
  sources = {"broken": "x = 1 / 0\n", "needs": "import not_installed_here\n"}
  if entry in sources:
    path = tmp_path / f"user_{entry}.py"
    path.write_text(sources[entry])
    entry, message = str(path), message.format(path=repr(str(path)))
  with pytest.raises(ValueError) as e:
    config_imports.import_modules(_config(entry))
  assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
  with pytest.raises(ValueError, match=r"config.imports must be a tuple"):
    config_imports.import_modules(ml_collections.ConfigDict({"imports": "my_scalings"}))


@pytest.mark.slow
def test_train_and_eval_py_with_a_scaling_of_one_s_own(tmp_path):
  """train.py with the user's file, then eval.py --workdir alone: both import it."""
  (tmp_path / "elsewhere").mkdir()  # outside attnscale/ and the repository
  path = _write(tmp_path / "elsewhere" / "my_scalings.py", "user_half_standard")
  workdir, log = tmp_path / "run", tmp_path / "train.log"
  proc = testing.start_train_py(
      workdir, log, f"--config.imports=('{path}',)", "--config.model.scaling=user_half_standard",
      "--config.num_train_steps=4", f"--config.data_dir={tmp_path / 'tfds'}")
  output = testing.finish(proc, log)
  assert "user_half_standard" in output
  with open(workdir / "config.json") as f:
    assert json.load(f)["imports"] == [str(path)]
  env = testing.subprocess_env(JAX_PLATFORMS="cpu")
  evaluated = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--length=1"],
                             cwd=testing.ROOT, env=env, capture_output=True, text=True,
                             timeout=300)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  with open(workdir / "eval.json") as f:
    assert json.load(f)["scaling"] == "user_half_standard"


@pytest.mark.parametrize("script", ["train.py", "compile.py"])
def test_a_module_that_is_not_there_fails_in_one_line(tmp_path, script):
  workdir = tmp_path / "run"
  where = f"--workdir={workdir}" if script == "train.py" else "--target=cpu"
  proc = subprocess.run([sys.executable, script, "--config=configs/shakespeare_char.py:preset=test",
                         where, "--config.imports=('no_such_user_module',)"],
                        cwd=testing.ROOT, env=testing.subprocess_env(JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert errors == ["error: config.imports: no module named 'no_such_user_module' (not on "
                    f"sys.path nor in {testing.ROOT}; or give the path of a .py file)"], proc.stderr
  assert not workdir.exists()


def test_sweep_py_imports_the_points_modules_before_running_any(tmp_path):
  (tmp_path / "my_config.py").write_text(
      "from configs import shakespeare_char\n\nget_config = shakespeare_char.get_config\n")
  (tmp_path / "my_config_sweeps.py").write_text(textwrap.dedent('''
      CONFIG = "my_config.py"
      SWEEPS = ("one",)


      def get_sweep(name):
        return [{"arg": "preset=test", "overrides": {"imports": ("no_such_user_module",)}}]
  '''))
  workdir = tmp_path / "sweep"
  proc = subprocess.run([sys.executable, "sweep.py", f"--config={tmp_path / 'my_config.py'}",
                         "--sweep=one", f"--workdir={workdir}"], cwd=testing.ROOT,
                        env=testing.subprocess_env(JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "error: config.imports: no module named 'no_such_user_module'"), proc.stderr[-3000:]
  assert not list(workdir.glob("*/config.json"))  # no point started
