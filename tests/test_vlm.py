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
        enc = proc(text=[text], images=[[to_pil(im) for im in ims]] if ims else None, return_tensors="pt")
        k = proc.tokenizer(cont, add_special_tokens=False)["input_ids"]
        ids = torch.cat([enc["input_ids"], torch.tensor([k])], dim=1)
        pixels = {n: enc[n] for n in ("pixel_values", "pixel_attention_mask") if n in enc}
        with torch.no_grad():
            logits = lm(input_ids=ids, attention_mask=torch.ones_like(ids), **pixels).logits[0]
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


def _hf_greedy(model: str, rendered: list[str], images: list[list], max_new_tokens: int) -> list[str]:
    """transformers' Idefics3 greedy answers to the rendered prompts, decoded without special tokens."""
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    proc = AutoProcessor.from_pretrained(model)
    lm = Idefics3ForConditionalGeneration.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    for text, ims in zip(rendered, images, strict=True):
        enc = proc(text=[text], images=[[to_pil(im) for im in ims]] if ims else None, return_tensors="pt")
        with torch.no_grad():
            ids = lm.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)[0, enc["input_ids"].shape[1] :]
        out.append(proc.tokenizer.decode(ids, skip_special_tokens=True))
    return out


def test_evas_prompt_formats_match_transformers(vlm, tmp_path):
    """eva's three multiple-choice tasks' prompts (PatchCamelyon's and PathMMU Atlas's with their images before and
    after the text, PathMMU's system prompt, PubMedQA's text), through our engine and through transformers' Idefics3
    on the same rendered prompts and images: the same greedy answers, and the answers' log-likelihoods within 1e-4."""
    pytest.importorskip("eva", reason="kaiko-eva is not installed: pip install 'vllm-eval[eva]'")
    from vllm_eval.tasks.eva import get_eva_task, prepare
    from vllm_eval.testing.eva_data import build_patch_camelyon, build_path_mmu_atlas, build_pubmedqa

    build_patch_camelyon(tmp_path / "patch_camelyon", per_class=1)
    build_path_mmu_atlas(tmp_path / "path_mmu_atlas", n=1)
    build_pubmedqa(tmp_path / "pubmedqa", n=1)
    runs = []
    for name, positions in (("eva.PatchCamelyon", ("before", "after")), ("eva.PathMMUAtlas", ("before", "after"))):
        runs += [(name, p) for p in positions]
    runs.append(("eva.PubMedQA", "after"))
    got, rendered, answers, shown = [], [], [], []
    for name, position in runs:
        task = get_eva_task(name)
        requests = prepare(task, tmp_path, num_samples=1).requests()[:2]
        with VllmGenerator(
            vlm.model,
            dtype="float32",
            max_images_per_prompt=2,
            image_position=position,
            system_prompt=task.system_prompt,
            sampling={"max_tokens": 6},
            show_progress_bar=False,
        ) as g:
            assert g.llm is vlm.llm  # the fixture's engine: the same options
            outs = g.generate(requests)
            texts, images = [t for t, _ in requests], [list(ims) for _, ims in requests]
            got += list(g.loglikelihoods(texts, [o.output for o in outs], images))
            rendered += [g.render(t, ims) for t, ims in requests]
        answers += [o.output for o in outs]
        shown += images
    assert rendered[0].index("<image>") < rendered[0].index("IMPORTANT") and "<image>" not in rendered[-1]
    assert rendered[2].index("<image>") > rendered[2].index("IMPORTANT")  # PatchCamelyon, images after
    assert get_eva_task("eva.PathMMUAtlas").system_prompt in rendered[4]
    theirs = _hf_greedy(vlm.model, rendered, shown, 6)
    print("eva prompt answers:", answers, theirs)
    assert [a.rstrip("\ufffd") for a in answers] == [a.rstrip("\ufffd") for a in theirs]
    ref = _reference(vlm.model, rendered, answers, shown)
    delta = float(np.max(np.abs(np.asarray(got) - ref)))
    print(f"eva prompts: loglikelihood |vLLM - transformers| max = {delta:.2e}")
    assert delta <= 1e-4


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

    from vllm_eval.tasks.lmeval_index import build_manager

    def run(model, **kw):
        # TaskManager(include_path=...) without its walk of lm-eval's task folders (test_lm_eval_index.py)
        manager = build_manager(TaskManager, [str(tmp_path / "tasks")])
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


LMMS_TASK_YAML = """task: {name}
dataset_path: parquet
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_visual: !function lmms_utils.doc_to_visual
doc_to_text: "Which digit is shown? Answer:"
doc_to_target: {target}
{extra}
metric_list:
  - metric: {metric}
"""


def _lmms_tasks(tmp_path) -> str:
    """Two lmms-eval tasks on four Digits images in a parquet file: one generated (``generate_until``), one scored by
    log-likelihood (``multiple_choice`` over the ten digits); their folder (lmms-eval's ``--include_path``)."""
    import datasets

    items = get_generative_task("Digits").load()[:4]
    rows = {"image": [to_pil(it.images[0]) for it in items], "label": [int(it.options[it.target]) for it in items]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    data = tmp_path / "digits.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(data))
    tasks = tmp_path / "lmms_tasks"
    tasks.mkdir()
    (tasks / "lmms_utils.py").write_text("def doc_to_visual(doc):\n    return [doc['image'].convert('RGB')]\n")
    gen = "generation_kwargs:\n  max_new_tokens: 6\n  temperature: 0\n  top_p: 0"
    (tasks / "digits_gen.yaml").write_text(
        LMMS_TASK_YAML.format(
            name="digits_gen", data=data, output_type="generate_until", target="label", extra=gen, metric="exact_match"
        )
    )
    choice = "doc_to_choice: ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']"
    (tasks / "digits_mc.yaml").write_text(
        LMMS_TASK_YAML.format(
            name="digits_mc", data=data, output_type="multiple_choice", target="label", extra=choice, metric="acc"
        )
    )
    return str(tasks)


def _lmms_own_vllm(llm, max_new_tokens: int):
    """lmms-eval's own ``vllm`` model (``lmms_eval/models/simple/vllm.py``: its requests, messages with base64 PNG
    images after the text, and ``llm.chat`` calls at its default ``batch_size=1``) on an engine already started.
    Its ``__init__`` would start a second engine, and in CI's full run a second engine's start in this process
    failed inside vLLM 0.32's CPU kernel rebinding (docs/vllm-issues.md); this also saves CI that start."""
    from lmms_eval.api.model import lmms
    from lmms_eval.models.simple.vllm import VLLM

    theirs = VLLM.__new__(VLLM)
    lmms.__init__(theirs)
    theirs.client, theirs.batch_size_per_gpu, theirs.image_first, theirs.max_new_tokens = llm, 1, False, max_new_tokens
    theirs.chat_template, theirs.min_image_pixels, theirs._enforce_image_resize = None, 28, False
    theirs._tp_group_cpu, theirs._tp_world_size, theirs._tp_rank_in_group, theirs._watchdog_path = None, 1, 0, ""
    return theirs


def test_lmms_eval_runs_its_tasks_on_our_model_by_its_entry_point_name(vlm, tmp_path):
    """``lmms-eval --model vllm-eval``: lmms-eval finds our model through its ``lmms_eval.models`` entry point; its
    evaluator runs a generation task and a log-likelihood one (which its own vLLM models refuse) on our engine. The
    answers equal lmms-eval's own ``vllm`` model's on the same engine settings and images after the text; the
    log-likelihoods equal our generator's (checked against transformers above) on the rendered prompts."""
    from lmms_eval import evaluator
    from lmms_eval.models import get_model
    from lmms_eval.tasks import TaskManager

    from vllm_eval.models.generator.lmms import VllmLMMS

    assert get_model("vllm-eval") is VllmLMMS
    include = _lmms_tasks(tmp_path)

    def run(model, tasks):
        out = evaluator.simple_evaluate(
            model=model,
            tasks=tasks,
            task_manager=TaskManager(include_path=include),
            log_samples=True,
            verbosity="ERROR",
        )
        return out["results"], out["samples"]

    # A model of its own with the fixture's engine options: the engine is the fixture's (one engine per process).
    args = dict(model=vlm.model, dtype="float32", max_images_per_prompt=2, max_new_tokens=6)
    ours = VllmLMMS(**args, cache_dir=str(tmp_path / "cache"))
    assert ours.generator.llm is vlm.llm
    results, samples = run(ours, ["digits_gen", "digits_mc"])
    assert ours.generator.cache.stats.misses > 0
    again = VllmLMMS(**args, cache_dir=str(tmp_path / "cache"))  # a run started again: every answer stored
    rerun, rerun_samples = run(again, ["digits_gen"])
    assert again.generator.cache.stats.misses == 0 and again.generator.cache.stats.hits == 4
    assert [s["resps"] for s in rerun_samples["digits_gen"]] == [s["resps"] for s in samples["digits_gen"]]
    answers = [s["resps"][0][0] for s in samples["digits_gen"]]
    assert len(answers) == 4 and len(set(answers)) > 1
    scores = [[r[0][0] for r in s["resps"]] for s in samples["digits_mc"]]
    assert all(len(s) == 10 for s in scores) and len({round(s[0], 6) for s in scores}) > 1
    # lmms-eval's loss: the mean negative log-likelihood per continuation token, of our generator's log-likelihoods
    # (checked against transformers above) for the same prompt, option and image; its accuracy the argmin's.
    docs = samples["digits_mc"]
    images = [[to_pil(it.images[0]).convert("RGB")] for it in get_generative_task("Digits").load()[:4]]
    flat = [(i, c) for i in range(4) for c in range(10)]
    n_tokens = [len(ours.generator.tokenizer(f" {c}", add_special_tokens=False)["input_ids"]) for _, c in flat]
    expected = ours.generator.loglikelihoods(
        ["Which digit is shown? Answer:"] * len(flat), [f" {c}" for _, c in flat], [images[i] for i, _ in flat]
    )
    np.testing.assert_allclose([scores[i][c] for i, c in flat], -np.asarray(expected) / n_tokens, atol=1e-6)
    accuracy = np.mean([np.argmin(s) == d["target"] for s, d in zip(scores, docs, strict=True)])
    assert results["digits_mc"]["acc,none"] == accuracy
    ours.close()

    # The same tasks by name through vllm_eval.generate (`vllm-eval generate --tasks lmms.digits_gen,...`), no cache:
    # the same answers and scores, lmms-eval's files and our summary; an unknown name stops before any engine.
    import vllm_eval
    from vllm_eval.utils.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match=r"unknown lmms-eval task 'lmms.digits_mx'; close: lmms.digits_mc"):
        vllm_eval.generate(vlm.model, tasks="lmms.digits_mx", include_path=include)
    kwargs = dict(dtype="float32", limit_mm_per_prompt={"image": 2}, no_cache=True, show_progress=False)
    got = vllm_eval.generate(
        vlm.model, tasks="lmms.digits_gen,lmms.digits_mc", include_path=include, output_dir=tmp_path / "out", **kwargs
    )
    assert got.scores == {"digits_gen": results["digits_gen"]["exact_match,none"], "digits_mc": accuracy}
    lines = got.lm_eval["samples_paths"]["digits_gen"].read_text().splitlines()
    assert [json.loads(line)["filtered_resps"] for line in lines] == answers  # lmms-eval's samples file
    summary = (tmp_path / "out" / "summary.json").read_text()
    assert "lmms-eval" in summary and str(got.lm_eval["results_path"].resolve()) in summary

    theirs = _lmms_own_vllm(vlm.llm, max_new_tokens=6)
    _, their_samples = run(theirs, ["digits_gen"])
    assert [s["resps"][0][0] for s in their_samples["digits_gen"]] == answers


def test_lmms_task_names_run_in_a_call_of_their_own():
    from vllm_eval.api.lmms_tasks import lmms_names
    from vllm_eval.utils.errors import UsageError

    assert lmms_names(["lmms.mmmu_val", "LMMS.ai2d"]) == ["mmmu_val", "ai2d"] and lmms_names(["mmlu"]) == []
    with pytest.raises(UsageError, match=r"lmms-eval's tasks \(lmms.<task>\) run in a call of their own"):
        lmms_names(["lmms.ai2d", "mmlu"])
    with pytest.raises(UsageError, match="name an lmms-eval task after the prefix"):
        lmms_names(["lmms."])
