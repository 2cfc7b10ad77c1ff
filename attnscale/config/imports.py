"""`config.imports`: the user's own modules (scalings, model variants, tasks), imported
before a config is checked so that what they register is nameable from it.

An entry is a module name (on sys.path or in the current directory) or the path
of a .py file. A run records where each entry was imported from
(`import_files`, in WORKDIR/provenance.json), so eval.py and the studies find it
again from another folder (`import_modules(..., recorded=...)`). Every failure is
one line naming config.imports and the entry.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping


def import_modules(config, recorded: Mapping[str, str] | None = None) -> list[str]:
  """Imports `config.imports` (absent: none): the user's own scalings, model
  variants or tasks, registered when imported. Call before the config is checked;
  train.py, compile.py (`validate`), eval.py and the studies (`load_config` of a
  run's config.json) do.

  Each entry is a module name (`importlib.import_module`: on sys.path or in the
  current directory) or the path of a .py file (its directory becomes importable,
  so it may import its neighbours; a relative path is from the current
  directory). A module already imported is not run again.

  Args:
    config: a config with (or without) `imports`.
    recorded: entry -> the file it was imported from when the run trained
      (`import_files`, kept in WORKDIR/provenance.json): an entry that cannot be
      found here (another folder, another sys.path) is imported from that file.

  Returns:
    The modules' names, in order.

  Raises:
    ValueError: an entry that cannot be found (nor from its recorded file) or
      fails to import; one line, naming config.imports and the entry.
  """
  names = []
  for entry in _entries(config):
    try:
      names.append(_import_one(entry))
    except _NotFound:
      if not recorded or entry not in recorded:
        raise
      names.append(_import_recorded(entry, recorded[entry]))
  return names


def import_files(config) -> dict[str, str]:
  """Where each entry of `config.imports` is imported from: entry -> the absolute
  path of its module's file (entries without one are left out). train.py records
  it in WORKDIR/provenance.json, so that the run's evaluation, from any folder,
  imports the same files (`import_modules`' `recorded`). Imports the entries
  first (a module already imported is not run again)."""
  files = {}
  for entry, name in zip(_entries(config), import_modules(config)):
    file = getattr(sys.modules.get(name), "__file__", None)
    if file:
      files[entry] = os.path.abspath(file)
  return files


class _NotFound(ValueError):
  """An entry of config.imports that is nowhere to be found (not one that fails)."""


def _entries(config) -> tuple[str, ...]:
  # A ConfigDict, or a run's config.json as read (a dict).
  entries = (config.get("imports") if isinstance(config, dict)
             else getattr(config, "imports", None)) or ()
  if isinstance(entries, str) or not all(isinstance(e, str) and e for e in entries):
    raise ValueError(f"config.imports must be a tuple of module names or .py paths, e.g. "
                     f"--config.imports='(\"my_scalings\",)', got {entries!r}")
  return tuple(entries)


def _is_path(entry: str) -> bool:
  return entry.endswith(".py") or os.sep in entry


def _import_one(entry: str) -> str:
  if _is_path(entry):
    path = os.path.abspath(os.path.expanduser(entry))
    if not os.path.isfile(path):
      raise _NotFound(f"config.imports: no such file {entry!r} (from {os.getcwd()})")
    return _import_file(entry, path)
  if os.getcwd() not in sys.path:
    sys.path.append(os.getcwd())
  try:
    importlib.import_module(entry)
  except ModuleNotFoundError as e:
    if e.name and (entry == e.name or entry.startswith(e.name + ".")):
      raise _NotFound(f"config.imports: no module named {entry!r} (not on sys.path nor in "
                      f"{os.getcwd()}; or give the path of a .py file)") from e
    raise ValueError(f"config.imports: {entry!r} failed to import: {_first_line(e)}") from e
  except Exception as e:
    raise ValueError(f"config.imports: {entry!r} failed to import: {_first_line(e)}") from e
  return entry


def _import_file(entry: str, path: str) -> str:
  """Imports the .py file `path` (absolute) as the module named by its file name."""
  name = os.path.splitext(os.path.basename(path))[0]
  loaded = sys.modules.get(name)
  if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == path:
    return name
  if os.path.dirname(path) not in sys.path:
    sys.path.insert(0, os.path.dirname(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except Exception as e:
    del sys.modules[name]
    raise ValueError(f"config.imports: {entry!r} failed to import: {_first_line(e)}") from e
  return name


def _import_recorded(entry: str, path: str) -> str:
  """Imports `entry` from `path`, the file it was imported from at training.

  A module name is imported by name with the folder that holds it (its package's
  parent, for a dotted name) on sys.path, so that it can import its neighbours
  as it did; a path entry is imported from the recorded absolute path.
  """
  if not os.path.isfile(path):
    raise ValueError(
        f"config.imports: cannot import {entry!r}: not found from {os.getcwd()}, and the file "
        f"recorded for it at training ({path}, WORKDIR/provenance.json) is gone; put its "
        f"folder on PYTHONPATH, or train with its path: "
        f"--config.imports='(\"/abs/path/{os.path.basename(path)}\",)'")
  root = None if _is_path(entry) else _package_root(entry, path)
  if root is None:
    return _import_file(entry, path)
  if root not in sys.path:
    sys.path.append(root)
  importlib.invalidate_caches()
  try:
    importlib.import_module(entry)
  except Exception as e:
    raise ValueError(f"config.imports: {entry!r} (recorded at training as {path}) failed to "
                     f"import: {_first_line(e)}") from e
  return entry


def _package_root(entry: str, path: str) -> str | None:
  """The folder that, on sys.path, makes module `entry` the file `path`
  (/x/a/b.py for a.b: /x), or None when the path does not spell the name."""
  stem = os.path.splitext(path)[0]
  if os.path.basename(stem) == "__init__":
    stem = os.path.dirname(stem)
  parts, folders = entry.split("."), stem.split(os.sep)
  if folders[-len(parts):] != parts:
    return None
  return os.sep.join(folders[:-len(parts)]) or os.sep


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


