"""Multiple-choice evaluation: prompt templates, answer extraction, metrics.

Answer formats (``answer_format``):

* ``json``  — the model ends with ``{"answer": "<choice>"}``; the last JSON object in the output is
  repaired with ``json_repair`` (missing quotes/braces, trailing commas) before parsing;
* ``xml``   — ``<answer>choice</answer>``; the last tag wins, an unclosed last tag is accepted;
* ``boxed`` — ``\\boxed{choice}``; the last box wins;
* ``raw``   — the last line of the output is the choice.

A choice is named by its letter (``A``, ``(b)``, ``C.``) when ``letters`` is on, or by its text;
matching is case-insensitive and ignores surrounding punctuation and whitespace. An output with no
recognisable choice is *missing*: it is counted, wrong for accuracy and F1, and the run fails
when the count exceeds the missing budget.

Reasoning models (``think_end_token``, e.g. ``</think>``): the answer is read after the reasoning
(:func:`split_reasoning`); a model that stops before closing its reasoning gives no answer.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..models.generator.base import reasoning_opening
from ..utils.errors import MissingAnswersError, UsageError

__all__ = [
    "ANSWER_FORMATS",
    "MCItem",
    "MissingAnswersError",
    "build_prompt",
    "extract_answer",
    "match_option",
    "mc_metrics",
    "split_reasoning",
]

AnswerFormat = Literal["json", "xml", "boxed", "raw"]
ANSWER_FORMATS: tuple[str, ...] = ("json", "xml", "boxed", "raw")
LETTERS = string.ascii_uppercase


@dataclass(frozen=True)
class MCItem:
    """One multiple-choice sample.

    Attributes:
        id: stable sample id.
        question: the question text (the prompt template wraps it).
        options: the choices, in order; the target is an index into them.
        target: index of the correct option.
        images: images shown with the question (PIL images or arrays), possibly empty.
    """

    id: str
    question: str
    options: tuple[str, ...]
    target: int
    images: tuple[Any, ...] = field(default=(), compare=False, repr=False)


_FORMAT_INSTRUCTIONS = {
    "json": 'Give your final answer as JSON: {{"answer": "<{what}>"}}',
    "xml": "Give your final answer between tags: <answer><{what}></answer>",
    "boxed": "Give your final answer as \\boxed{{<{what}>}}",
    "raw": "Give only your final answer, the {what}, on the last line.",
}


def build_prompt(
    item: MCItem, answer_format: AnswerFormat = "json", *, letters: bool = True, reasoning: bool = False
) -> str:
    """The user-turn text for ``item``: question, options, and how to answer.

    Args:
        answer_format: one of :data:`ANSWER_FORMATS`.
        letters: list options as ``A. ...`` and ask for the letter; else ask for the option text.
        reasoning: ask for brief reasoning before the final answer.

    Raises:
        UsageError: an unknown answer format, or more options than letters.
    """
    if answer_format not in _FORMAT_INSTRUCTIONS:
        raise UsageError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    if letters and len(item.options) > len(LETTERS):
        raise UsageError(f"{len(item.options)} options exceed the {len(LETTERS)} letters")
    if letters:
        listed = "\n".join(f"{LETTERS[i]}. {opt}" for i, opt in enumerate(item.options))
        what = "letter of the correct option"
    else:
        listed = "\n".join(f"- {opt}" for opt in item.options)
        what = "correct option, exactly as written"
    lead = "Think step by step briefly, then answer." if reasoning else "Answer directly, without explanation."
    return f"{item.question}\n\nOptions:\n{listed}\n\n{lead} {_FORMAT_INSTRUCTIONS[answer_format].format(what=what)}"


_STRIP = string.punctuation.replace("+", "").replace("-", "") + " \t\n\"'`"


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().strip(_STRIP).casefold()


def match_option(answer: Any, options: Sequence[str], *, letters: bool = True) -> int | None:
    """Index of the option ``answer`` names, or None.

    With ``letters``, a single letter (``"B"``, ``"(b)"``, ``"B."``, ``"B) text"``) names an option;
    the option text itself is always accepted. Case-insensitive.
    """
    if answer is None:
        return None
    text = _norm(answer)
    if not text:
        return None
    normed = [_norm(o) for o in options]
    if text in normed:
        return normed.index(text)
    if letters:
        m = re.fullmatch(r"\(?([a-z])\)?(?:[.):]\s*(.*))?", text)
        if m:
            i = ord(m.group(1)) - ord("a")
            if 0 <= i < len(options) and (not m.group(2) or _norm(m.group(2)) == normed[i]):
                return i
    return None


def _last_json_answer(output: str) -> Any:
    import json_repair

    starts = [m.start() for m in re.finditer(r"\{", output)]
    for start in reversed(starts):  # last object wins; repair tolerates a missing closing brace
        try:
            obj = json_repair.loads(output[start:])
        except Exception:  # json_repair raises on hopeless input; try the previous brace
            continue
        if isinstance(obj, dict):
            for key, value in obj.items():
                if str(key).strip().casefold() == "answer":
                    return value
    return None


def split_reasoning(output: str, think_end_token: str | None, prompt: str = "") -> tuple[str | None, str | None]:
    """``(reasoning, answer text)`` of one output of a reasoning model.

    - No ``think_end_token``: ``(None, output)``.
    - The token occurs: the text before its last occurrence (less the opening tag) is the reasoning,
      the text after it the answer (lm-evaluation-harness's ``think_end_token`` split).
    - It does not, but the reasoning was opened (the output starts with the opening tag, ``<think>``
      for ``</think>``, or the rendered ``prompt`` ends with it): ``(output, None)``, no answer. The
      model stopped while reasoning (at ``max_tokens``, usually), and a choice named in its reasoning
      is not its answer (scoring it as one is lm-evaluation-harness issue #3382).
    - Otherwise the model answered without reasoning: ``(None, output)``.
    """
    if not think_end_token:
        return None, output
    if think_end_token in output:
        reasoning, _, answer = output.rpartition(think_end_token)
        opening = reasoning_opening(think_end_token)
        reasoning = reasoning.strip()
        if opening and reasoning.startswith(opening):
            reasoning = reasoning[len(opening) :].strip()
        return reasoning, answer
    opening = reasoning_opening(think_end_token)
    if opening and (output.lstrip().startswith(opening) or prompt.rstrip().endswith(opening)):
        return output, None
    return None, output


def extract_answer(
    output: str, answer_format: AnswerFormat, options: Sequence[str], *, letters: bool = True
) -> int | None:
    """The option index an ``output`` gives in ``answer_format``, or None when it gives none.

    Raises:
        UsageError: an unknown answer format.
    """
    if answer_format == "json":
        raw: Any = _last_json_answer(output)
    elif answer_format == "xml":
        closed = re.findall(r"<answer>\s*(.*?)\s*</answer>", output, flags=re.IGNORECASE | re.DOTALL)
        if closed:
            raw = closed[-1]
        else:
            m = re.search(r"<answer>\s*([^<\n]*)\s*$", output, flags=re.IGNORECASE)
            raw = m.group(1) if m else None
    elif answer_format == "boxed":
        boxes = re.findall(r"\\boxed\{\s*([^{}]*?)\s*\}", output)
        raw = boxes[-1] if boxes else None
    elif answer_format == "raw":
        lines = [ln for ln in output.strip().splitlines() if ln.strip()]
        raw = lines[-1] if lines else None
        if raw is not None:
            raw = re.sub(r"^(final\s+)?answer\s*[:\-]\s*", "", raw.strip(), flags=re.IGNORECASE)
    else:
        raise UsageError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    return match_option(raw, options, letters=letters)


def mc_metrics(targets: Sequence[int], predictions: Sequence[int | None], n_options: int) -> dict[str, float]:
    """Accuracy and macro F1 over the options; a missing prediction (None) is wrong for both.

    Macro F1 averages per-option F1 over the ``n_options`` classes (scikit-learn ``f1_score``
    with ``labels=range(n_options)``): a missing answer is a false negative for its true class and
    a false positive for none.
    """
    from sklearn.metrics import f1_score

    y_pred = [-1 if p is None else int(p) for p in predictions]
    n = len(targets)
    accuracy = sum(int(p == t) for p, t in zip(y_pred, targets)) / n if n else 0.0
    f1 = float(f1_score(list(targets), y_pred, labels=list(range(n_options)), average="macro", zero_division=0))
    missing = sum(p is None for p in predictions)
    return {
        "accuracy": accuracy,
        "macro_f1": f1,
        "missing": float(missing),
        "missing_rate": missing / n if n else 0.0,
        "n_samples": float(n),
    }
