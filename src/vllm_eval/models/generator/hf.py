"""The reference generator: a transformers causal LM behind the generator interface (``--backend hf``).

Chat messages, the chat template, sampling defaults, the cache and the log-likelihood loop are those
of :class:`~vllm_eval.models.generator.base.GeneratorBase`; only the model call differs: a forward pass
whose ``log_softmax`` gives the continuation's log-probabilities (as lm-evaluation-harness's ``hf``
model does), and ``generate`` for answers. ``vllm-eval compare --kind generator`` compares
:class:`~vllm_eval.models.generator.vllm.VllmGenerator` with this backend. Text only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef
from ..base import load_torch_model, torch_dtype_name
from .base import Generation, GeneratorBase, LocalChatTemplate


class TransformersGenerator(LocalChatTemplate, GeneratorBase):
    """``AutoModelForCausalLM`` as a generator: the reference for log-likelihoods and greedy answers.

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        device: torch device (``"cpu"``, ``"cuda"``); None: CUDA when available, else CPU.
        dtype: ``float32`` (default, the parity reference), ``float16`` or ``bfloat16``.
        batch_size: sequences per forward pass.
        chat_template, chat_template_kwargs, think_end_token, system_prompt, raw_prompts, sampling,
            chunk_size, show_progress_bar, trust_remote_code: as for
            :class:`~vllm_eval.models.generator.vllm.VllmGenerator`.

    Raises:
        UsageError: an unknown dtype; no chat template and neither ``chat_template`` nor ``raw_prompts``.
        ModelNotFoundError: a model path that does not exist.
    """

    supports_loglikelihood: ClassVar[bool] = True
    supports_images: ClassVar[bool] = False
    engine_options: ClassVar[frozenset[str] | None] = frozenset({"dtype", "trust_remote_code"})

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 8,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        think_end_token: str | None = None,
        system_prompt: str | None = None,
        raw_prompts: bool = False,
        sampling: dict[str, Any] | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        trust_remote_code: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM

        ref = ModelRef.resolve(model, revision)
        super().__init__(
            model=ref.path,
            model_ref=ref,
            system_prompt=system_prompt,
            raw_prompts=raw_prompts,
            sampling=sampling,
            chat_template_kwargs=chat_template_kwargs,
            think_end_token=think_end_token,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )
        self.chat_template = chat_template
        self.dtype = torch_dtype_name(dtype)
        self.batch_size = batch_size
        self.lm, self.tokenizer, self.device = load_torch_model(
            AutoModelForCausalLM,
            ref,
            revision=revision,
            dtype=self.dtype,
            device=device,
            trust_remote_code=trust_remote_code,
        )
        self._check_template()

    def identity(self) -> dict[str, Any]:
        """The base identity plus the chat template in use, dtype and device."""
        return {**super().identity(), "chat_template": self._template(), "dtype": self.dtype, "device": self.device}

    def image_part(self, image: Any) -> dict[str, Any]:
        """Images are not supported here.

        Raises:
            UsageError: always.
        """
        raise UsageError("the hf generator backend is text-only; use --backend vllm for image tasks")

    def _continuation_logprobs(
        self,
        token_ids: list[list[int]],
        starts: list[int],
        names: list[str],
        images: list[Sequence[Any]] | None = None,
    ) -> np.ndarray:
        """One forward pass per batch of right-padded sequences; ``log_softmax`` of the logits in float32
        (text only: :attr:`supports_images` is False, so ``images`` never arrive)."""
        import torch

        out = np.zeros(len(token_ids), dtype=np.float64)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for lo in range(0, len(token_ids), self.batch_size):
            batch = token_ids[lo : lo + self.batch_size]
            width = max(map(len, batch))
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, x in enumerate(batch):
                ids[i, : len(x)] = torch.tensor(x)
                mask[i, : len(x)] = 1
            with torch.inference_mode():
                logits = self.lm(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()
            for i, x in enumerate(batch):
                start = starts[lo + i]
                # The logits at position t-1 predict token t.
                target = torch.tensor(x[start:])
                out[lo + i] = float(logprobs[i, start - 1 : len(x) - 1].gather(1, target[:, None]).sum())
        return out

    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        import torch

        if any(images for _, images in chunk):
            self.image_part(None)
        s = self.sampling
        greedy = s.temperature == 0
        kwargs: dict[str, Any] = {"max_new_tokens": s.max_tokens, "do_sample": not greedy}
        if not greedy:
            kwargs.update(temperature=s.temperature, top_p=s.top_p)
            if s.top_k and s.top_k > 0:
                kwargs["top_k"] = s.top_k
            if s.seed is not None:
                torch.manual_seed(s.seed + offset)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        results = []
        for text, _ in chunk:
            prompt = self.render(text)
            ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].to(self.device)
            with torch.inference_mode():
                out = self.lm.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=pad, **kwargs)
            new = out[0, ids.shape[1] :].tolist()
            results.append(
                Generation(
                    prompt=prompt,
                    output=self.tokenizer.decode(new, skip_special_tokens=True),
                    prompt_tokens=int(ids.shape[1]),
                    output_tokens=len(new),
                )
            )
        return results

    def close(self) -> None:
        """Drop the model so its memory can be freed. Idempotent."""
        self.lm = None
        super().close()
