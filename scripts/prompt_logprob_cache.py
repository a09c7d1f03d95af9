"""Does the installed vLLM's prefix cache serve requests that ask for prompt log-probabilities?

lm-eval scores an option of several tokens as one request of context + option with ``prompt_logprobs=1``
(``lm_eval/models/vllm_causallms.py``); the options of one question share their context. Here ``--questions``
contexts (a few-shot prefix shared by all, about ``--prefix-tokens`` tokens, then a question) with four options of
about 20 tokens each go to one engine with prefix caching on, three ways, one after another:

1. ``prompt_logprobs=1``, one request per option (lm-eval's way), twice: the second pass finds the first's blocks;
2. the same prompts with no prompt log-probabilities (``max_tokens=1``): the cache's effect where it is used;
3. forced decoding (this project's way, :mod:`vllm_eval.engine.forced`): the context as the prompt, the option's
   tokens decoded one step each with their raw log-probabilities, on a fresh engine (an empty cache).

Printed per pass: seconds, prompt tokens, the tokens vLLM reports as read from the cache (``num_cached_tokens``) and,
for the second ``prompt_logprobs`` pass and the forced pass, the largest difference of the options'
log-likelihoods from the first pass's (whole options).

Run from the project root (CPU build; the packaged SmolLM2-135M-Instruct, float32):

    .venv/bin/python scripts/prompt_logprob_cache.py [--model DIR] [--questions 64] [--out FILE.json]

On a GPU, after staging vLLM (the device's ``on-device.sh``): ``python3 scripts/prompt_logprob_cache.py --gpu
--model DIR --questions 1000 --out $OUT/prompt-logprob-cache.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _requests(tokenizer, questions: int, prefix_tokens: int) -> list[tuple[list[int], list[int]]]:
    from vllm_eval.tasks.data import lee_background_documents

    docs = lee_background_documents()
    shots, words = [], 0
    for d in docs:
        shots.append(f"Passage: {d[:500]}\nEnding: {d[500:620]}")
        words += len(tokenizer.encode(shots[-1]))
        if words >= prefix_tokens:
            break
    prefix = "\n\n".join(shots)
    out = []
    for q in range(questions):
        doc = docs[(q * 7) % len(docs)]
        context = tokenizer.encode(f"{prefix}\n\nPassage: {doc[:300]} ({q})\nEnding:")
        for k in range(4):
            option = docs[(q * 7 + k + 1) % len(docs)][:110]
            out.append((context, tokenizer.encode(" " + option, add_special_tokens=False)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the packaged SmolLM2-135M-Instruct, converted")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--prefix-tokens", type=int, default=800)
    parser.add_argument("--gpu", action="store_true", help="bfloat16, vLLM's GPU defaults")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_eval.engine.build import acquire_engine, release_engine

    model = args.model
    if model is None:
        from vllm_eval.testing.packaged import build_smollm2

        model = "/tmp/vllm-eval-smollm2"
        build_smollm2(model)
    from vllm_eval.engine.forced import forced_engine_kwargs, forced_params, forced_scores

    engine = {"runner": "generate", "max_model_len": 4096, "enable_prefix_caching": True, "seed": 0}
    engine["dtype"] = "bfloat16" if args.gpu else "float32"
    llm = acquire_engine(model, **engine)  # this project's engine options and process setup
    pairs = _requests(llm.get_tokenizer(), args.questions, args.prefix_tokens)
    prompts = [c + o for c, o in pairs]
    report = {"vllm": vllm.__version__, "model": model, "requests": len(prompts), "passes": {}}
    scored = {}
    ways = {
        "prompt_logprobs, first": SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1, detokenize=False),
        "prompt_logprobs, again": SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1, detokenize=False),
        "no prompt_logprobs": SamplingParams(max_tokens=1, temperature=0, detokenize=False),
    }

    def timed(name, inputs, params):
        started = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in inputs], params, use_tqdm=False)
        row = {
            "seconds": round(time.perf_counter() - started, 2),
            "prompt_tokens": sum(len(p) for p in inputs),
            "cached_tokens": sum(int(o.num_cached_tokens or 0) for o in outs),
        }
        report["passes"][name] = row
        print(f"{name}: {row}", flush=True)
        return outs

    for name, params in ways.items():
        outs = timed(name, prompts, params)
        if params.prompt_logprobs is not None:
            scored[name] = [
                sum(o.prompt_logprobs[t][o.prompt_token_ids[t]].logprob for t in range(len(c), len(c) + len(opt)))
                for o, (c, opt) in zip(outs, pairs, strict=True)
            ]
    first = scored["prompt_logprobs, first"]
    report["max_abs_difference_nats"] = max(abs(a - b) for a, b in zip(first, scored["prompt_logprobs, again"]))
    print(f"largest difference between the two prompt_logprobs passes: {report['max_abs_difference_nats']:.3g} nats")
    release_engine(llm)
    mode, forcing = forced_engine_kwargs()
    if mode is not None:
        llm = acquire_engine(model, **engine, **forcing)
        outs = timed(f"forced decoding ({mode})", [c for c, _ in pairs], [forced_params(mode, o) for _, o in pairs])
        forced = [forced_scores(out, o) for out, (_, o) in zip(outs, pairs, strict=True)]
        report["forced_max_abs_difference_nats"] = max(abs(a - f[0]) for a, f in zip(first, forced, strict=True))
        report["forced_decoded_tokens"] = sum(len(o) for _, o in pairs)
        print(f"forced decoding against prompt_logprobs: {report['forced_max_abs_difference_nats']:.3g} nats")
        release_engine(llm)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
