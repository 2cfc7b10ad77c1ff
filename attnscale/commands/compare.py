r"""attnscale-compare: several runs side by side, from their metrics.jsonl: a PNG of their
training and validation curves and a table of their final numbers.

  attnscale-compare runs/char_cpu runs/char_cosine
  attnscale-compare runs/my_sweep --out=sweep.png           # a sweep folder: all its runs
  attnscale-compare runs/a runs/b --attention_layer=-1      # + the last layer's max logit, entropy

The same command as `python compare.py ...` at the repository root. A folder
without a config.json of its own is a sweep's (or any folder of runs): it stands
for the run directories directly inside it; a committed results store
(docs/results/<study>/runs.parquet, or one folder of it) is read as its runs. Each
curve is labelled by its run's own config (`labels.run_label`: the scaling and
the options that change attention), and runs that share a label by the config
fields in which they differ (learning_rate=0.002, seed=1). Nothing is trained or
evaluated: what the runs logged is what is drawn.
"""

from __future__ import annotations

import functools
import json
import math
import os
import types

from absl import app, flags

from attnscale.runtime import cli

# The table's columns; "-" where a run has not logged the value.
COLUMNS = ("run", "label", "step", "final train loss", "last val loss", "best val loss",
           "max logit", "training time")


def define_flags() -> types.SimpleNamespace:
  """Defines the command's flags (absl's global FLAGS); returns their holders."""
  return types.SimpleNamespace(
      out=flags.DEFINE_string("out", "compare.png", "The PNG to write (its folder is made)."),
      attention_layer=flags.DEFINE_integer(
          "attention_layer", None, "Also draw this layer's largest attention logit and mean "
          "entropy (train/attn/max_logit/layer_I, train/attn/entropy/layer_I; -1: the last "
          "layer), as the runs logged them (config.attn_metrics)."))


def run_dirs(paths: list[str]) -> list[tuple[str, str]]:
  """(what to call it, run directory) for each run that `paths` name, in order:
  a run directory (it has a config.json) is itself; any other folder stands for
  the run directories directly inside it (a sweep); a results store for its runs.

  Raises:
    ValueError: a path that does not exist, or a folder with no run in it (one line).
  """
  from attnscale.experiments import results_store
  out = []
  for path in paths:
    folder = results_store.workdir(path) if results_store.is_store(path) else path
    shown = results_store.shown(folder)
    if not os.path.isdir(folder):
      raise ValueError(f"{path} does not exist (from {os.getcwd()}): give run directories "
                       "or sweep folders")
    if _is_run(folder):
      out.append((shown, folder))
      continue
    inside = [name for name in sorted(os.listdir(folder)) if _is_run(os.path.join(folder, name))]
    if not inside:
      raise ValueError(f"{path} is neither a run directory (no config.json) nor a folder of "
                       "runs (no folder in it has one)")
    out += [(os.path.join(shown, name), os.path.join(folder, name)) for name in inside]
  return out


def _is_run(folder: str) -> bool:
  return os.path.isfile(os.path.join(folder, "config.json"))


def labels(configs: list[dict]) -> list[str]:
  """Each run's label: `labels.run_label` of its config, and for runs that share
  one, the fields in which their configs differ (bookkeeping aside:
  `configlib.RESUMABLE_CHANGES`)."""
  from attnscale.config import labels, migration
  from attnscale.runtime import configlib
  names = [labels.run_label(c) for c in configs]
  out = list(names)
  for name in set(names):
    group = [i for i, n in enumerate(names) if n == name]
    if len(group) < 2:
      continue
    differ = set()
    for i in group[1:]:
      differ |= {k for k, _, _ in migration.flat_diff(configs[group[0]], configs[i])
                 if k.split(".")[0] not in configlib.RESUMABLE_CHANGES + ("data_dir",)}
    for i in group:
      flat = _flatten(configs[i])
      extra = ", ".join(f"{k}={_short(flat.get(k))}" for k in sorted(differ))
      out[i] = f"{name} ({extra})" if extra else name
  return out


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out |= _flatten(v, f"{prefix}{k}.")
    else:
      out[f"{prefix}{k}"] = v
  return out


def _short(value) -> str:
  return f"{value:g}" if isinstance(value, float) else str(value)


def read(run_dir: str, attention_layer: int | None = None) -> dict:
  """A run's curves and final numbers from its metrics.jsonl (and config.json):
  {"config", "train": [(step, train/loss)], "val": [(step, val/loss)], and with
  `attention_layer`, "max_logit" and "entropy": [(step, value)] of that layer
  (negative: from the last), "step", "num_train_steps", "final_train_loss"
  (the last train/loss_last20), "max_logit_last" (the last row's largest logit
  over layers), "elapsed_s"}."""
  from attnscale.config import imports as config_imports
  from attnscale.config import migration
  from attnscale.runtime import metric_keys as keys
  from attnscale.runtime import metrics_writer, provenance
  with open(os.path.join(run_dir, "config.json")) as f:
    config = migration.migrate(json.load(f))
  # The run's own scalings and tasks (config.imports), from where training found
  # them, so that its label can name them from any folder.
  config_imports.import_modules(config, recorded=provenance.import_files(run_dir))
  rows = metrics_writer.read_rows(run_dir)
  series = lambda key: [(r["step"], r[key]) for r in rows if key in r]
  last = lambda key: next((r[key] for r in reversed(rows) if key in r), math.nan)
  out = {"config": config, "train": series(keys.LOSS), "val": series(keys.VAL_LOSS),
         "step": max((r["step"] for r in rows), default=0),
         "num_train_steps": config.get("num_train_steps"),
         "final_train_loss": last(keys.LOSS_LAST20), "elapsed_s": last(keys.ELAPSED_S)}
  logits = [[v for k, v in r.items() if k.startswith(keys.MAX_LOGIT)] for r in rows]
  out["max_logit_last"] = next((max(x) for x in reversed(logits) if x), math.nan)
  if attention_layer is not None:
    layer = attention_layer % config["model"]["num_layers"]
    out["max_logit"] = series(keys.attention_key(keys.MAX_LOGIT, layer))
    out["entropy"] = series(keys.attention_key(keys.ENTROPY, layer))
  return out


def table(names: list[str], run_labels: list[str], runs: list[dict]) -> list[dict]:
  """One row of final numbers per run (`COLUMNS`)."""
  from attnscale.runtime import run_summary
  rows = []
  for name, label, r in zip(names, run_labels, runs):
    vals = [v for _, v in r["val"]]
    rows.append({
        "run": name, "label": label, "step": f"{r['step']}/{r['num_train_steps']}",
        "final train loss": r["final_train_loss"],
        "last val loss": vals[-1] if vals else math.nan,
        "best val loss": min(vals) if vals else math.nan,
        "max logit": r["max_logit_last"],
        "training time": (run_summary.duration(r["elapsed_s"])
                          if math.isfinite(r["elapsed_s"]) else "-")})
  return rows


def figure(run_labels: list[str], runs: list[dict], attention_layer: int | None = None):
  """Training and validation loss against step, one line a run (and with
  `attention_layer`, that layer's max logit and entropy below them)."""
  from attnscale.experiments import reporting
  panels = [("train", "training loss (interval mean)"), ("val", "validation loss")]
  if attention_layer is not None:
    panels += [("max_logit", f"max attention logit, layer {attention_layer}"),
               ("entropy", f"attention entropy, layer {attention_layer} (nats)")]
  fig = reporting.new_figure(11, 4 * len(panels) // 2 + 0.2 * len(runs))
  axes = fig.subplots(len(panels) // 2, 2, squeeze=False).ravel()
  for ax, (key, title) in zip(axes, panels):
    for i, (label, r) in enumerate(zip(run_labels, runs)):
      if r[key]:
        steps, values = zip(*r[key])
        ax.plot(steps, values, color=reporting.style(i)["color"],
                linestyle=("-", "--", ":")[i // 10 % 3], marker="." if len(steps) < 20 else None,
                label=label)
    reporting.label_axes(ax, xlabel="step", ylabel="", title=title)
    if ax.get_legend() is not None:
      ax.get_legend().remove()
  # One legend for every panel (the colours are the runs'), below them, so that many
  # runs (a sweep) do not cover the curves.
  handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
  if handles:
    fig.legend(handles.values(), handles.keys(), loc="outside lower center",
               ncol=min(3, len(handles)), fontsize="small" if len(handles) > 8 else None)
  return fig


def compare(paths: list[str], out: str, attention_layer: int | None = None) -> str:
  """Writes `out` (a PNG of the runs that `paths` name) and returns the table of
  their final numbers, as Markdown.

  Raises:
    ValueError: a path that is not a run or a folder of runs, or `out` not a .png.
  """
  from attnscale.experiments import reporting
  if not out.endswith(".png"):
    raise ValueError(f"--out={out}: must name a .png file")
  found = run_dirs(paths)
  runs = [read(run_dir, attention_layer) for _, run_dir in found]
  run_labels = labels([r["config"] for r in runs])
  fig = figure(run_labels, runs, attention_layer)
  reporting.save_figure(fig, os.path.dirname(out) or ".", os.path.basename(out)[:-4])
  rows = table([name for name, _ in found], run_labels, runs)
  return reporting.to_markdown(rows, COLUMNS, floats=".4f", nan="-")


def main(holders: types.SimpleNamespace, argv: list[str]) -> None:
  paths = argv[1:]
  if not paths:
    cli.fail("give the run directories (or sweep folders) to compare: "
             "attnscale-compare runs/a runs/b")
  try:
    text = compare(paths, holders.out.value, holders.attention_layer.value)
  except (ValueError, FileNotFoundError) as e:
    cli.fail(str(e))
  print(text, end="")
  print(f"wrote {holders.out.value}")


def run() -> None:
  """The command line (attnscale-compare, compare.py)."""
  holders = define_flags()
  cli.set_help(__doc__, __name__)
  app.run(functools.partial(main, holders), flags_parser=cli.parse_flags)
