"""kaiko-eva's tasks: files in eva's layouts, eva's prompts rendered by eva's own code, one engine run of the three
multiple-choice tasks through ``vllm_eval.generate`` with eva's extraction, missing-answer rule, metrics and result
format, and the one-line errors of missing files."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("eva", reason="kaiko-eva is not installed: pip install 'vllm-eval[eva]'")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from vllm_eval.testing.eva_data import (  # noqa: E402
    build_patch_camelyon,
    build_path_mmu_atlas,
    build_pubmedqa,
)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("eva-data")
    build_patch_camelyon(root / "patch_camelyon", per_class=4)
    build_path_mmu_atlas(root / "path_mmu_atlas", n=4)
    build_pubmedqa(root / "pubmedqa", n=6)
    return root


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from vllm_eval.testing import build_tiny_idefics3

    return build_tiny_idefics3(tmp_path_factory.mktemp("models") / "tiny-idefics3")


@pytest.fixture(scope="module")
def ran(model, data_root, tmp_path_factory):
    """One engine: the three multiple-choice tasks, 2 samples a split (PatchCamelyon: 2 a class), 8 tokens, under
    eva's registered Qwen2.5-VL-7B vLLM settings (a preset read from eva's source)."""
    import vllm_eval

    out = tmp_path_factory.mktemp("eva-out")
    result = vllm_eval.generate(
        str(model),
        "eva.PatchCamelyon,PathMMUAtlas,eva.PubMedQA",
        data_root=str(data_root),
        limit=2,
        max_tokens=8,
        output_dir=str(out),
        no_cache=True,
        max_model_len=2048,
        show_progress=False,
        preset="alibaba/qwen2-5-vl-7b-instruct-vllm",
    )
    return result, out


def _render_class():
    from vllm_eval.models.generator.base import GeneratorBase

    class Render(GeneratorBase):  # our message building, without an engine
        def image_part(self, image):
            return {"type": "image"}

        def render(self, text, images=(), **template_kwargs):
            raise AssertionError("no engine here")

        def _generate_chunk(self, chunk, offset):
            raise AssertionError("no engine here")

    return Render


def _Render(**kwargs):  # noqa: N802
    return _render_class()(**kwargs)


def test_balanced_sampler_is_evas(data_root):
    from vllm_eval.tasks.eva import get_eva_task, prepare

    prepared = prepare(get_eva_task("PatchCamelyon"), data_root, num_samples=3)
    for split in ("val", "test"):
        targets = [prepared.splits[split].load_target(i) for i in prepared.order[split]]
        assert sorted(targets) == [0, 0, 0, 1, 1, 1]
    with pytest.raises(Exception, match="Class .* has only 4 samples"):
        prepare(get_eva_task("eva.PatchCamelyon"), data_root)  # eva's 250 a class


def test_prompts_are_rendered_by_evas_code(model, data_root):
    """Our user turn and chat rendering against eva's: its language VllmModel.format_inputs for PubMedQA, and its
    multimodal format_huggingface_message (images after the text) for the image tasks, with the model's template."""
    from eva.language import utils as language_utils
    from eva.language.data.datasets import PubMedQA
    from eva.language.data.messages import MessageSeries, Role, SystemMessage, UserMessage
    from eva.language.models.typings import TextBatch
    from eva.language.models.wrappers.vllm import VllmModel
    from eva.language.prompts.templates import MultipleChoicePromptTemplate
    from transformers import AutoTokenizer

    from vllm_eval.tasks.eva import get_eva_task, prepare
    from vllm_eval.utils.eva_source import module_function

    eva_model = VllmModel(str(model))
    eva_model.tokenizer = eva_model.load_tokenizer()
    pub = PubMedQA(root=str(data_root / "pubmedqa"), split="test", prompt_template=MultipleChoicePromptTemplate("json"))
    pub.prepare_data()
    ours = prepare(get_eva_task("eva.PubMedQA"), data_root)
    assert [ours.splits["test"].prompt(i) for i in range(6)] == [pub.load_text(i)[0].content for i in range(6)]
    rendered = eva_model.format_inputs(TextBatch(text=[pub.load_text(i) for i in range(6)], target=None, metadata=None))
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    plain = _Render(model=str(model))
    assert [r["prompt"] for r in rendered] == [
        tokenizer.apply_chat_template(
            plain.messages(ours.splits["test"].prompt(i)), tokenize=False, add_generation_prompt=True
        )
        for i in range(6)
    ]
    fmt = module_function(
        "multimodal/utils/text/messages.py",
        "format_huggingface_message",
        {"language_utils": language_utils, "Role": Role, "MessageSeries": MessageSeries},
    )
    for name, system in (("PathMMUAtlas", True), ("PatchCamelyon", False)):
        task = get_eva_task(name)
        prepared = prepare(task, data_root, num_samples=2)
        text = prepared.splits["test"].prompt(prepared.order["test"][0])
        assert "IMPORTANT: Provide your final answer within a valid JSON object" in text
        messages = ([SystemMessage(content=task.system_prompt)] if system else []) + [UserMessage(content=text)]
        eva_prompt = tokenizer.apply_chat_template(
            fmt(messages, images=[object()], image_position="after_text"), tokenize=False, add_generation_prompt=True
        )
        ours = _Render(model=str(model), system_prompt=task.system_prompt, image_position="after")
        assert (
            tokenizer.apply_chat_template(
                ours.messages(text, [object()], placeholders=True), tokenize=False, add_generation_prompt=True
            )
            == eva_prompt
        )


def test_path_mmu_options_lose_their_letters_as_eva_strips_them(data_root):
    from vllm_eval.tasks.eva import get_eva_task, prepare

    prepared = prepare(get_eva_task("eva.PathMMUAtlas"), data_root)
    text = prepared.splits["val"].prompt(0)
    assert "A. tissue type 0" in text and "A) tissue" not in text
    data = json.loads((data_root / "path_mmu_atlas" / "path_mmu_hf" / "data.json").read_text())
    assert prepared.splits["val"].load_target(0) == "ABCDE".index(data["Atlas"]["val"][0]["answer"][0])


@pytest.mark.parametrize(
    ("task", "remove", "named"),
    [
        ("eva.PatchCamelyon", "patch_camelyon/camelyonpatch_level_2_split_test_y.h5", "zenodo.org/records/2546921"),
        ("eva.PathMMUAtlas", "path_mmu_atlas/path_mmu_hf/data.json", "jamessyx/PathMMU"),
        ("eva.PubMedQA", "pubmedqa/val/dataset_info.json", "bigbio/pubmed_qa"),
    ],
)
def test_a_missing_file_is_named_with_its_source(tmp_path, task, remove, named):
    import vllm_eval
    from vllm_eval.utils.errors import DataUnavailableError

    build_patch_camelyon(tmp_path / "patch_camelyon", per_class=1)
    build_path_mmu_atlas(tmp_path / "path_mmu_atlas", n=1)
    build_pubmedqa(tmp_path / "pubmedqa", n=1)
    (tmp_path / remove).unlink()
    with pytest.raises(DataUnavailableError) as info:
        vllm_eval.generate("no-such-model-is-loaded", task, data_root=str(tmp_path))  # before any model starts
    msg = str(info.value)
    assert "\n" not in msg and str(tmp_path / remove).rsplit("/", 1)[0] in msg and named in msg


def test_a_bad_engine_option_is_named_before_evas_data_is_read(tmp_path):
    """The option check runs before the tasks: a misspelt vLLM option is named even where no data file exists
    (reading eva's data first would stop on the missing file instead, after eva's imports)."""
    import vllm_eval
    from vllm_eval.utils.errors import OptionError

    with pytest.raises(OptionError, match="max_model_length.*max_model_len"):
        vllm_eval.generate("no-such-model-is-loaded", "eva.PatchCamelyon", data_root=str(tmp_path), max_model_length=8)


def test_evas_engine_default_is_read_without_importing_eva_language():
    """eva's ``enforce_eager`` default is a literal in its source: read without importing ``eva.language`` (which
    imports Lightning and litellm, seconds on a small CPU, and litellm goes online for its cost map)."""
    import subprocess
    import sys

    code = (
        "import sys; from vllm_eval.api.eva_tasks import eva_engine_default; "
        "print(eva_engine_default('enforce_eager'), 'eva.language' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"] and "LiteLLM" not in out.stderr


def test_tasks_are_read_on_their_thread_where_the_engine_starts_apart(tmp_path, monkeypatch):
    """With the engine's core in a process of its own, eva's reading (its imports and samplers) runs on the tasks'
    thread while the engine starts, where the layout fixes the images' size; the requests and the engine's image
    limits are those of the reading done first. Beside an engine starting in this process, it is done first."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from vllm_eval.api.eva_tasks import _start_reading, eva_sampling
    from vllm_eval.engine import procenv
    from vllm_eval.tasks import eva

    build_patch_camelyon(tmp_path / "patch_camelyon", per_class=2)
    build_pubmedqa(tmp_path / "pubmedqa", n=2)
    tasks = [eva.get_eva_task("eva.PatchCamelyon"), eva.get_eva_task("eva.PubMedQA")]
    how = {"num_samples": 2, "missing_limit": 5, "n_runs": None}
    real, seen, got = eva.prepare, [], {}
    monkeypatch.setattr(
        eva, "prepare", lambda *a, **k: (seen.append(threading.current_thread().name), real(*a, **k))[1]
    )
    for overlap in (False, True):
        seen.clear()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tasks") as work:
            limits, _, pending = _start_reading(work, tasks, tmp_path, how, overlap)
            got[overlap] = (limits, [[(t, [i.tobytes() for i in ims]) for t, ims in f.result()] for f in pending])
        assert len(seen) == 2 and all(n.startswith("tasks") for n in seen) == overlap
    assert got[False] == got[True] and got[True][0] == {"max_images_per_prompt": 1, "largest_image": (96, 96)}
    assert [len(r) for r in got[True][1]] == [8, 4]  # 2 a class in each of PatchCamelyon's splits; 2 a split

    monkeypatch.setattr(procenv, "ENV_SET_HERE", set())
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert procenv.generation_core_apart()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert not procenv.generation_core_apart()
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    assert not procenv.generation_core_apart()  # the CPU build keeps the core in this process

    from eva.language.models.constants import MAX_NEW_TOKENS  # read from eva's source without this import

    assert eva_sampling({})["max_tokens"] == MAX_NEW_TOKENS and eva_sampling({"max_tokens": 3})["max_tokens"] == 3


def test_three_tasks_in_one_engine_with_evas_rules(ran):
    result, out = ran
    pcam = json.loads((out / "eva.PatchCamelyon" / "results.json").read_text())
    # A random tiny model answers no JSON: PatchCamelyon's 8 answers pass eva's limit of 5 and the task stops.
    assert "eva.PatchCamelyon" in result.errors and "eva stopped the task" in pcam["error"]
    assert pcam["n_samples"] == {"val": 4, "test": 4}
    for name in ("eva.PathMMUAtlas", "eva.PubMedQA"):
        r = result.results[name]
        assert name not in result.errors
        assert set(r["metrics"]) == {"val", "test"} and r["n_samples"] == {"val": 2, "test": 2}
        stats = r["metrics"]["test"][0]
        assert set(stats) == {f"test/Multiclass{m}" for m in ("Accuracy", "F1Score", "Precision", "Recall")}
        assert stats["test/MulticlassAccuracy"]["values"] == [stats["test/MulticlassAccuracy"]["mean"]]
        assert result.scores[name] == r["main_score"]["value"]
        rows = [json.loads(line) for line in (out / name / "samples.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and all(row["output"] is not None for row in rows)
    pub = result.results["eva.PubMedQA"]
    assert all(s["parsed"] == 2 for s in pub["samples"])  # no JSON answer: eva's missing answer, "maybe"'s class
    mmu = result.results["eva.PathMMUAtlas"]
    assert all(s["parsed"] == -1 for s in mmu["samples"]) and mmu["config"]["system_prompt"].startswith("In the")
    assert "pathology expert" in mmu["samples"][0]["prompt"]
    # eva's registered model: max_num_seqs 8, no prefix caching, images before the text
    assert mmu["engine_kwargs"]["max_num_seqs"] == 8 and mmu["engine_kwargs"]["enable_prefix_caching"] is False
    assert mmu["image_position"] == "before"
    # vLLM profiled at the largest image sampled (PatchCamelyon's 96x96 over PathMMU's 64x64), images only
    image = {"count": 1, "width": 96, "height": 96}
    assert mmu["engine_kwargs"]["limit_mm_per_prompt"] == {"image": image, "video": 0, "audio": 0}
    # eva's multimodal VllmModel starts eager (read from its source); so do its image tasks here unless told otherwise
    from vllm_eval.api.eva_tasks import eva_engine_default

    assert eva_engine_default("enforce_eager") is True and mmu["engine_kwargs"]["enforce_eager"] is True
    user = mmu["samples"][0]["prompt"].split("<|im_start|>user\n", 1)[1]
    assert user.startswith("<image>") and "Read the provided question" in user


def test_evas_metrics_of_our_outputs(data_root):
    """Given answers, the scores are eva's: its extractor and torchmetrics' macro accuracy, recorded as eva does."""
    from vllm_eval.tasks.eva import get_eva_task, prepare, score

    prepared = prepare(get_eva_task("eva.PubMedQA"), data_root, n_runs=2)
    answers = {0: "no", 1: "yes", 2: "maybe"}
    outputs = []
    for s in prepared.order:
        for k, i in enumerate(prepared.order[s]):
            right = answers[prepared.splits[s].load_target(i)]
            outputs.append(f'```json\n{{"answer": "{right if k % 2 == 0 else "no"}"}}\n```')
    r = score(prepared, outputs)
    test = r["metrics"]["test"][0]["test/MulticlassAccuracy"]
    # targets no, yes, maybe, no, yes, maybe; predictions right on even rows, "no" on odd: recall 1, 1/2, 1/2.
    assert test["values"] == [pytest.approx(2 / 3), pytest.approx(2 / 3)] and test["stdev"] == 0


def test_quilt_vqa_is_judged_by_evas_g_eval(tmp_path):
    """Quilt-VQA: eva's free-form prompt, and eva's GEvalCorrectness over the judge's answers (here a judge
    backend that answers each of eva's G-Eval prompts with a fixed JSON score); a judge that scores nothing stops
    the task instead of eva's 0/0."""
    from eva.language.prompts.templates import RawFreeFormQuestionPromptTemplate

    from vllm_eval.api.eva_tasks import EvaJudge
    from vllm_eval.models.generator.base import Generation
    from vllm_eval.tasks.eva import get_eva_task, prepare, score
    from vllm_eval.testing.eva_data import build_quilt_vqa
    from vllm_eval.utils.errors import MissingAnswersError

    build_quilt_vqa(tmp_path / "quilt_vqa", n=4)
    prepared = prepare(get_eva_task("QuiltVQA"), tmp_path, n_runs=2)
    question = prepared.splits["test"]._eva.dataset[0]["question"]
    preamble = "Read the provided question and provide a concise, factual answer based only on what is visible"
    assert prepared.splits["test"].prompt(0) == RawFreeFormQuestionPromptTemplate().render(
        question=question, preamble=preamble + " in the image."
    )
    assert len(prepared.requests()) == 4 and prepared.requests()[0][1][0].size == (64, 64)

    class Judge:
        def __init__(self, reply):
            self.reply, self.prompts = reply, []

        def generate(self, samples, total=None):
            out = []
            for text, _ in samples:
                self.prompts.append(text)
                out.append(
                    Generation(prompt=text, output=self.reply(len(self.prompts)), prompt_tokens=1, output_tokens=1)
                )
            return out

    judge = Judge(lambda k: f'{{"reason": "r", "score": {1 + k % 4}}}')
    r = score(prepared, [f"answer {i}" for i in range(4)], judge=EvaJudge(judge))
    values = r["metrics"]["test"][0]["test/GEvalCorrectness"]["values"]
    assert values == [pytest.approx((2 + 3 + 4 + 1) / 4)] * 2 and r["main_score"]["value"] == values[0]
    assert len(judge.prompts) == 8 and "Ground Truth:" in judge.prompts[0] and "answer 0" in judge.prompts[0]
    with pytest.raises(MissingAnswersError, match="no parsable score"):
        score(prepared, ["a"] * 4, judge=EvaJudge(Judge(lambda k: "no json here")))


def test_largest_image_is_read_from_headers_before_any_model(tmp_path):
    """The size vLLM profiles at: the largest width and height over the sampled images, read without decoding;
    a damaged image is named before any engine starts."""
    from PIL import Image

    from vllm_eval.models.generator.vllm import image_limits
    from vllm_eval.tasks.eva import get_eva_task, prepare
    from vllm_eval.testing.eva_data import build_quilt_vqa
    from vllm_eval.utils.errors import UsageError

    build_path_mmu_atlas(tmp_path / "path_mmu_atlas", n=3)
    build_pubmedqa(tmp_path / "pubmedqa", n=3)
    build_quilt_vqa(tmp_path / "quilt_vqa", n=3)
    images = tmp_path / "path_mmu_atlas" / "arch" / "books_set" / "images"
    Image.new("RGB", (80, 30)).save(images / "val-1.png")
    Image.new("RGB", (20, 70)).save(images / "test-2.png")
    mmu = prepare(get_eva_task("eva.PathMMUAtlas"), tmp_path)
    assert mmu.largest_image() == (80, 70)
    assert prepare(get_eva_task("eva.PubMedQA"), tmp_path).largest_image() is None
    assert prepare(get_eva_task("QuiltVQA"), tmp_path).largest_image() == (64, 64)
    assert image_limits(1, (80, 70)) == {
        "limit_mm_per_prompt": {"image": {"count": 1, "width": 80, "height": 70}, "video": 0, "audio": 0}
    }
    assert image_limits(2) == {"limit_mm_per_prompt": {"image": 2}} and image_limits(None, (80, 70)) is None
    with pytest.raises(UsageError, match="largest_image must be"):
        image_limits(1, (0, 5))
    (images / "val-1.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(UsageError) as info:
        prepare(get_eva_task("eva.PathMMUAtlas"), tmp_path).largest_image()
    assert str(images / "val-1.png") in str(info.value) and "\n" not in str(info.value)


def test_damaged_path_mmu_images_are_named(tmp_path):
    """PathMMU's images through both readers (the header for the size, the decode for the prompt): a damaged file
    gives a size and an image, or one line naming the file, never another exception."""
    import io

    from hypothesis import given
    from hypothesis import strategies as st
    from PIL import Image

    from _fuzz import FUZZ, mutated, outcome
    from vllm_eval.tasks.eva import get_eva_task, prepare

    build_path_mmu_atlas(tmp_path / "path_mmu_atlas", n=1)
    image = tmp_path / "path_mmu_atlas" / "arch" / "books_set" / "images" / "val-0.png"
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), (200, 10, 10)).save(buf, format="PNG")
    prepared = prepare(get_eva_task("eva.PathMMUAtlas"), tmp_path)

    @FUZZ
    @given(st.data())
    def check(data):
        image.write_bytes(data.draw(mutated(buf.getvalue(), ("flip", "truncate", "insert", "delete", "empty"))))
        split = prepared.splits["val"]
        size = outcome(lambda: split.image_sizes(0), str(image))
        pixels = outcome(lambda: split.images(0), str(image))
        if size is not None and pixels is not None:
            assert pixels[0].size == size[0]

    check()


def test_download_fetches_evas_files_checks_them_and_keeps_what_is_there(tmp_path, monkeypatch):
    """``--download`` for PatchCamelyon: eva's URLs and MD5 sums read from its source; each ``.gz`` fetched (here
    from a local transport serving files in eva's layout), unpacked, checked, and kept on the next call; a file
    whose MD5 is not eva's is refused in one line and not left under its name."""
    import gzip

    import httpx

    from vllm_eval.tasks import eva_download
    from vllm_eval.tasks.eva import get_eva_task, prepare
    from vllm_eval.utils.errors import DataUnavailableError

    real = eva_download.pcam_resources(("val", "test"))
    assert [r.filename for r in real] == [
        f"camelyonpatch_level_2_split_{s}_{xy}.h5" for s in ("valid", "test") for xy in ("x", "y")
    ]
    assert all(r.url.startswith("https://zenodo.org/records/2546921/") and len(r.md5) == 32 for r in real)

    source = build_patch_camelyon(tmp_path / "made", per_class=2)
    served = {f"https://files.test/{r.filename}.gz": gzip.compress((source / r.filename).read_bytes()) for r in real}
    fake = [type(r)(filename=r.filename, url=f"https://files.test/{r.filename}.gz", md5=None) for r in real]
    for r in fake:
        r.md5 = eva_download.md5_of(source / r.filename)
    monkeypatch.setattr(eva_download, "pcam_resources", lambda splits: fake)
    asked = []

    def serve(request):
        asked.append(str(request.url))
        body = served.get(str(request.url))
        return httpx.Response(200, content=body) if body else httpx.Response(404)

    client = httpx.Client(transport=httpx.MockTransport(serve))
    task, root = get_eva_task("eva.PatchCamelyon"), tmp_path / "data" / "patch_camelyon"
    eva_download.download_task(task, root, client=client, show_progress=False)
    assert len(asked) == 4 and sorted(p.name for p in root.iterdir()) == sorted(r.filename for r in real)
    assert prepare(task, tmp_path / "data", num_samples=2).size == 8
    eva_download.download_task(task, root, client=client, show_progress=False)
    assert len(asked) == 4  # every file already there with eva's MD5

    fake[0].md5 = "0" * 32
    (root / fake[0].filename).unlink()
    with pytest.raises(DataUnavailableError) as info:
        eva_download.download_task(task, root, client=client, show_progress=False)
    assert fake[0].url in str(info.value) and "not eva's" in str(info.value) and "\n" not in str(info.value)
    assert not (root / fake[0].filename).exists() and not list(root.glob("*.part")) and not list(root.glob("*.gz"))


def test_download_offline_stops_in_one_line(tmp_path, monkeypatch):
    """Offline, ``--download`` names what it could not reach, before any model starts: zenodo's URL (this machine
    resolves no host), the hub dataset under HF_HUB_OFFLINE."""
    import vllm_eval
    from vllm_eval.utils.errors import DataUnavailableError

    with pytest.raises(DataUnavailableError) as info:
        vllm_eval.generate("no-such-model-is-loaded", "eva.PatchCamelyon", data_root=str(tmp_path), download=True)
    msg = str(info.value)
    assert "zenodo.org/records/2546921" in msg and "--download needs the network" in msg and "\n" not in msg
    assert not list((tmp_path / "patch_camelyon").glob("*.part"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataUnavailableError, match="bigbio/pubmed_qa, and HF_HUB_OFFLINE is set"):
        vllm_eval.generate("no-such-model-is-loaded", "eva.PubMedQA", data_root=str(tmp_path), download=True)
