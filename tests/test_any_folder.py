"""From any folder: the attnscale-* commands that `pip install -e .` installs, run
exactly as the README writes them; --config by path or by name in configs/; a run's
config.imports found again from the files its provenance.json records; train.py
by its path.

Every subprocess runs in a new folder under pytest's tmp_path, outside the
repository, so nothing is found through the current folder by accident.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import ml_collections
import pytest

from attnscale import testing
from attnscale.config import imports as config_imports
from attnscale.runtime import config_files, hostmem, provenance

README = os.path.join(testing.ROOT, "README.md")
CONFIGS = ("bert_small.py", "gpt2.py", "probes.py", "shakespeare_char.py")


def readme_example() -> tuple[str, list[list[str]]]:
  """The README's own-scaling example: my_scalings.py's text and its commands' argv."""
  with open(README, encoding="utf-8") as f:
    section = f.read().split("**Your own scaling**", 1)[1]
  blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
  module = next(code for lang, code in blocks
                if lang == "python" and code.startswith("# my_scalings.py"))
  shell = next(code for lang, code in blocks if lang == "bash")
  lines = shell.replace("\\\n", " ").splitlines()
  return module, [shlex.split(line) for line in lines if line.strip()]


def command(name: str) -> str:
  """The installed console command `name` beside this Python, or skip."""
  path = os.path.join(os.path.dirname(sys.executable), name)
  if not os.path.exists(path):
    pytest.skip(f"{name} is not installed beside {sys.executable}: `pip install -e .` "
                "(requirements.txt) installs it")
  found = subprocess.run([sys.executable, "-c", "import attnscale; print(attnscale.__file__)"],
                         cwd=os.path.dirname(sys.executable), capture_output=True, text=True,
                         env=testing.subprocess_env(), timeout=60).stdout.strip()
  if os.path.dirname(os.path.dirname(found)) != testing.ROOT:
    pytest.skip(f"{name} runs the attnscale of {found}, not this checkout's: reinstall "
                "with `pip install -e .` here")
  return path


def run(argv, cwd, timeout=300):
  return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                        env=testing.subprocess_env(JAX_PLATFORMS="cpu"))


def folder(tmp_path, name):
  path = tmp_path / name
  path.mkdir()
  assert not str(path).startswith(testing.ROOT + os.sep)
  return path


@pytest.fixture
def data():
  if not os.environ.get("ATTNSCALE_DATA"):
    pytest.skip("needs ATTNSCALE_DATA (CI sets it) or network access")


def test_readme_own_scaling_from_any_folder(tmp_path, data):
  """The README's my_scalings.py and commands in a folder of one's own; then the
  evaluation from another empty folder, where only the recorded file finds it."""
  module, (train, evaluate) = readme_example()
  assert train[0] == "attnscale-train" and evaluate[0] == "attnscale-eval", (train, evaluate)
  mine, elsewhere = folder(tmp_path, "mine"), folder(tmp_path, "elsewhere")
  (mine / "my_scalings.py").write_text(module)
  trained = run([command(train[0]), *train[1:], "--config.num_train_steps=2",
                 f"--config.data_dir={tmp_path / 'tfds'}"], cwd=mine)
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert "my_scaling" in trained.stdout + trained.stderr
  workdir = mine / dict(a.split("=", 1) for a in train if "=" in a)["--workdir"]
  # The summary's next step is the command the README runs next, not the repository's eval.py.
  hint = trained.stdout.strip().splitlines()[-1]
  assert hint == f"  evaluate the whole split: attnscale-eval --workdir={evaluate[1].split('=')[1]}"
  assert provenance.import_files(workdir) == {"my_scalings": str(mine / "my_scalings.py")}
  # The same --workdir, as a path from the other folder.
  argv = [f"--workdir={workdir}" if a.startswith("--workdir=") else a for a in evaluate[1:]]
  evaluated = run([command(evaluate[0]), *argv, "--length=1"], cwd=elsewhere)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  with open(workdir / "eval.json") as f:
    assert json.load(f)["scaling"] == "my_scaling"
  # And the run beside itself in a picture, from the other folder.
  compared = run([command("attnscale-compare"), str(workdir), "--out=mine.png"], cwd=elsewhere)
  assert compared.returncode == 0, compared.stderr[-3000:]
  assert "| my_scaling | 2/2 |" in compared.stdout and (elsewhere / "mine.png").exists()


@pytest.mark.slow
def test_train_py_by_path_with_a_config_by_name(tmp_path, data):
  here = folder(tmp_path, "here")
  proc = run([sys.executable, os.path.join(testing.ROOT, "train.py"),
              "--config=shakespeare_char:preset=test", "--workdir=run",
              "--config.num_train_steps=1", f"--config.data_dir={tmp_path / 'tfds'}"], cwd=here)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert os.path.isdir(here / "run" / "checkpoints" / "1")


@pytest.mark.parametrize("script, flags", [
    ("train.py", ["--workdir=run"]),
    ("compile.py", ["--target=cpu"]),
    ("sweep.py", ["--sweep=test", "--workdir=run"]),
])
def test_an_unknown_config_name_lists_the_project_s_configs(tmp_path, script, flags):
  here = folder(tmp_path, "here")
  proc = run([sys.executable, os.path.join(testing.ROOT, script), "--config=nosuch:preset=test",
              *flags], cwd=here, timeout=120)
  line = testing.assert_one_line_error(proc, "--config=nosuch:preset=test", "no such file")
  assert line.endswith("the project's configs: " + ", ".join(CONFIGS)), line
  assert not (here / "run").exists()


def test_sweep_py_finds_a_config_by_name_and_its_sweeps(tmp_path):
  proc = run([sys.executable, os.path.join(testing.ROOT, "sweep.py"), "--config=shakespeare_char",
              "--sweep=test", "--workdir=sweep", "--print_commands"],
             cwd=folder(tmp_path, "here"), timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert os.path.join(config_files.CONFIGS_DIR, "shakespeare_char.py:") in proc.stdout


def test_a_console_script_re_executes_itself_with_the_malloc_tunables(tmp_path):
  """As pip writes attnscale-train (a file run by its #! line), the script calls
  hostmem.reexec_with_tunables first: the new process runs the same script with
  the same arguments and GLIBC_TUNABLES set."""
  script = tmp_path / "attnscale-probe"
  script.write_text(f"#!{sys.executable}\nimport os, sys\nfrom attnscale.runtime import hostmem\n"
                    "hostmem.reexec_with_tunables()\n"
                    "print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])\n")
  script.chmod(0o755)
  env = {k: v for k, v in testing.subprocess_env().items()
         if k not in ("GLIBC_TUNABLES", "ATTNSCALE_MALLOC")}
  proc = subprocess.run([str(script), "a", "--b=1"], cwd=folder(tmp_path, "here"), env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  expected = hostmem.tunables_environ(environ=env)  # None where this machine needs nothing
  tunables = expected["GLIBC_TUNABLES"] if expected else None
  assert proc.stdout.strip() == f"{tunables} ['a', '--b=1']"


# ---------------------------------------------------------------------------
# config_files.resolve and the recorded imports, in this process.


def test_resolve_a_path_from_here_wins_over_a_name(tmp_path, monkeypatch):
  configs = tmp_path / "configs"
  configs.mkdir()
  (configs / "mine.py").write_text("def get_config(arg=None):\n  return None\n")
  (configs / "mine_sweeps.py").write_text("SWEEPS = ()\n")
  here = folder(tmp_path, "here")
  monkeypatch.chdir(here)
  resolve = lambda value: config_files.resolve(value, configs_dir=str(configs))
  for value in ("mine.py:preset=test", "mine:preset=test", "configs/mine.py:preset=test"):
    assert resolve(value) == f"{configs / 'mine.py'}:preset=test"
  assert resolve("mine") == str(configs / "mine.py")
  (here / "mine.py").write_text("")  # a file of one's own, from the current folder
  assert resolve("mine.py:x=1") == "mine.py:x=1"
  with pytest.raises(ValueError) as e:
    resolve("nosuch:preset=test")
  assert str(e.value).endswith("the project's configs: mine.py") and "\n" not in str(e.value)


def test_project_configs_are_those_with_get_config():
  assert config_files.project_configs() == list(CONFIGS)


@pytest.fixture
def clean_imports(monkeypatch):
  """Restores sys.path and forgets the user_* modules a test imports."""
  monkeypatch.setattr(sys, "path", list(sys.path))
  before = set(sys.modules)
  yield
  for name in set(sys.modules) - before:
    if name.startswith("user_"):
      del sys.modules[name]


def _forget_user_modules():
  for name in [n for n in sys.modules if n.startswith("user_")]:
    del sys.modules[name]


def test_an_entry_that_is_not_here_imports_from_its_recorded_file(tmp_path, monkeypatch,
                                                                  clean_imports):
  (tmp_path / "user_pkg").mkdir()
  (tmp_path / "user_pkg" / "__init__.py").write_text("")
  (tmp_path / "user_pkg" / "user_mod.py").write_text("from user_pkg import user_helper\n")
  (tmp_path / "user_pkg" / "user_helper.py").write_text("X = 1\n")
  (tmp_path / "user_plain.py").write_text("Y = 2\n")
  config = ml_collections.ConfigDict({"imports": ("user_pkg.user_mod", "user_plain.py")})
  path = list(sys.path)
  monkeypatch.chdir(tmp_path)  # training, from the folder that holds them
  recorded = config_imports.import_files(config)
  assert recorded == {"user_pkg.user_mod": str(tmp_path / "user_pkg" / "user_mod.py"),
                      "user_plain.py": str(tmp_path / "user_plain.py")}
  _forget_user_modules()
  monkeypatch.setattr(sys, "path", path)
  monkeypatch.chdir(folder(tmp_path, "elsewhere"))  # evaluating, from another folder
  with pytest.raises(ValueError, match="no module named 'user_pkg.user_mod'"):
    config_imports.import_modules(config)
  names = config_imports.import_modules(config, recorded=recorded)
  assert names == ["user_pkg.user_mod", "user_plain"]
  assert sys.modules["user_pkg.user_helper"].X == 1 and sys.modules["user_plain"].Y == 2


def test_a_recorded_file_that_is_gone_fails_in_one_line(tmp_path, monkeypatch, clean_imports):
  monkeypatch.chdir(folder(tmp_path, "elsewhere"))
  config = ml_collections.ConfigDict({"imports": ("user_gone",)})
  gone = str(tmp_path / "moved" / "user_gone.py")
  with pytest.raises(ValueError) as e:
    config_imports.import_modules(config, recorded={"user_gone": gone})
  message = str(e.value)
  assert "\n" not in message
  for part in ("config.imports", "'user_gone'", gone, "PYTHONPATH",
               "--config.imports='(\"/abs/path/user_gone.py\",)'"):
    assert part in message, message


@pytest.mark.slow
def test_a_sweep_from_one_s_own_folder_imports_one_s_module_by_name(tmp_path):
  # The points' train.py run in the sweep's folder, so config.imports by module
  # name resolve there (the README's my_scalings.py), as train.py's own would.
  module, _ = readme_example()
  here = folder(tmp_path, "here")
  (here / "my_scalings.py").write_text(module)
  (here / "mine.py").write_text(
      "import importlib.util, os\nfrom attnscale.runtime import config_files\n"
      "_spec = importlib.util.spec_from_file_location(\n"
      "    'char', os.path.join(config_files.CONFIGS_DIR, 'shakespeare_char.py'))\n"
      "char = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(char)\n"
      "get_config = char.get_config\n")
  (here / "mine_sweeps.py").write_text(
      "CONFIG = 'mine.py'\nSWEEPS = ('one',)\n\n\ndef get_sweep(name):\n"
      "  return [{'arg': 'preset=test', 'overrides': {'imports': ('my_scalings',),\n"
      "           'model.scaling': 'my_scaling', 'num_train_steps': 3}}]\n")
  proc = run([sys.executable, os.path.join(testing.ROOT, "sweep.py"), "--config=mine.py",
              "--sweep=one", "--workdir=sw"], cwd=here, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (run_dir,) = [p for p in (here / "sw").iterdir() if p.is_dir()]
  assert json.loads((run_dir / "config.json").read_text())["model"]["scaling"] == "my_scaling"


@pytest.mark.parametrize("config, override, hint", [
    ("shakespeare_char:preset=test", "--config.model.scaling=cosin", "(did you mean 'cosine'?)"),
    ("shakespeare_char:preset=test", "--config.model.normalizer=sigmod",
     "(did you mean 'sigmoid'?)"),
    ("shakespeare_char:preset=test", "--config.model.variant=unt", "(did you mean 'unit'?)"),
    ("shakespeare_char:preset=test", "--config.task=char_ln", "(did you mean 'char_lm'?)"),
    ("shakespeare_char:preset=cpuu", None, "(did you mean 'cpu'?)"),
], ids=["scaling", "normalizer", "variant", "task", "preset"])
def test_a_misspelt_registered_name_gets_did_you_mean(tmp_path, config, override, hint):
  here = folder(tmp_path, "here")
  proc = run([sys.executable, os.path.join(testing.ROOT, "train.py"), f"--config={config}",
              "--workdir=run", *([override] if override else [])], cwd=here, timeout=120)
  line = testing.assert_one_line_error(proc, "must be one of")
  assert line.endswith(hint), line
  assert not (here / "run").exists()


def test_a_name_registered_in_a_file_not_imported_says_to_import_it(tmp_path):
  """The README's my_scalings.py in the folder, the training run without
  config.imports: the line names the file and the config.imports that fixes it."""
  module, _ = readme_example()
  mine = folder(tmp_path, "mine")
  (mine / "my_scalings.py").write_text(module)
  proc = run([sys.executable, os.path.join(testing.ROOT, "train.py"),
              "--config=shakespeare_char:preset=test", "--config.model.scaling=my_scaling",
              "--workdir=run"], cwd=mine, timeout=120)
  line = testing.assert_one_line_error(proc, "model.scaling")
  assert line.endswith("got 'my_scaling' (my_scalings.py registers 'my_scaling' but is not "
                       "imported: add it to config.imports, "
                       "--config.imports='(\"my_scalings\",)')"), line


def test_eval_py_on_a_folder_that_does_not_exist_says_so(tmp_path):
  here = folder(tmp_path, "here")
  proc = run([sys.executable, os.path.join(testing.ROOT, "eval.py"), "--workdir=runs/nosuch"],
             cwd=here, timeout=120)
  line = testing.assert_one_line_error(proc, "--workdir runs/nosuch does not exist")
  assert "config.json" not in line, line


@pytest.mark.slow
def test_tensorboard_opens_the_runs_folder(tmp_path):
  """The training guide's `tensorboard --logdir runs` in the default install: it
  serves (port 0: any free one) and answers."""
  import time
  import urllib.request
  here = folder(tmp_path, "here")
  (here / "runs").mkdir()
  proc = subprocess.Popen([command("tensorboard"), "--logdir", "runs", "--port", "0"], cwd=here,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    deadline, url, seen = time.monotonic() + 120, None, []
    while url is None and time.monotonic() < deadline and proc.poll() is None:
      line = proc.stdout.readline()
      seen.append(line)
      match = re.search(r"TensorBoard \S+ at (http://\S+/)", line)
      url = match and match.group(1)
    assert url, "".join(seen)
    with urllib.request.urlopen(url, timeout=30) as response:
      assert response.status == 200
  finally:
    proc.terminate()
    proc.wait(timeout=30)


def test_unimported_registration_finds_decorators_and_registry_entries(tmp_path):
  """The files `checks.choice_error` names: a decorated scaling, a variant or task put
  in its table, in a folder of one's own (not hidden ones, not run folders)."""
  from attnscale import checks
  (tmp_path / "my_scalings.py").write_text('@scalings.register( "mine")\ndef mine(): ...\n')
  (tmp_path / "lib").mkdir()
  (tmp_path / "lib" / "my_model.py").write_text('models.VARIANTS["wide"] = Wide\n')
  (tmp_path / ".venv").mkdir()
  (tmp_path / ".venv" / "hidden.py").write_text('TASKS["hidden"] = Hidden\n')
  (tmp_path / "uses.py").write_text('if TASKS["used"] == x: pass\n')  # a comparison, not a registration
  find = lambda name: checks.unimported_registration(name, str(tmp_path))
  assert find("mine") == "my_scalings.py"
  assert find("wide") == os.path.join("lib", "my_model.py")
  assert find("hidden") is None and find("used") is None and find("nosuch") is None
