"""Which file a `--config=FILE[:ARG]` names, from any folder.

    --config=configs/shakespeare_char.py:preset=test  (a path: from the current folder)
    --config=shakespeare_char.py:preset=test          (a name: the project's configs/)
    --config=shakespeare_char:preset=test             (the same, without .py)

A path that exists from the current folder wins, so a config of your own next to
your code is found first; otherwise FILE is looked up in the project's configs/
folder, beside the attnscale package in the source tree (where an editable
install, `pip install -e .`, finds it). The entry points rewrite the flag's value
before absl parses it (`cli.parse_flags`), so ml_collections' config_flags and
sweep.py read an absolute path. Imports no JAX.
"""

from __future__ import annotations

import os
import re

# The source tree's configs/: the folder beside the attnscale package.
CONFIGS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def project_configs(configs_dir: str = CONFIGS_DIR) -> list[str]:
  """The config files of `configs_dir` (those that define `get_config`), sorted."""
  if not os.path.isdir(configs_dir):
    return []
  found = []
  for name in sorted(os.listdir(configs_dir)):
    path = os.path.join(configs_dir, name)
    if name.endswith(".py") and not name.startswith("_") and os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        if re.search(r"^def get_config\(", f.read(), re.M):
          found.append(name)
  return found


def resolve(value: str, *, flag: str = "config", configs_dir: str = CONFIGS_DIR) -> str:
  """`value` (`FILE[:ARG]`) with FILE made a path that exists.

  Args:
    value: the flag's value, as config_flags splits it (FILE before the first ':').
    flag: the flag's name, for the error.
    configs_dir: where names are looked up.

  Returns:
    `value` itself when FILE exists from the current folder; else the absolute
    path of FILE (FILE.py when FILE has no .py) in `configs_dir`, with `:ARG`.

  Raises:
    ValueError: FILE is neither; one line listing the project's configs.
  """
  path, colon, arg = value.partition(":")
  if not path or os.path.exists(path):
    return value
  names = [path] if path.endswith(".py") else [path, path + ".py"]
  # configs/NAME.py as the docs write it, from another folder than the repository's.
  prefix = os.path.basename(configs_dir) + "/"
  names += [n.removeprefix(prefix) for n in names if n.startswith(prefix)]
  for name in names:
    candidate = os.path.join(configs_dir, name)
    if not os.path.isabs(name) and os.path.isfile(candidate):
      return candidate + colon + arg
  known = ", ".join(project_configs(configs_dir)) or (
      "none" if os.path.isdir(configs_dir) else f"none ({configs_dir} is missing)")
  raise ValueError(f"--{flag}={value}: no such file {path!r} (from {os.getcwd()}) nor in the "
                   f"project's configs ({configs_dir}); the project's configs: {known}")
