"""vllm-eval: evaluate embedding models, rerankers and generative models with vLLM as the engine."""

from __future__ import annotations

from .utils.lazy import keep_moved_paths, lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "VllmEncoder": "models.encoder.vllm",
    "SentenceTransformerEncoder": "models.encoder.st",
    "RemoteEncoder": "models.encoder.remote",
    "VllmReranker": "models.reranker.vllm",
    "SentenceTransformerReranker": "models.reranker.st",
    "RemoteReranker": "models.reranker.remote",
    "VllmGenerator": "models.generator.vllm",
    "VllmLM": "models.generator.lmeval",
    "VllmVLM": "models.generator.lmeval_vlm",
    "RemoteGenerator": "models.generator.remote",
    "HttpOptions": "models.http",
    "load_backend": "models.backends",
    "register_preset": "models.presets",
    "ModelPreset": "models.presets",
    "ScoreTemplate": "models.presets",
    "VllmEvalError": "utils.errors",
    "ImageInput": "models.images",
    "evaluate": "api.evaluate",
    "EvaluationResult": "api.evaluate",
    "classify": "api.classify",
    "reward": "api.classify",
    "token_classify": "api.classify",
    "transcribe": "api.transcribe",
    "compare": "api.compare",
    "bench": "api.bench",
    "rerank": "api.rerank",
    "RerankResult": "api.rerank",
    "generate": "api.generate",
    "GenerationResult": "api.generate",
}
__all__ = [*_LAZY, "__version__"]
# Lazy: `import vllm_eval` must not import vLLM or torch (the CLI's `tasks` and `--help` stay fast).
__getattr__ = lazy_exports(__name__, _LAZY)

#: Modules that moved into subsystem packages, by their old path: the old import paths keep working (the old
#: ``engine`` and ``replicas`` modules are now packages of those names, exporting their names; ``vllm_eval.compare`` and
#: ``vllm_eval.bench`` are now the library functions, their modules ``measure.compare`` and ``measure.bench``).
_MOVED = {
    "_lazy": "utils.lazy",
    "errors": "utils.errors",
    "logs": "utils.logs",
    "progress": "utils.progress",
    "timeline": "utils.timeline",
    "telemetry": "utils.telemetry",
    "hub": "utils.hub",
    "engine_args": "engine.args",
    "engine_jobs": "engine.jobs",
    "pipeline": "engine.pipeline",
    "procenv": "engine.procenv",
    "replica_process": "replicas.process",
    "replicas_ahead": "replicas.ahead",
    "ray_replicas": "replicas.ray",
    "jobpool": "replicas.jobpool",
    "base": "models.base",
    "backends": "models.backends",
    "kinds": "models.kinds",
    "presets": "models.presets",
    "prompts": "models.prompts",
    "pooling": "models.pooling",
    "images": "models.images",
    "http": "models.http",
    "streaming": "models.streaming",
    "modelinfo": "utils.modelinfo",
    "vllm_backend": "models.vllm_backend",
    "cache": "models.cache",
    "encoder": "models.encoder",
    "reranker": "models.reranker",
    "generator": "models.generator",
    "classifier": "models.classifier",
    "token_classifier": "models.token_classifier",
    "token_embedder": "models.token_embedder",
    "results": "evaluation.results",
    "task_processes": "evaluation.task_processes",
    "concurrency": "evaluation.concurrency",
    "two_stage": "evaluation.two_stage",
    "tasks.prefetch": "evaluation.prefetch",
    "suite": "measure.suite",
    "report": "measure.report",
}
keep_moved_paths(__name__, _MOVED)


def _register_with_lm_eval() -> None:
    """lm-eval's model registry learns ``vllm-eval`` (``lm_eval --model vllm-eval``, ``simple_evaluate(model=
    "vllm-eval")``) and ``vllm-eval-vlm`` (tasks with images) as lazy ``module:Class`` entries: nothing of vLLM or
    torch is imported until one is used."""
    try:
        import lm_eval.models  # noqa: F401  (its built-in names first: lm-eval fills an empty registry only)
        from lm_eval.api.registry import model_registry
    except ImportError:  # lm-eval not installed: nothing to register with
        return
    for name, target in (("vllm-eval", "lmeval:VllmLM"), ("vllm-eval-vlm", "lmeval_vlm:VllmVLM")):
        if name not in model_registry:
            model_registry.register(name, target=f"vllm_eval.models.generator.{target}")


_register_with_lm_eval()
