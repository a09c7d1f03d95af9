"""An LLM reranker (Qwen3-Reranker's recipe: P(yes) from the yes/no logits under its judge template) measured through
this package's reranker backends, as mteb's reranking calls them: vLLM with prefix caching on and off, and
sentence-transformers' ``CrossEncoder`` (its causal-LM path, ``LogitScore``) on the same prompts.

The pairs are a reranking stage's: each of ``--queries`` queries with its top ``--docs-per-query`` candidates
(ranked by shared words among gensim's Lee and newsgroup articles, or random vocabulary words where gensim's data is
not installed), each document cut to a length drawn uniformly from ``--doc-tokens`` (per document, so the same
document has the same length in every list it is in). The template puts the query first, so a query's prompt prefix
(system prompt, instruction, query: ``query part`` tokens in the report) is shared by its documents' prompts:
what vLLM's prefix caching can reuse.

Each configuration runs in a fresh process (an 8B engine's GPU memory is not all given back within one), through
:func:`vllm_eval.models.backends.load_backend` and ``predict(queries loader, documents loader, task_metadata=...)``:
what ``vllm-eval rerank`` runs. Reported per run: seconds until the backend was ready, pairs/s and prompt tokens/s
of the timed ``predict`` (after a warm-up of 8 pairs of another query), the prefix-cache setting as the engine
holds it and, with ``--engine-stats`` (default), vLLM's prefix-cache hit rate over the timed call; and the agreement
of each vLLM run's scores with the reference's (``st``): max |diff| and Spearman's rho per query. With random
weights the agreement checks plumbing (same prompts, same tokens, same score), not quality.

    python scripts/rerank_bench.py --model DIR [--shape qwen3-tiny (build DIR when missing)] [--backends vllm st]
        [--queries 20] [--docs-per-query 100] [--doc-tokens 50-400] [--prefix-caching on off]
        [--max-model-len 1024] [--dtype bfloat16] [--block-size 16] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: Pairs of the warm-up call (compiles kernels, allocates; its query is none of the measured ones).
WARMUP_PAIRS = 8
WARMUP_QUERY = "warm-up query that is not among the measured ones"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True, help="reranker folder (a Qwen3ForCausalLM with its tokenizer)")
    ap.add_argument("--shape", default=None, help="build --model when missing: a RANDOM_SHAPES key, e.g. qwen3-tiny")
    ap.add_argument("--tokenizer", default=None, help="with --shape: tokenizer folder (default: packaged MiniLM)")
    ap.add_argument("--preset", default="qwen3-reranker", help="reranker preset (template and yes/no recipe)")
    ap.add_argument("--backends", nargs="+", default=["vllm", "st"], choices=["vllm", "st"])
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--docs-per-query", type=int, default=100)
    ap.add_argument("--doc-tokens", default="50-400", help="LOW-HIGH tokens per document (uniform)")
    ap.add_argument("--prefix-caching", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", help="vLLM and sentence-transformers dtype, e.g. bfloat16")
    # Prefix caching reuses whole blocks: vLLM's default is 16 tokens on a GPU, 128 on the CPU build (multiples of 32).
    ap.add_argument("--block-size", type=int, default=None, help="vLLM KV-cache block size (default: vLLM's)")
    ap.add_argument("--chunk-size", type=int, default=None, help="pairs per backend call (default: the backend's)")
    ap.add_argument("--st-batch-size", type=int, default=32)
    ap.add_argument("--st-queries", type=int, default=None, help="score only the first N queries with st")
    stats = "vLLM's stats on (disable_log_stats=False): the prefix-cache hit rate"
    ap.add_argument("--engine-stats", action=argparse.BooleanOptionalAction, default=True, help=stats)
    ap.add_argument("--worker-timeout", type=int, default=1800, help="seconds per configuration")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one configuration, in its own process
    return ap.parse_args(argv)


def source_texts(tokenizer, seed: int) -> tuple[list[str], list[str]]:
    """(query sources, document sources): gensim's 50 Lee articles and 300 + 200 background/newsgroup texts, or
    random vocabulary words (sentences of 6-20) when gensim's data is not installed."""
    try:
        from vllm_eval.tasks.data import lee_background_documents, lee_documents, mini_newsgroups

        heads = list(lee_documents())
        return heads, [*lee_background_documents(), *mini_newsgroups().texts, *heads]
    except (ImportError, OSError):
        rng = np.random.default_rng(seed)
        words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2]

        def text(n_sentences: int) -> str:
            return " ".join(" ".join(rng.choice(words, rng.integers(6, 21))) + "." for _ in range(n_sentences))

        return [text(2) for _ in range(60)], [text(int(rng.integers(5, 30))) for _ in range(600)]


def make_pairs(tokenizer, args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    """``--queries`` queries (6-16 leading words of an article) and each one's ``--docs-per-query`` documents.

    Documents are ranked by words shared with the query (a first stage's top list) and cut to their own length,
    drawn from ``--doc-tokens`` once per document (documents too short are continued by the next text).
    """
    rng = np.random.default_rng(args.seed)
    low, high = (int(x) for x in args.doc_tokens.split("-"))
    heads, sources = source_texts(tokenizer, args.seed)
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in sources]
    lengths = rng.integers(low, high + 1, len(sources))
    docs_all = []
    for i, n in enumerate(lengths):
        run, j = list(ids[i]), i
        while len(run) < n:  # continue with the next texts
            j = (j + 1) % len(ids)
            run += ids[j]
        docs_all.append(tokenizer.decode(run[:n]))
    # Ranked on the whole source text: the length a document is cut to stays independent of its rank.
    vocab_of = [set(t.lower().split()) for t in sources]
    queries, lists = [], []
    for k in range(args.queries):
        words = heads[k % len(heads)].split()
        start = 0 if k < len(heads) else int(rng.integers(0, max(1, len(words) - 16)))
        query = " ".join(words[start : start + int(rng.integers(6, 17))])
        q = set(query.lower().split())
        overlap = np.array([len(q & v) / np.sqrt(len(v) + 1) for v in vocab_of])
        top = np.argsort(-overlap, kind="stable")[: args.docs_per_query]
        queries.append(query)
        lists.append([docs_all[i] for i in top])
    return queries, lists


def prefix_stats(llm) -> dict[str, float] | None:
    """vLLM's prefix-cache counters (queried and hit tokens), when its stats are on; else None."""
    try:
        metrics = llm.get_metrics()
    except Exception:  # stats off, or an engine without them
        return None
    out = {"queries": 0.0, "hits": 0.0}
    for m in metrics:
        for key in out:
            if m.name == f"vllm:prefix_cache_{key}":
                out[key] += float(getattr(m, "value", 0.0))
    return out if out["queries"] else None


def engine_facts(backend) -> dict:
    """What the engine holds of the options measured here (read from its config, not from what we asked)."""
    llm = getattr(backend, "llm", None)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if config is None:
        return {}
    cache = config.cache_config
    blocks = getattr(cache, "num_gpu_blocks", None)  # set where the engine core runs (None when not known here)
    return {
        "engine_prefix_caching": bool(cache.enable_prefix_caching),
        "block_size": cache.block_size,
        "kv_cache_tokens": blocks * cache.block_size if blocks else None,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
    }


def _device_facts() -> dict:
    """The GPU's name and this process's peak torch allocation (sentence-transformers' model and activations; vLLM's
    engine allocates in its own process on a GPU), or the CPU."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu"}
    return {
        "device": torch.cuda.get_device_name(0),
        "torch_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }


def run_worker(cfg: dict) -> dict:
    """One configuration: load the backend, warm it up, time ``predict`` over every pair (mteb's call)."""
    from vllm_eval.models.backends import load_backend
    from vllm_eval.tasks.offline import LeeKnownItemRetrieval
    from vllm_eval.testing import text_loader

    data = json.loads(Path(cfg["pairs"]).read_text())
    queries, lists = data["queries"][: cfg.get("n_queries")], data["docs"][: cfg.get("n_queries")]
    kwargs = {"preset": cfg["preset"], "dtype": cfg["dtype"], "max_model_len": cfg["max_model_len"]}
    kwargs["show_progress_bar"] = False
    if cfg["chunk_size"]:
        kwargs["chunk_size"] = cfg["chunk_size"]
    if cfg["backend"] == "vllm":
        kwargs["enable_prefix_caching"] = cfg["prefix_caching"]
        if cfg["block_size"]:
            kwargs["block_size"] = cfg["block_size"]
        if cfg["engine_stats"]:
            kwargs["disable_log_stats"] = False
    else:
        kwargs["batch_size"] = cfg["st_batch_size"]
    start = time.perf_counter()
    backend = load_backend("reranker", cfg["backend"], cfg["model"], **kwargs)
    ready = time.perf_counter() - start
    with backend:
        facts = engine_facts(backend)
        backend.score_pairs([WARMUP_QUERY] * WARMUP_PAIRS, lists[0][:WARMUP_PAIRS])
        llm = getattr(backend, "llm", None)
        before = prefix_stats(llm) if llm is not None else None
        tokens = backend.counters.tokens
        q_flat = [q for q, docs in zip(queries, lists) for _ in docs]
        d_flat = [d for docs in lists for d in docs]
        start = time.perf_counter()
        scores = backend.predict(
            text_loader(q_flat, 32),  # mteb's default encode batch size
            text_loader(d_flat, 32),
            task_metadata=LeeKnownItemRetrieval.metadata,
            hf_split="test",
            hf_subset="default",
        )
        seconds = time.perf_counter() - start
        tokens = backend.counters.tokens - tokens
        after = prefix_stats(llm) if llm is not None else None
    device = _device_facts()
    hit = None
    if before is not None and after is not None and after["queries"] > before["queries"]:
        hit = (after["hits"] - before["hits"]) / (after["queries"] - before["queries"])
    return {
        "backend": cfg["backend"],
        "prefix_caching": cfg["prefix_caching"],
        **facts,
        **device,
        "ready_s": round(ready, 2),
        "pairs": len(d_flat),
        "seconds": round(seconds, 3),
        "pairs_per_s": round(len(d_flat) / seconds, 1),
        "prompt_tokens": int(tokens),
        "tokens_per_s": round(tokens / seconds, 0),
        "prefix_cache_hit_rate": None if hit is None else round(hit, 4),
        "scores": [float(s) for s in scores],
    }


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho of two score vectors (ranks by argsort; nan when one is constant)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if np.std(ra) == 0 or np.std(rb) == 0 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def agreement(scores: list[float], ref: list[float], per_query: int) -> dict:
    """Max and mean |diff| over the pairs both scored, and Spearman's rho per query (mean, min)."""
    n = min(len(scores), len(ref))
    a, b = np.asarray(scores[:n], dtype=np.float64), np.asarray(ref[:n], dtype=np.float64)
    rhos = [spearman(a[i : i + per_query], b[i : i + per_query]) for i in range(0, n, per_query)]
    return {
        "pairs": n,
        "max_abs_diff": float(np.max(np.abs(a - b))),
        "mean_abs_diff": float(np.mean(np.abs(a - b))),
        "spearman_mean": float(np.nanmean(rhos)) if not np.all(np.isnan(rhos)) else None,
        "spearman_min": float(np.nanmin(rhos)) if not np.all(np.isnan(rhos)) else None,
        "score_std": float(np.std(b)),
    }


def run_config(cfg: dict, workdir: Path, timeout: int) -> dict:
    """One configuration in a fresh process (its engine's memory is all given back when it exits)."""
    path = workdir / f"{cfg['backend']}-{cfg['prefix_caching']}.json"
    cfg = {**cfg, "out": str(path)}
    cfg_path = path.with_suffix(".cfg.json")
    cfg_path.write_text(json.dumps(cfg))
    label = f"{cfg['backend']}" + ("" if cfg["prefix_caching"] is None else f" prefix_caching={cfg['prefix_caching']}")
    print(f"--- {label}", flush=True)
    try:
        argv = [sys.executable, __file__, "--model", cfg["model"], "--worker", str(cfg_path)]
        rc = subprocess.run(argv, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc != 0 or not path.is_file():
        return {"backend": cfg["backend"], "prefix_caching": cfg["prefix_caching"], "error": f"exit {rc}"}
    return json.loads(path.read_text())


def prompt_shape(tokenizer, preset: str, queries: list[str], lists: list[list[str]]) -> dict:
    """Mean tokens of the templated query part (the prefix a query's documents share) and of whole prompts."""
    from vllm_eval.models.presets import get_preset

    template = get_preset(preset).score_template
    head, tail = template.document_parts()

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    q_part = [count(template.query(q)) for q in queries]
    sample = [(q, d) for q, docs in zip(queries, lists) for d in docs[:10]]
    whole = [count(template.query(q) + head + d + tail) for q, d in sample]
    return {"query_part_tokens": float(np.mean(q_part)), "prompt_tokens_mean": float(np.mean(whole))}


def _cells(run: dict) -> list[str]:
    """One run's row of the table (an error in place of the measurements when the run failed)."""
    setting = {True: "on", False: "off", None: "-"}[run["prefix_caching"]]
    if run.get("engine_prefix_caching") not in (None, run["prefix_caching"]):
        setting += " (engine: other!)"  # the option did not reach the engine
    if "error" in run:
        return [run["backend"], setting, run["error"], *[""] * 7]
    agree = run.get("agreement") or {}
    hit = run.get("prefix_cache_hit_rate")
    rho = agree.get("spearman_mean")
    return [
        run["backend"],
        setting,
        f"{run['ready_s']:.1f}",
        str(run["pairs"]),
        f"{run['seconds']:.2f}",
        f"{run['pairs_per_s']:.1f}",
        f"{run['tokens_per_s']:.0f}",
        "-" if hit is None else f"{hit:.1%}",
        f"{agree['max_abs_diff']:.2e}" if agree else "-",
        "-" if rho is None else f"{rho:.4f}/{agree['spearman_min']:.4f}",
    ]


#: The table's columns (``hit rate``: vLLM's prefix-cache hits over queried tokens; ``ref``: ``st``'s scores).
COLUMNS = ["backend", "prefix", "ready s", "pairs", "s", "pairs/s", "tok/s", "hit rate", "max|d| ref", "rho mean/min"]


def print_table(report: dict) -> None:
    rows = [_cells(run) for run in report["runs"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    for row in [COLUMNS, *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        cfg = json.loads(Path(args.worker).read_text())
        Path(cfg["out"]).write_text(json.dumps(run_worker(cfg)))
        return
    from transformers import AutoTokenizer

    if args.shape and not (Path(args.model) / "config.json").is_file():
        from vllm_eval.testing import build_random_reranker_model

        start = time.perf_counter()
        build_random_reranker_model(args.model, args.shape, args.tokenizer, dtype=args.dtype)
        print(f"built {args.shape} into {args.model} in {time.perf_counter() - start:.1f} s", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    queries, lists = make_pairs(tokenizer, args)
    config = json.loads((Path(args.model) / "config.json").read_text())
    report = {
        "model": str(Path(args.model).resolve()),
        "shape": {k: config.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")},
        "queries": len(queries),
        "docs_per_query": args.docs_per_query,
        "doc_tokens": args.doc_tokens,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        **prompt_shape(tokenizer, args.preset, queries, lists),
        "runs": [],
    }
    part, whole = report["query_part_tokens"], report["prompt_tokens_mean"]
    print(f"{len(queries)} queries x {args.docs_per_query} docs; query part {part:.0f} of {whole:.0f} tokens/prompt")
    with tempfile.TemporaryDirectory(prefix="rerank-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "pairs.json").write_text(json.dumps({"queries": queries, "docs": lists}))
        base = {k: getattr(args, k) for k in ("model", "preset", "dtype", "max_model_len", "chunk_size", "block_size")}
        base.update(pairs=str(workdir / "pairs.json"), engine_stats=args.engine_stats, st_batch_size=args.st_batch_size)
        configs = [{**base, "backend": "vllm", "prefix_caching": pc == "on"} for pc in args.prefix_caching]
        configs = configs if "vllm" in args.backends else []
        if "st" in args.backends:
            configs.append({**base, "backend": "st", "prefix_caching": None, "n_queries": args.st_queries})
        for cfg in configs:
            report["runs"].append(run_config(cfg, workdir, args.worker_timeout))
    summarize(report, args.docs_per_query)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def summarize(report: dict, per_query: int) -> None:
    """Agreement of each vLLM run with the reference (``st``), and of prefix caching on with off; scores dropped
    from the runs (kept as ``scores_sample``: the first query's)."""
    runs = [r for r in report["runs"] if "scores" in r]
    ref = next((r for r in runs if r["backend"] == "st"), None)
    on = next((r for r in runs if r["prefix_caching"] is True), None)
    off = next((r for r in runs if r["prefix_caching"] is False), None)
    for run in runs:
        if ref is not None and run is not ref:
            run["agreement"] = agreement(run["scores"], ref["scores"], per_query)
    if on is not None and off is not None:
        report["prefix_on_vs_off"] = agreement(on["scores"], off["scores"], per_query)
        print(f"prefix caching on vs off: max |diff| {report['prefix_on_vs_off']['max_abs_diff']:.2e}")
    for run in runs:
        run["scores_sample"] = run.pop("scores")[:per_query]


if __name__ == "__main__":
    main()
