"""Models: one folder per kind (``encoder``, ``reranker``, ``generator``, ``classifier``, ``token_classifier``,
``token_embedder``), each with its base class and one module per backend (``vllm``, the ``st``/``hf`` reference,
``remote``); the table that maps (kind, backend) to a class (:mod:`.backends`); and what the kinds share: the
backend base (:mod:`.base`), the vLLM backend over one engine or replicas (:mod:`.vllm_backend`), presets,
prompts, pooling, images, HTTP, streaming and the output cache (:mod:`.cache`)."""
