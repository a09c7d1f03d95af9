"""Log-likelihood multiple choice on a GPU: one request per context for one-token options, against
one request per option (prompt_logprobs), on a Qwen3-0.6B-shaped random LM (vocab 151,936).

Run on the lent machine after vLLM is staged (see scripts/gpu_bench.sh):
    source .devstage/bin/on-device.sh && python3 scripts/gpu_loglik.py $OUT [N_QUESTIONS]
Weights are random: the scores mean nothing; speed and the agreement of the two paths are measured.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def build(path: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vllm_eval.testing import tiny_tokenizer

    if (path / "config.json").is_file():
        return path
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None, torch_dtype="bfloat16",
    )  # fmt: skip
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def main() -> None:
    import numpy as np

    from vllm_eval.models.generator.vllm import VllmGenerator
    from vllm_eval.tasks.data import lee_background_documents, lee_documents

    out = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    model = build(Path(os.environ.get("MODELS_DIR", "/root/models")) / "qwen3-0.6b-lm-151k")
    docs = lee_background_documents()
    # A five-shot prefix shared by every question (about 1,000 tokens), then the question (about 100).
    prefix = "\n\n".join(f"Passage: {d[:600]}\nAnswer: {'ABCD'[i % 4]}" for i, d in enumerate(docs[:5]))
    questions = [f"{prefix}\n\nPassage: {d[:400]}\nWhich option is right?" for d in (docs * 10)[:n]]
    letters = ["A", "B", "C", "D"]
    contexts = [q for q in questions for _ in letters]
    conts = letters * len(questions)
    gen = VllmGenerator(str(model), dtype="bfloat16", max_model_len=40960, show_progress_bar=False, chunk_size=100_000)
    rows, scores = {}, {}
    gen.loglikelihoods(contexts[:64], conts[:64])  # warm-up
    for shared in (False, True, False, True):
        gen.shared_context_scoring = shared
        t = time.perf_counter()
        scores[shared] = gen.loglikelihoods(contexts, conts)
        s = time.perf_counter() - t
        key = "one request per context" if shared else "one request per option (prompt_logprobs)"
        rows[key] = {"seconds": round(s, 2), "questions_per_s": round(n / s, 1)}
        print(f"{key}: {n} questions x 4 options in {s:.2f} s = {n / s:,.1f} questions/s", flush=True)
    delta = float(np.abs(scores[True] - scores[False]).max())
    agree = float(np.mean(scores[True].reshape(-1, 4).argmax(1) == scores[False].reshape(-1, 4).argmax(1)))
    print(f"max |delta| between the paths {delta:.3e} nats; same argmax on {agree:.4f} of questions", flush=True)
    # Long prompts with multi-token continuations: prompt_logprobs over a 151,936-token vocabulary.
    long_rows = {}
    words = " ".join(lee_documents()).split()
    for n_words in (4000, 12000, 24000):
        ctx = " ".join((words * 10)[:n_words])
        t = time.perf_counter()
        try:
            v = gen.loglikelihoods([ctx, ctx], [" the end of it", " A"])
            long_rows[n_words] = {"ok": True, "seconds": round(time.perf_counter() - t, 2), "values": v.tolist()}
        except Exception as exc:  # noqa: BLE001 - report what failed
            long_rows[n_words] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(f"long context of {n_words} words: {long_rows[n_words]}", flush=True)
    gen.close()
    (out / "loglik.json").write_text(
        json.dumps(
            {"n_questions": n, "rows": rows, "max_abs_delta": delta, "argmax_agreement": agree, "long": long_rows},
            indent=2,
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
