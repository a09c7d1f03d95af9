"""A vision-language model through vLLM's CPU build: a tiny random Idefics3 (SmolVLM's architecture),
whose image processor needs no torchvision. Generation with images, and images in log-likelihood
scoring against transformers (plumbing only: the model's answers mean nothing)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vllm_eval.models.generator import VllmGenerator
from vllm_eval.models.generator.base import to_pil
from vllm_eval.tasks.generative import get_generative_task, run_multiple_choice


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from vllm_eval.testing import build_tiny_idefics3

    path = build_tiny_idefics3(tmp_path_factory.mktemp("models") / "tiny-idefics3")
    with VllmGenerator(
        str(path), dtype="float32", max_images_per_prompt=2, sampling={"max_tokens": 6}, show_progress_bar=False
    ) as g:
        yield g


def _digits(n: int) -> list[np.ndarray]:
    return [it.images[0] for it in get_generative_task("Digits").load()[:n]]


def _reference(model: str, rendered: list[str], conts: list[str], images: list[list]) -> np.ndarray:
    """Sum of log P(continuation | context with images) from transformers' Idefics3, float64 nats."""
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    proc = AutoProcessor.from_pretrained(model)
    lm = Idefics3ForConditionalGeneration.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    for text, cont, ims in zip(rendered, conts, images, strict=True):
        enc = proc(text=[text], images=[[to_pil(im) for im in ims]], return_tensors="pt")
        k = proc.tokenizer(cont, add_special_tokens=False)["input_ids"]
        ids = torch.cat([enc["input_ids"], torch.tensor([k])], dim=1)
        with torch.no_grad():
            logits = lm(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=enc["pixel_values"],
                pixel_attention_mask=enc["pixel_attention_mask"],
            ).logits[0]
        logp = torch.log_softmax(logits.double(), -1)
        n = ids.shape[1] - len(k)
        out.append(sum(logp[n + i - 1, t].item() for i, t in enumerate(k)))
    return np.asarray(out)


def test_images_reach_the_model(vlm):
    a, b = _digits(2)
    q = "Which digits are shown?"
    outs = vlm.generate([(q, ()), (q, [a]), (q, [b]), (q, [a, b]), (q, [b, a])])
    tokens = [o.prompt_tokens for o in outs]
    # each image's placeholder is expanded by vLLM (<fake><global-img><image>x4<fake> and kin): same growth per image
    per_image = tokens[1] - tokens[0]
    assert per_image >= 6 and tokens[2] == tokens[1] and tokens[3] - tokens[0] == tokens[4] - tokens[0] == 2 * per_image
    assert "<image>" in outs[1].prompt and "<image>" not in outs[0].prompt
    assert len({o.output for o in outs[1:]}) > 1  # different images (or order), different answers


def test_loglikelihoods_with_images_match_transformers(vlm):
    a, b, c = _digits(3)
    q = "Which digit is shown?"
    # one-token options of one context and images (one request), multi-token options, two images
    contexts = [q] * 4 + [q] * 2 + ["Which digits, in order?"] * 2
    conts = ["3", "7", "3", "7", " three", " seven", "0", "1"]
    shown = [[a], [a], [b], [b], [c], [c], [a, b], [b, a]]
    got = vlm.loglikelihoods(contexts, conts, shown)
    vlm.shared_context_scoring = False  # every option through prompt_logprobs: the same numbers
    try:
        np.testing.assert_allclose(vlm.loglikelihoods(contexts, conts, shown), got, atol=1e-5)
    finally:
        vlm.shared_context_scoring = True
    rendered = [vlm.render(ctx, ims) for ctx, ims in zip(contexts, shown)]
    assert rendered[6].count("<image>") == 2 and rendered[0].index("<image>") < rendered[0].index(q)
    # The images after the text: the same engine, another prompt layout.
    with VllmGenerator(
        vlm.model, dtype="float32", max_images_per_prompt=2, image_position="after", show_progress_bar=False
    ) as after:
        assert after.llm is vlm.llm
        got = np.concatenate([got, after.loglikelihoods(contexts[4:], conts[4:], shown[4:])])
        rendered += [after.render(ctx, ims) for ctx, ims in zip(contexts[4:], shown[4:])]
    assert rendered[-1].index(contexts[-1]) < rendered[-1].index("<image>")
    conts, shown = conts + conts[4:], shown + shown[4:]
    ref = _reference(vlm.model, rendered, conts, shown)
    delta = float(np.max(np.abs(got - ref)))
    print(f"loglikelihood with images |vLLM - transformers| max = {delta:.2e}")
    assert delta <= 1e-4
    assert not np.allclose(got[0:2], got[2:4], atol=1e-4)  # another image, other scores for the same options
    text_only = vlm.loglikelihoods(contexts[:2], conts[:2])
    assert not np.allclose(text_only, got[0:2], atol=1e-4)


def test_image_task_scored_by_loglikelihood(vlm, tmp_path):
    res = run_multiple_choice(vlm, get_generative_task("Digits"), scoring="loglikelihood", limit=6, output_dir=tmp_path)
    assert res["metrics"]["n_samples"] == 6 and res["metrics"]["missing"] == 0
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all(s["prompt"].count("<image>") == 1 for s in samples)
    # each sample's scores come from its own image: six images, six different score vectors
    vectors = {tuple(round(v, 5) for v in s["output"]["loglikelihoods"].values()) for s in samples}
    assert len(vectors) == 6


def test_image_loglikelihoods_are_cached_per_image(vlm, tmp_path):
    from vllm_eval.models.cache import OutputCache

    a, b = _digits(2)
    q = "Which digit is shown?"
    cache = OutputCache(tmp_path)
    vlm.use_cache(cache)
    try:
        first = vlm.loglikelihoods([q, q], ["3", "7"], [[a], [a]])
        again = vlm.loglikelihoods([q, q], ["7", "3"], [[a.copy()], [b]])  # equal pixels hit; another image misses
        assert cache.stats.hits == 1 and cache.stats.misses == 3
        assert again[0].tobytes() == first[1].tobytes() and again[1] != first[0]
    finally:
        vlm.use_cache(None)


#: lm-eval's task config of a generation task with images (``doc_to_image``), on the real digits written as Parquet
DIGITS_YAML = """task: digits_vqa
dataset_path: parquet
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_image: [image]
doc_to_text: "<image>Which digit is shown? Answer:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""


def test_lm_evals_image_tasks_run_as_its_own_multimodal_model_runs_them(vlm, tmp_path, test_models):
    """lm-eval's generation task with images through VllmVLM (MULTIMODAL): its greedy answers and metric equal
    lm-eval's own ``hf-multimodal`` model (transformers) on the same images; for a text-only model the task is
    refused in one line before any engine starts."""
    import datasets
    import lm_eval
    from lm_eval.tasks import TaskManager

    from vllm_eval import VllmVLM

    items = get_generative_task("Digits").load()[:4]
    rows = {"image": [to_pil(it.images[0]) for it in items], "answer": [it.options[it.target] for it in items]}
    features = datasets.Features({"image": datasets.Image(), "answer": datasets.Value("string")})
    data = tmp_path / "digits.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(data))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "digits_vqa.yaml").write_text(DIGITS_YAML.format(data=data))

    def run(model, **kw):
        manager = TaskManager(include_path=str(tmp_path / "tasks"))
        out = lm_eval.simple_evaluate(
            model=model, tasks=["digits_vqa"], task_manager=manager, log_samples=True, verbosity="ERROR", **kw
        )
        return out["results"]["digits_vqa"], [s["resps"][0][0] for s in out["samples"]["digits_vqa"]]

    ours, ours_answers = run(VllmVLM(generator=vlm, show_progress_bar=False))
    args = f"pretrained={vlm.model},dtype=float32,max_images=2,device=cpu"
    theirs, their_answers = run("hf-multimodal", model_args=args, batch_size=1)
    print("answers:", ours_answers, their_answers)
    # A random model's answer may end inside a character's bytes: transformers' decode writes U+FFFD for them,
    # vLLM's detokenizer holds them back (as lm-eval's own vllm-vlm reads vLLM's text). Up to those, equal.
    assert [a.rstrip("\ufffd") for a in ours_answers] == [a.rstrip("\ufffd") for a in their_answers]
    assert len(set(ours_answers)) > 2
    assert ours["exact_match,none"] == theirs["exact_match,none"]
    import vllm_eval
    from vllm_eval.utils.errors import UsageError

    with pytest.raises(UsageError, match="task 'digits_vqa' shows images, and model .* takes none"):
        vllm_eval.generate(str(test_models["qwen3"]), tasks=["digits_vqa"], include_path=str(tmp_path / "tasks"))
