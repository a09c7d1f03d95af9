"""The reference backend: the same encoder interface over sentence-transformers (``--backend st``).

Prompts, instructions, input checks, chunking, truncation reports and metadata are the ones of
:class:`vllm_eval.encoder.TextEncoder`; only the model call differs. Parity tests compare the two.
"""

from __future__ import annotations


import numpy as np

from .encoder import BatchTokenizer, TextEncoder, packaged_model_path
from .engine import resolve_model
from .modelinfo import build_model_meta
from .prompts import InstructionTemplate, PromptResolver

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16", "auto": "auto"}


class SentenceTransformerEncoder(TextEncoder):
    """mteb ``EncoderProtocol`` over ``sentence_transformers.SentenceTransformer``.

    Args:
        model: local model directory or hub id; defaults to the packaged all-MiniLM-L6-v2.
        revision: hub revision.
        device: torch device (``"cpu"``, ``"cuda"``); None lets sentence-transformers choose.
        dtype: ``float32`` (default, the parity reference), ``float16``, ``bfloat16`` or ``auto``.
        max_model_len: token limit (sentence-transformers' ``max_seq_length``); None keeps the model's.
        batch_size: sentence-transformers batch size.
        dimensions: matryoshka width (sentence-transformers' ``truncate_dim``).
        normalize: force L2 normalisation; None follows the model's modules.
        trust_remote_code: allow the model repository's own code (default False).
        Other arguments as for :class:`vllm_eval.encoder.VllmEncoder`.
    """

    def __init__(
        self,
        model: str | None = None,
        revision: str | None = None,
        *,
        model_name: str | None = None,
        prompts: dict[str, str] | None = None,
        instruction_template: InstructionTemplate | None = None,
        instructions: dict[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
        dimensions: int | None = None,
        normalize: bool | None = None,
        device: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        batch_size: int = 32,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        trust_remote_code: bool = False,
    ) -> None:
        self.prompting = PromptResolver(
            prompts=prompts,
            instruction_template=instruction_template,
            instructions=instructions,
            apply_instruction_to_documents=apply_instruction_to_documents,
        )
        from sentence_transformers import SentenceTransformer

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.model = resolve_model(model or packaged_model_path())
        self.st = SentenceTransformer(
            self.model,
            revision=revision,
            device=device,
            trust_remote_code=trust_remote_code,
            truncate_dim=dimensions,
            model_kwargs={"torch_dtype": _DTYPES[dtype]},
        )
        if max_model_len is not None:
            self.st.max_seq_length = int(max_model_len)
        self.max_length = int(self.st.max_seq_length)
        self.normalize = normalize
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.show_progress_bar = show_progress_bar
        first = self.st[0]
        self.tokenize = BatchTokenizer(self.st.tokenizer, self.max_length, bool(getattr(first, "do_lower_case", False)))
        self.mteb_model_meta = build_model_meta(
            self.model,
            revision=revision,
            model_name=model_name,
            embed_dim=dimensions,
            max_model_len=self.max_length,
            framework=["Sentence Transformers", "PyTorch"],
            use_instructions=instruction_template is not None,
        )
        self.name = self.mteb_model_meta.name

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        del ids  # sentence-transformers tokenizes itself; ids only served the truncation count
        emb = self.st.encode(
            texts,
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
            normalize_embeddings=bool(self.normalize),
        )
        return np.asarray(emb, dtype=np.float32)

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.st = None
