"""Tasks: what a config trains on, chosen by `config.task`.

    char_lm  char_lm.CharLMTask  next-character LM (nanoGPT's shakespeare_char;
                                 config.dataset: tiny Shakespeare or WikiText-2 chars)
    mlm      mlm.MLMTask         BERT masked-LM pretraining on WikiText
    token_lm token_lm.TokenLMTask next-token LM on pre-tokenized shards (GPT-2 on
                                 OpenWebText / FineWeb: nanoGPT's or llm.c's .bin files)

The synthetic probes (generated on the fly from the seed, scored by exact match;
`synthetic.SyntheticTask`, arguments in `config.probe`, configs/probes.py):

    trigger       trigger.TriggerTask   Ran-Milo 2026's trigger-conditional task
                                        (softmax must form a sink)
    mqar          mqar.MQARTask         Zoology's multi-query associative recall
    max_retrieval max_retrieval.MaxRetrievalTask  the running max of Velickovic et
                                        al. 2024 (sharpness as the items grow)

Every task implements the contract of `base.Task` (base.py; losses.py: the
cross-entropy sums and output-logit health they share); train.py, eval.py and the
studies call only that. A new task is one file with a `Task` subclass plus one
line in `TASKS`; its own config fields are its `CONFIG_FIELDS`.

May import checks, fields, core, numerics, models and data.
"""

from __future__ import annotations

from attnscale import checks
from attnscale.tasks.base import Sampler, Task, cross_entropy, this_process_rows
from attnscale.tasks.char_lm import CharLMTask, sample
from attnscale.tasks.max_retrieval import MaxRetrievalTask
from attnscale.tasks.mlm import MLMTask, padding_mask
from attnscale.tasks.mqar import MQARTask
from attnscale.tasks.synthetic import SyntheticTask
from attnscale.tasks.token_lm import TokenLMTask
from attnscale.tasks.trigger import TriggerTask

TASKS: dict[str, type[Task]] = {
    "char_lm": CharLMTask,
    "mlm": MLMTask,
    "token_lm": TokenLMTask,
    "trigger": TriggerTask,
    "mqar": MQARTask,
    "max_retrieval": MaxRetrievalTask,
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


__all__ = ["CharLMTask", "MLMTask", "MQARTask", "MaxRetrievalTask", "Sampler", "SyntheticTask",
           "TASKS", "Task", "TokenLMTask", "TriggerTask", "cross_entropy", "get_task",
           "padding_mask", "sample", "task_class", "this_process_rows"]
