"""One error type for the package's own errors; the CLI prints one line and the error's exit code."""

from __future__ import annotations

import pytest

from vllm_eval import cli
from vllm_eval.utils import errors


@pytest.mark.parametrize(
    "error, code",
    [
        (errors.UsageError, 2),
        (errors.OptionError, 2),
        (errors.ModelNotFoundError, 2),
        (errors.UnknownNameError, 2),
        (errors.DataUnavailableError, 2),
        (errors.EngineError, 1),
        (errors.ReplicaError, 1),
        (errors.EndpointError, 1),
        (errors.MissingAnswersError, 1),
    ],
)
def test_each_error_is_one_line_with_its_exit_code(cli_in_process, monkeypatch, error, code):
    def fail(args, ctx):
        raise error("first line\n  second line of vLLM's reason")

    monkeypatch.setattr(cli.COMMANDS["tasks"], "execute", fail)
    got, err = cli_in_process("tasks")
    assert got == code
    assert err == "vllm-eval: error: first line second line of vLLM's reason\n"
    assert issubclass(error, errors.VllmEvalError)


def test_a_bug_keeps_its_traceback(cli_in_process, monkeypatch):
    def bug(args, ctx):
        raise TypeError("an internal bug")

    monkeypatch.setattr(cli.COMMANDS["tasks"], "execute", bug)
    with pytest.raises(TypeError, match="an internal bug"):
        cli_in_process("tasks")


def test_library_callers_catching_builtins_still_work():
    assert issubclass(errors.UsageError, ValueError)
    assert issubclass(errors.OptionError, TypeError)
    assert issubclass(errors.ModelNotFoundError, FileNotFoundError)
    assert issubclass(errors.UnknownNameError, KeyError)
    assert str(errors.UnknownNameError("unknown x")) == "unknown x"  # not KeyError's quoted repr


def test_reference_backends_take_vllm_and_torch_dtype_names():
    from vllm_eval.models.base import torch_dtype_name

    assert [torch_dtype_name(d) for d in ("float", "half", "bf16", "float32")] == [
        "float32",
        "float16",
        "bfloat16",
        "float32",
    ]
    assert torch_dtype_name("auto", allow_auto=True) == "auto"
    with pytest.raises(errors.UsageError, match="dtype must be one of .* got .auto."):
        torch_dtype_name("auto")
    with pytest.raises(errors.UsageError, match="got .float64."):
        torch_dtype_name("float64", allow_auto=True)
