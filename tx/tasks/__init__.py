"""tx.tasks: objectives (loss + metrics + batch spec), separate from networks."""

from tx.tasks.base import Task, summarize, sum_leaves
from tx.tasks.objectives import TASKS, CausalLMTask, MLMTask, Seq2SeqTask, make_task
