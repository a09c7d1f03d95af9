"""The subcommands, one module each; :data:`COMMANDS` is the list ``vllm-eval`` builds its parser from.

A new subcommand is one module with a :class:`~vllm_eval.cli.base.Command` subclass and one entry here.
"""

from __future__ import annotations

from .bench import BenchCommand
from .classify import ClassifyCommand
from .compare import CompareCommand
from .generate import GenerateCommand
from .models import ModelsCommand
from .report import ReportCommand
from .rerank import RerankCommand
from .reward import RewardCommand
from .run import RunCommand
from .tasks import TasksCommand
from .token_classify import TokenClassifyCommand
from .transcribe import TranscribeCommand

COMMANDS = [
    RunCommand,
    RerankCommand,
    GenerateCommand,
    ClassifyCommand,
    RewardCommand,
    TokenClassifyCommand,
    TranscribeCommand,
    BenchCommand,
    CompareCommand,
    ReportCommand,
    ModelsCommand,
    TasksCommand,
]
