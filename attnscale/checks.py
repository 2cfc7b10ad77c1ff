"""One-line checks of config values, shared by every layer that validates a field.

Each raises a ValueError naming the field and what is allowed. Imports nothing
of attnscale (the standard library only).

A name that is not allowed gets the fix in the same line (`choice_error`): the
registered name it is closest to ("did you mean"), or, when a .py file under the
current folder registers it (`@...register("name")`) but was not imported, that
the file belongs in config.imports.
"""

from __future__ import annotations

import difflib
import os
import re


def check_choice(field: str, value, allowed) -> None:
  if value not in allowed:
    raise ValueError(choice_error(field, value, allowed))


def check_positive(field: str, value, *, allow_zero: bool = False) -> None:
  ok = value >= 0 if allow_zero else value > 0
  if not ok:
    raise ValueError(f"{field} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def choice_error(field: str, value, allowed) -> str:
  """"FIELD must be one of [...], got VALUE" and the hint that names the fix: the
  file under the current folder that registers VALUE but was not imported (add it
  to config.imports), else the closest allowed name, if one is close."""
  message = f"{field} must be one of {list(allowed)}, got {value!r}"
  if not isinstance(value, str):
    return message
  path = unimported_registration(value)
  if path is not None:
    entry = path[:-3] if os.sep not in path else path  # a module name, or the file's path
    return (f"{message} ({path} registers {value!r} but is not imported: add it to "
            f"config.imports, --config.imports='(\"{entry}\",)')")
  close = difflib.get_close_matches(value, [str(a) for a in allowed], n=1)
  return f"{message} (did you mean {close[0]!r}?)" if close else message


# What `unimported_registration` does not look into: environments, caches, run folders.
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "runs", "venv"}


def unimported_registration(name: str, root: str = ".", *, max_depth: int = 3,
                            max_files: int = 2000) -> str | None:
  """The path (relative to `root`) of a .py file within `max_depth` folders of `root`
  that registers `name` and is not imported, or None. A registration is a
  decorator, `@<anything>register("name"` (scalings, trackers), or an entry of a
  registry table, `VARIANTS["name"] = ...` (model variants, tasks: any all-caps name).

  A user's scaling, variant or task in a file of their own is registered only when
  config.imports imports it; this finds the file to name. Hidden folders, virtual
  environments and run folders are skipped, and at most `max_files` files read.
  """
  import sys
  quoted = r"\s*[\"']" + re.escape(name) + r"[\"']\s*"
  pattern = re.compile(rf"@[\w.]*register\({quoted}|\b[A-Z][A-Z_]*\[{quoted}\]\s*=[^=]")
  imported = {os.path.abspath(m.__file__) for m in list(sys.modules.values())
              if getattr(m, "__file__", None)}
  root = os.path.abspath(root)
  seen = 0
  for folder, dirs, files in os.walk(root):
    depth = os.path.relpath(folder, root).count(os.sep) + (folder != root)
    dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                     and depth < max_depth)
    for file in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(folder, file)
      seen += 1
      if seen > max_files:
        return None
      if path in imported:
        continue
      try:
        with open(path, encoding="utf-8", errors="replace") as f:
          if pattern.search(f.read(200_000)):
            return os.path.relpath(path, root)
      except OSError:
        continue
  return None
