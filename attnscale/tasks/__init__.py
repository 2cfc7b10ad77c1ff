"""Tasks: what a config trains on, chosen by `config.task`.

    char_lm  char_lm.CharLMTask  next-character LM (nanoGPT's shakespeare_char;
                                 config.dataset: tiny Shakespeare or WikiText-2 chars)
    mlm      mlm.MLMTask         BERT masked-LM pretraining on WikiText
    token_lm token_lm.TokenLMTask next-token LM on pre-tokenized shards (GPT-2 on
                                 OpenWebText / FineWeb: nanoGPT's or llm.c's .bin files)

Every task implements the contract of `base.Task`; train.py, eval.py and the
studies call only that. A new task is one file with a `Task` subclass plus one
line in `TASKS`.
"""

from __future__ import annotations

from attnscale import checks
from attnscale.tasks.base import Sampler, Task, cross_entropy, this_process_rows
from attnscale.tasks.char_lm import CharLMTask, sample
from attnscale.tasks.mlm import MLMTask, padding_mask
from attnscale.tasks.token_lm import TokenLMTask

TASKS: dict[str, type[Task]] = {
    "char_lm": CharLMTask,
    "mlm": MLMTask,
    "token_lm": TokenLMTask,
}


def task_class(config) -> type[Task]:
  """The class `config.task` names; a one-line ValueError for an unknown name."""
  checks.check_choice("config.task", config.task, TASKS)
  return TASKS[config.task]


def get_task(config) -> Task:
  """The task of `config`, its fields checked (before any data loads), its data loaded."""
  cls = task_class(config)
  cls.validate_config(config)
  return cls(config)


__all__ = ["CharLMTask", "MLMTask", "Sampler", "TASKS", "Task", "TokenLMTask", "cross_entropy",
           "get_task", "padding_mask", "sample", "task_class", "this_process_rows"]
