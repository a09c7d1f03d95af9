""":class:`WhisperSuppress`: Whisper's token suppression as a vLLM logits processor, for both of vLLM's model runners.

Whisper's generation config suppresses some tokens at every step (``suppress_tokens``: non-speech symbols) and the
blank and end-of-text at the first (``begin_suppress_tokens``), as OpenAI's decoder and transformers' generate do;
vLLM's Whisper applies neither. Requests that want it carry ``SamplingParams.extra_args[SUPPRESS_KEY]`` = (every
step's tokens, the first step's tokens).

vLLM has two logits-processor interfaces and decides inside the engine which runner (and so which interface) a model
gets: the V1 runner's ``vllm.v1.sample.logits_processor.LogitsProcessor`` (``__init__(vllm_config, device,
is_pin_memory)``, ``update_state(batch_update)``, ``apply(logits)``), and from vLLM 0.31 Model Runner V2's
``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`` (``__init__(vllm_config, req_states)``,
``add_request(slot, params)``, ``apply(logits, ctx)``, rows mapped to request slots every step; vLLM PR #56497). Each
runner's loader accepts only a subclass of its own base, and vLLM 0.31-0.33 on a GPU picks Model Runner V2 for
Whisper, the CPU build the V1 runner. So :class:`WhisperSuppress` subclasses both bases (where the installed vLLM has
them) and the constructor's arguments say which runner built it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SUPPRESS_KEY", "WhisperSuppress"]

#: ``SamplingParams.extra_args`` key: (tokens suppressed at every step, tokens suppressed at the first step).
SUPPRESS_KEY = "vllm_eval_suppress"
#: A request's suppression in the V1 runner: (every step's tokens, the first step's, its outputs so far).
_Row = tuple[tuple[int, ...], tuple[int, ...], list[int]]


def _bases() -> tuple[type, ...]:
    """The logits-processor base classes the installed vLLM has: V1's, and Model Runner V2's (vLLM >= 0.31)."""
    bases: list[type] = []
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor as V1
    except ImportError:  # no vLLM here (a parent of replicas): the class is only built where an engine runs
        return (object,)
    bases.append(V1)
    try:
        from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2
    except ImportError:  # vLLM < 0.31: the V1 runner takes every custom processor
        pass
    else:
        bases.append(V2)
    return tuple(bases)


def _suppression(params: Any) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A request's (every step's tokens, first step's tokens), None when it asks for no suppression."""
    extra = getattr(params, "extra_args", None) or {}
    if SUPPRESS_KEY not in extra:
        return None
    always, begin = extra[SUPPRESS_KEY]
    return tuple(int(t) for t in always), tuple(int(t) for t in begin)


class WhisperSuppress(*_bases()):  # type: ignore[misc]
    """Whisper's suppression for the requests that ask for it: their logits set to -inf, as transformers'
    ``SuppressTokensLogitsProcessor`` and ``SuppressTokensAtBeginLogitsProcessor`` (and OpenAI's ``SuppressTokens`` /
    ``SuppressBlank``) do. Logits are float32 ``[rows, vocab]``, edited in place; the work per step is a few device
    ops however many rows the batch holds (index tensors rebuilt only when the batch's membership changes).

    Args (V1 runner):
        vllm_config, device, is_pin_memory: as vLLM's V1 runner passes them.
    Args (Model Runner V2):
        vllm_config, req_states: as Model Runner V2 passes them (``LogitsProcRequestState``: per-slot
            ``prompt_len`` and ``total_len`` on the device, read to find each row's first step).
    """

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        import torch

        #: Model Runner V2 passes (vllm_config, req_states); the V1 runner (vllm_config, device, is_pin_memory).
        self.v2 = len(runner_args) == 1
        self.device = runner_args[0].device if self.v2 else runner_args[0]
        self.req_states = runner_args[0] if self.v2 else None
        self.neg_inf = torch.tensor(-float("inf"), dtype=torch.float32, device=self.device)
        self.columns: dict[tuple[int, ...], Any] = {}
        # V1: batch row -> (always, begin, outputs); the every-step (rows, columns) index pairs, None when stale
        self.rows: dict[int, _Row] = {}
        self.always: list[tuple[Any, Any]] | None = None
        # V2: request slot -> (always, begin); per token set, a bool mask over slots, on the device once staged
        self.slots: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.masks: list[tuple[Any, Any, Any]] | None = None  # (columns, always mask, begin mask)

    # --- both runners -----------------------------------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        return False  # suppressing tokens changes greedy picks

    def _cols(self, tokens: tuple[int, ...]) -> Any:
        import torch

        if tokens not in self.columns:
            self.columns[tokens] = torch.tensor(tokens, dtype=torch.long, device=self.device)
        return self.columns[tokens]

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        return self._apply_v2(logits, ctx) if self.v2 else self._apply_v1(logits)

    # --- V1 runner: rows are requests, told by batch updates ----------------------------------------------------------

    @staticmethod
    def _state(params: Any, _prompt: Any, outputs: list[int]) -> _Row | None:
        found = _suppression(params)
        return None if found is None else (*found, outputs)

    def update_state(self, batch_update: Any) -> None:
        from vllm.v1.sample.logits_processor.builtin import process_dict_updates

        if process_dict_updates(self.rows, batch_update, self._state):
            self.always = None

    def _apply_v1(self, logits: Any) -> Any:
        import torch

        if not self.rows:
            return logits
        if self.always is None:
            groups: dict[tuple[int, ...], list[int]] = {}
            for row, (always, _, _) in self.rows.items():
                if always:
                    groups.setdefault(always, []).append(row)
            self.always = [
                (torch.tensor(rows, dtype=torch.long, device=self.device)[:, None], self._cols(tokens)[None, :])
                for tokens, rows in groups.items()
            ]
        value = self.neg_inf.to(logits.dtype)
        for rows, cols in self.always:
            logits[rows, cols] = value
        # the first step's suppression: only rows that have generated nothing yet (a few per step)
        for row, (_, begin, outputs) in self.rows.items():
            if begin and not outputs:
                logits[row, self._cols(begin)] = value
        return logits

    # --- Model Runner V2: requests live in slots; each step maps rows to slots ---------------------------------------

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        found = _suppression(sampling_params)
        had = self.slots.pop(req_idx, None)
        if found is not None and any(found):
            self.slots[req_idx] = found
        if had != self.slots.get(req_idx):
            self.masks = None
        return req_idx in self.slots

    def _slot_masks(self) -> list[tuple[Any, Any, Any]]:
        """Per token set: (its columns, bool [max_num_reqs] slots suppressing it at every step, ... at the first)."""
        import torch

        n = int(self.req_states.max_num_reqs)
        sets: dict[tuple[int, ...], tuple[Any, Any]] = {}
        for slot, (always, begin) in self.slots.items():
            for tokens, which in ((always, 0), (begin, 1)):
                if tokens:
                    masks = sets.setdefault(
                        tokens, (torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool))
                    )
                    masks[which][slot] = True
        return [(self._cols(t), a.to(self.device), b.to(self.device)) for t, (a, b) in sets.items()]

    def _apply_v2(self, logits: Any, ctx: Any) -> Any:
        if not self.slots:
            return logits
        if self.masks is None:
            self.masks = self._slot_masks()
        slot = ctx.expanded_idx_mapping.long()
        states = self.req_states
        # a slot that has committed no output token yet is at its first step (vLLM's bad-words stage reads the same)
        first = states.total_len.gpu[slot] == states.prompt_len.gpu[slot]
        value = self.neg_inf.to(logits.dtype)
        for cols, always, begin in self.masks:
            rows = always[slot] | (begin[slot] & first)
            logits[:, cols] = logits[:, cols].masked_fill(rows[:, None], value)
        return logits
