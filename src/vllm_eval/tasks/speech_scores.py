"""Speech-to-text scores as the field computes them.

* **WER and CER** (jiwer's ``process_words`` / ``process_characters``: substitutions, deletions, insertions by
  Levenshtein alignment), over the whole task (errors summed over recordings, divided by the references' words),
  on normalised texts: by default the Open ASR Leaderboard's normalisers, else OpenAI's originals or the basic one
  (:mod:`vllm_eval.tasks.asr_normalizers`), named with source and version in every result. Recordings whose
  reference normalises to nothing are left out and counted, as the leaderboard does. The raw WER (texts as they
  are, whitespace split) is reported too.
* **BLEU and chrF** (sacrebleu's corpus scores, its default tokeniser) for speech translation, on the raw texts.
"""

from __future__ import annotations

from typing import Any

from .asr_normalizers import DEFAULT_NORMALIZER, normalizer_for

__all__ = ["normalizer_for", "score", "scoring_languages"]


def scoring_languages(
    task: Any, rows: list[str | None], outputs: list[dict[str, Any]]
) -> tuple[list[str | None], list[str | None]]:
    """Each recording's language for its normaliser, and what decided it: ``"task"`` (the task's language; a
    translation is scored in English), ``"row"`` (the data row's), ``"model"`` (the language the model transcribed
    in: an English-only model's English), ``"detected"`` (detected by the model), or None (unknown: the basic
    normaliser). ``rows``: each recording's row language (or None); ``outputs``: the transcriber's (``language``,
    ``detected``), or empty dicts. An English-only Whisper given no language was once scored with the basic
    normaliser ("ten of clubs" against "10 of clubs" counted as an error)."""
    if task.task == "translate":
        return ["en"] * len(rows), ["task"] * len(rows)
    langs: list[str | None] = []
    sources: list[str | None] = []
    for row, out in zip(rows, outputs, strict=True):
        if task.language:
            lang, source = task.language, "task"
        elif row:
            lang, source = row, "row"
        elif out.get("language"):
            lang, source = out["language"], "detected" if out.get("detected") else "model"
        else:
            lang, source = None, None
        langs.append(lang)
        sources.append(source)
    return langs, sources


def _errors(references: list[str], hypotheses: list[str], unit: str) -> dict[str, Any]:
    """jiwer's alignment counts over non-empty references (``unit`` words or characters)."""
    import jiwer

    if not references:
        return {"rate": None, "substitutions": 0, "deletions": 0, "insertions": 0, "hits": 0}
    process = jiwer.process_words if unit == "words" else jiwer.process_characters
    out = process(references, hypotheses)
    n = out.substitutions + out.deletions + out.hits
    return {
        "rate": (out.substitutions + out.deletions + out.insertions) / n if n else None,
        "substitutions": out.substitutions,
        "deletions": out.deletions,
        "insertions": out.insertions,
        "hits": out.hits,
    }


def score(
    references: list[str],
    hypotheses: list[str],
    task: Any,
    languages: list[str | None] | None = None,
    normalizer: str = DEFAULT_NORMALIZER,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Score a task's hypotheses against its references.

    Args:
        references, hypotheses: one text per recording.
        task: the :class:`~vllm_eval.tasks.speech.SpeechTask` (its ``task`` and ``language``).
        languages: each recording's language for its normaliser (:func:`scoring_languages`); default the task's.
        normalizer: the normalisers' family (``leaderboard``, ``openai``, ``basic``: :func:`normalizer_for`).

    Raises:
        UsageError: an unknown ``normalizer``.

    Returns:
        (metrics, one dict per recording: ``reference_normalized``, ``hypothesis_normalized``, ``errors`` (word
        substitutions + deletions + insertions, None where left out), ``reference_words``). Metrics: ``wer``,
        ``cer`` (fractions; None without a scored recording), ``wer_raw``, the word counts ``substitutions``,
        ``deletions``, ``insertions``, ``reference_words``, ``n_samples``, ``n_scored``, ``normalizer``; for
        ``translate`` also ``bleu`` and ``chrf`` (sacrebleu, 0-100).
    """
    if languages is None:
        languages = scoring_languages(task, [None] * len(references), [{}] * len(references))[0]
    normalisers: dict[str | None, tuple[Any, str]] = {}
    refs_n, hyps_n, names = [], [], set()
    for ref, hyp, key in zip(references, hypotheses, languages, strict=True):
        if key not in normalisers:
            normalisers[key] = normalizer_for(key, normalizer)
        normalise, name = normalisers[key]
        names.add(name)
        refs_n.append(" ".join(normalise(ref).split()))
        hyps_n.append(" ".join(normalise(hyp).split()))
    kept = [i for i, r in enumerate(refs_n) if r]
    words = _errors([refs_n[i] for i in kept], [hyps_n[i] for i in kept], "words")
    chars = _errors([refs_n[i] for i in kept], [hyps_n[i] for i in kept], "characters")
    raw_kept = [i for i, r in enumerate(references) if r.split()]
    raw = _errors(
        [" ".join(references[i].split()) for i in raw_kept],
        [" ".join(hypotheses[i].split()) for i in raw_kept],
        "words",
    )
    metrics: dict[str, Any] = {
        "wer": words["rate"],
        "cer": chars["rate"],
        "wer_raw": raw["rate"],
        "substitutions": words["substitutions"],
        "deletions": words["deletions"],
        "insertions": words["insertions"],
        "reference_words": words["substitutions"] + words["deletions"] + words["hits"],
        "n_samples": len(references),
        "n_scored": len(kept),
        "normalizer": " + ".join(sorted(names)),
    }
    if task.task == "translate":
        import sacrebleu

        metrics["bleu"] = sacrebleu.corpus_bleu(hypotheses, [references]).score
        metrics["chrf"] = sacrebleu.corpus_chrf(hypotheses, [references]).score
    rows = []
    kept_set = set(kept)
    for i in range(len(references)):
        row = {"reference_normalized": refs_n[i], "hypothesis_normalized": hyps_n[i], "errors": None}
        if i in kept_set:
            one = _errors([refs_n[i]], [hyps_n[i]], "words")
            row["errors"] = one["substitutions"] + one["deletions"] + one["insertions"]
        row["reference_words"] = len(refs_n[i].split())
        rows.append(row)
    return metrics, rows
