"""What the entry points (train.py, eval.py, sweep.py, compile.py and their
attnscale-* commands, attnscale/commands/) share: every bad flag ends in one
`error: ...` line that names the flag or config field, never in a traceback;
`--config` found from any folder (`config_files.resolve`); and the multi-host
flags (`--multihost` and the three values of `jax.distributed.initialize`).

    app.run(main, flags_parser=functools.partial(cli.parse_flags, config_flag="config"))
    cli.check_workdir(_WORKDIR.value)
    _MULTIHOST = cli.define_multihost_flags()  # at import; in main, before any JAX:
    cli.initialize_multihost(_MULTIHOST)

absl and ml_collections report a bad flag in ways a user cannot act on: a
config file that does not exist surfaces as an OSError at the config's first
use, an override of a field the config lacks as `AttributeError: "'nosuch'"`
(without the path), a value of the wrong type as `invalid literal for int()`
(without the field). `parse_flags` turns each into one line. Imports no JAX:
an entry point fails in a second.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from typing import NoReturn

from absl import flags

from attnscale.runtime import config_files


def fail(message: str) -> NoReturn:
  """Exits with status 1 after printing `error: message` to stderr."""
  sys.exit(f"error: {message}")


def stop_after_early_ctrl_c(what: str) -> NoReturn:
  """Exits 130 after a Ctrl-C outside the training loop's handler (start-up,
  compilation, the last save), printing that nothing was saved.

  `os._exit`, not `sys.exit`: the Ctrl-C can land while XLA compiles on its own
  threads, and the interpreter's finalisation then frees what they still use (a
  packed run interrupted 11 s into start-up exited with a segmentation fault, rc
  139, before this). By the time this runs the exception has unwound the run's
  `with` and `finally` blocks: its locks are released and its metric writers and
  checkpoint manager closed, so nothing is left for finalisation to do.
  """
  print(f"Ctrl-C outside the training steps: stopped without saving; rerunning the same "
        f"command resumes {what}", file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(130)


def reexec_with_tunables() -> None:
  """train's and eval's first step: re-executes with the malloc tunables (1.3-2x
  faster steps on CPU: attnscale/runtime/hostmem.py); a bad ATTNSCALE_MALLOC exits
  with one line."""
  from attnscale.runtime import hostmem
  try:
    hostmem.reexec_with_tunables()
  except ValueError as e:
    sys.exit(f"error: {e}")


def set_help(doc: str, module: str) -> None:
  """--help for the running script: `doc` where it has no docstring of its own (a
  console script's, attnscale-train; the repository's train.py keeps its own),
  and the flags that `module` defined (absl lists the main module's own).
  """
  main = sys.modules.get("__main__")
  if main is not None and not getattr(main, "__doc__", None):
    main.__doc__ = doc
  for flag in flags.FLAGS.flags_by_module_dict().get(module, []):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def parse_flags(argv: list[str], *, config_flag: str | None = None,
                config_file_flag: str | None = None) -> list[str]:
  """absl's flag parsing (for `app.run(flags_parser=...)`); a bad flag exits
  with one `error:` line.

  Args:
    argv: the command line.
    config_flag: the name of a `config_flags.DEFINE_config_file` flag, whose
      file and `--NAME.field=value` overrides are checked too; None if none.
    config_file_flag: the name of a string flag that names a config file
      (sweep.py's --config); None if none.

  Returns:
    The arguments that are not flags (absl's return value).
  """
  for name in (config_flag, config_file_flag):
    if name is not None:  # a config by name or path, from any folder
      argv = resolve_config_flag(argv, name)
  try:
    remaining = flags.FLAGS(argv)
    if config_flag is not None:
      # config_flags defers a failure to load the file to the config's first
      # use: make that use happen here, where it can be reported.
      config = flags.FLAGS[config_flag].value
      if config is not None:
        config.keys()
    return remaining
  except flags.Error as e:
    fail(flag_error_message(e))
  except OSError as e:
    if config_flag is None:
      raise
    fail(config_file_message(config_flag, _flag_value(argv, config_flag), e))
  except (AttributeError, KeyError):
    # An override of a field the config lacks; anything else is a real bug.
    message = config_flag and _unknown_override_message(argv, config_flag)
    if not message:
      raise
    fail(message)


def flag_error_message(error: flags.Error) -> str:
  """One line for an absl flag error, naming the flag.

  absl says `flag --NAME=VALUE: why`; when the parser was a config file's
  `get_config`, config_flags appends the whole traceback: its last line is
  the config's own one-line ValueError.
  """
  lines = str(error).strip().splitlines()
  match = re.match(r"flag --([\w.-]+)=(.*?): (.*)", lines[0])
  if len(lines) > 1:
    why = lines[-1].split(": ", 1)[-1]
    return f"--{match.group(1)}: {why}" if match else why
  if not match:  # unknown flag, missing required flag, ...
    return lines[0]
  name, value, why = match.groups()
  if f"--{name}" in why:
    return why
  kind = flags.FLAGS[name].flag_type() if name in flags.FLAGS else ""
  if kind == "bool":  # absl's why is a tuple's repr
    return f"--{name}={value}: expected a bool (true or false)"
  if kind in ("int", "float"):
    return f"--{name}={value}: expected {'an' if kind == 'int' else 'a'} {kind} ({why})"
  return f"--{name}={value}: {why}"


def resolve_config_flag(argv: list[str], name: str) -> list[str]:
  """argv with `--name=FILE[:ARG]` (or `--name FILE[:ARG]`) found from any folder
  (`config_files.resolve`); exits with one `error:` line when FILE is nowhere."""
  argv = list(argv)
  for i, arg in enumerate(argv):
    if arg == "--":
      break
    if re.fullmatch(rf"--?{re.escape(name)}=.*", arg):
      key, value = arg.split("=", 1)
      argv[i] = f"{key}={_resolved(value, name)}"
    elif re.fullmatch(rf"--?{re.escape(name)}", arg) and i + 1 < len(argv):
      argv[i + 1] = _resolved(argv[i + 1], name)
  return argv


def _resolved(value: str, name: str) -> str:
  try:
    return config_files.resolve(value, flag=name)
  except ValueError as e:
    fail(str(e))


def config_file_message(flag: str, value: str | None, error: Exception) -> str:
  """One line for a config file that could not be loaded."""
  path = (value or "").split(":", 1)[0]
  if not os.path.exists(path):
    return f"--{flag}={value}: no such config file {path!r}"
  return f"--{flag}={value}: cannot load the config file ({str(error).strip().splitlines()[-1]})"


def override_error(path: str, config, *, renamed: Mapping[str, str] | None = None,
                   flag: str = "config") -> str:
  """The one line for `--FLAG.PATH=...` when `config` has no field PATH.

  Args:
    path: the dotted field path the override names (`model.nosuch`).
    config: the config (a ConfigDict or a nested dict) it was meant for.
    renamed: old dotted path -> new dotted path; None reads
      `attnscale.config.schema.RENAMED_FIELDS` now (it changes as fields move).
    flag: the config flag's name.

  Returns:
    The message: the replacement when the field (or a parent of it) was renamed,
    else the close matches among the parent's fields (or all of them).
  """
  hint = lambda old: ""
  if renamed is None:
    from attnscale.config import schema
    renamed, hint = schema.RENAMED_FIELDS, schema.value_hint
  parts = path.split(".")
  for i in range(len(parts), 0, -1):
    old = ".".join(parts[:i])
    if old in renamed:
      new = ".".join([renamed[old], *parts[i:]])
      return (f"--{flag}.{path}: field {old} was renamed to {renamed[old]}: use --{flag}.{new}"
              f"{hint(old)}")
  parent, depth = config, 0
  while depth < len(parts) - 1 and _has_key(parent, parts[depth]):
    parent, depth = parent[parts[depth]], depth + 1
  where = ".".join(parts[:depth])
  known = sorted(parent.keys()) if hasattr(parent, "keys") else []
  close = difflib.get_close_matches(parts[depth], known, n=3)
  prefix = f"{where}." if where else ""
  if close:
    hint = "did you mean " + " or ".join(f"{prefix}{c}" for c in close) + "?"
  else:
    hint = f"{where or 'the config'} has {', '.join(known)}"
  return f"--{flag}.{path}: the config has no field {prefix}{parts[depth]} ({hint})"


def workdir_problem(path: str, *, flag: str = "workdir") -> str | None:
  """Why `path` cannot be a run directory (it, or a parent, is a file), or None."""
  probe = os.path.abspath(path)
  while not os.path.exists(probe) and os.path.dirname(probe) != probe:
    probe = os.path.dirname(probe)
  if os.path.isdir(probe):
    return None
  if probe == os.path.abspath(path):
    return f"--{flag}={path}: is a file, not a directory"
  return f"--{flag}={path}: {probe} is a file, not a directory"


def check_workdir(path: str, *, flag: str = "workdir") -> None:
  """Exits with one `error:` line if `path` cannot be a run directory."""
  problem = workdir_problem(path, flag=flag)
  if problem:
    fail(problem)


def define_data_progress_flag() -> flags.FlagHolder:
  """--data_progress: TFDS's progress bars while a dataset is prepared (the first run on
  a data_dir), instead of one line (`attnscale.data.paths`)."""
  return flags.DEFINE_bool(
      "data_progress", False, "Show TFDS's progress bars and messages while a dataset is "
      "prepared (the first run on a data_dir); default: one line.")


def set_data_progress(holder: flags.FlagHolder) -> None:
  """Passes --data_progress on to the data pipelines (and any process started from here)."""
  if holder.value:
    from attnscale.data import paths
    os.environ[paths.VERBOSE_ENV_VAR] = "1"


@dataclasses.dataclass(frozen=True)
class MultihostFlags:
  """The flag holders `define_multihost_flags` defines."""

  multihost: flags.FlagHolder
  coordinator_address: flags.FlagHolder
  num_processes: flags.FlagHolder
  process_id: flags.FlagHolder


def define_multihost_flags() -> MultihostFlags:
  """Defines --multihost, --coordinator_address, --num_processes, --process_id.

  The last three are `jax.distributed.initialize`'s arguments of those names:
  left out, JAX reads $JAX_COORDINATOR_ADDRESS or detects the cluster (Cloud
  TPU, SLURM, Open MPI, Kubernetes); JAX itself reads no environment variable
  for the other two. Elsewhere (several GPU machines without a scheduler, two
  processes on a laptop) give all three.
  """
  return MultihostFlags(
      multihost=flags.DEFINE_bool(
          "multihost", False, "One of several processes: call jax.distributed.initialize() "
          "(TPU pods, SLURM, Open MPI detected; elsewhere give the three flags below)."),
      coordinator_address=flags.DEFINE_string(
          "coordinator_address", None, "With --multihost: HOST:PORT of process 0's "
          "coordinator, the same in every process (default: $JAX_COORDINATOR_ADDRESS or "
          "the cluster's)."),
      num_processes=flags.DEFINE_integer(
          "num_processes", None, "With --multihost: how many processes (default: the "
          "cluster's).", lower_bound=1),
      process_id=flags.DEFINE_integer(
          "process_id", None, "With --multihost: this process, 0 ... num_processes - 1 "
          "(default: the cluster's).", lower_bound=0))


def initialize_multihost(multihost: MultihostFlags) -> None:
  """Calls `jax.distributed.initialize` under --multihost; before any JAX call.

  Exits with one `error:` line when one of the three values is given without
  --multihost, or initialization fails (e.g. nothing says how many processes).
  Multi-process CPU runs use JAX's default CPU collectives (gloo).
  """
  given = [f"--{name}" for name in ("coordinator_address", "num_processes", "process_id")
           if getattr(multihost, name).value is not None]
  if not multihost.multihost.value:
    if given:
      fail(f"{given[0]} needs --multihost")
    return
  import jax
  try:
    jax.distributed.initialize(coordinator_address=multihost.coordinator_address.value,
                               num_processes=multihost.num_processes.value,
                               process_id=multihost.process_id.value)
  except (ValueError, TypeError, RuntimeError) as e:
    why = (str(e).strip().splitlines() or [type(e).__name__])[0]
    fail(f"--multihost: jax.distributed.initialize() failed ({why}); outside a TPU, SLURM "
         "or Open MPI cluster give --coordinator_address=HOST:PORT, --num_processes=N and "
         "--process_id=I")


def _has_key(tree, key: str) -> bool:
  return hasattr(tree, "keys") and key in tree.keys()


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--name=V` or `--name V` in argv (the last one), else None."""
  value = None
  for i, arg in enumerate(argv):
    if re.fullmatch(rf"--?{re.escape(name)}=.*", arg):
      value = arg.split("=", 1)[1]
    elif re.fullmatch(rf"--?{re.escape(name)}", arg) and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def _unknown_override_message(argv: list[str], flag: str) -> str | None:
  """The message for the first `--FLAG.path=...` override naming no field, if any."""
  value = _flag_value(argv, flag)
  if value is None:
    return None
  file, *arg = value.split(":", 1)  # as config_flags splits it
  spec = importlib.util.spec_from_file_location(f"_{flag}_file", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(*arg)
  for a in argv:
    match = re.match(rf"--?(?:no)?{re.escape(flag)}\.([^=]+)", a)
    if match and not _has_path(config, match.group(1)):
      return override_error(match.group(1), config, flag=flag)
  return None


def _has_path(config, path: str) -> bool:
  for key in path.split("."):
    if not _has_key(config, key):
      return False
    config = config[key]
  return True
