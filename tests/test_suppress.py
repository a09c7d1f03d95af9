"""Whisper's token suppression under both of vLLM's model runners, with vLLM's own loaders and interface types.

The CPU build runs the V1 runner only (Model Runner V2 needs Triton on a GPU), so the transcripts the speech tests
compare with transformers' exercise the V1 path. vLLM 0.31-0.33 on a GPU load custom logits processors with Model
Runner V2's loader, which refused the V1-only class ("WhisperSuppress is not a subclass of
vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor"). Here both loaders take the class, and both runners'
calls give the same logits for the same requests, rows reordered as Model Runner V2 reorders them.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, _load_custom_logitsprocs
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState
from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns

from vllm_eval.engine.suppress import SUPPRESS_KEY, WhisperSuppress
from vllm_eval.models.transcriber.vllm import SUPPRESS_PROCESSOR

VOCAB, SLOTS = 40, 8
ALWAYS, BEGIN = (3, 7, 11), (0, 39)


def _params(suppress: bool) -> SamplingParams:
    return SamplingParams(temperature=0.0, extra_args={SUPPRESS_KEY: (ALWAYS, BEGIN)} if suppress else None)


def _expected(logits: torch.Tensor, wants: list[bool], first: list[bool]) -> torch.Tensor:
    out = logits.clone()
    for row, (want, at_first) in enumerate(zip(wants, first, strict=True)):
        if want:
            out[row, list(ALWAYS)] = -float("inf")
            if at_first:
                out[row, list(BEGIN)] = -float("inf")
    return out


def test_both_runners_loaders_take_the_class():
    """Model Runner V2's loader (vLLM's own code) takes the FQCN the transcriber passes; so does the V1 one."""
    assert _load_v2_logitsprocs_by_fqcns([SUPPRESS_PROCESSOR]) == [WhisperSuppress]
    assert _load_custom_logitsprocs([SUPPRESS_PROCESSOR]) == [WhisperSuppress]


def _v2_state(prompt_len: list[int], total_len: list[int]) -> LogitsProcRequestState:
    def tensor(values: list[int]) -> SimpleNamespace:
        return SimpleNamespace(gpu=torch.tensor(values, dtype=torch.int32), np=np.asarray(values, dtype=np.int32))

    return LogitsProcRequestState(
        device=torch.device("cpu"),
        max_num_reqs=SLOTS,
        vocab_size=VOCAB,
        all_token_ids=None,
        prompt_len=tensor(prompt_len),
        prefill_len=tensor(prompt_len),
        total_len=tensor(total_len),
    )


@pytest.mark.parametrize("seed", range(4))
def test_model_runner_v2_suppresses_as_v1(seed: int):
    """Slots 0-5 hold requests (2 and 4 ask for no suppression); slot 5 is at its first step. Each step's rows come
    in another order (V2 maps rows to slots every step); the V1 runner, told the same requests row by row, gives
    the same logits."""
    rng = np.random.default_rng(seed)
    wants = [True, True, False, True, False, True]
    outputs = [[5], [5, 6], [], [1, 2, 3], [9], []]  # committed output tokens per slot
    prompt_len = [4, 4, 4, 5, 4, 4, 0, 0]
    total = [p + len(o) for p, o in zip(prompt_len, outputs + [[], []])]
    v2 = WhisperSuppress(None, _v2_state(prompt_len, total))
    for slot, want in enumerate(wants):
        assert v2.add_request(slot, _params(want)) is want
    v2.add_request(6, _params(True))  # a slot that takes no part in this step
    order = rng.permutation(len(wants))
    logits = torch.from_numpy(rng.standard_normal((len(order), VOCAB)).astype(np.float32))
    mapping = torch.tensor(order, dtype=torch.int32)
    ctx = LogitsContext(
        expanded_idx_mapping=mapping,
        idx_mapping=mapping,
        idx_mapping_np=order.astype(np.int32),
        expanded_local_pos=torch.zeros(len(order), dtype=torch.int32),
        input_ids=torch.zeros(len(order), dtype=torch.int32),
        pos=torch.zeros(len(order), dtype=torch.int32),
        seq_lens_upper_bound_np=np.zeros(len(order), dtype=np.int32),
    )
    row_wants = [wants[s] for s in order]
    row_first = [not outputs[s] for s in order]
    expected = _expected(logits, row_wants, row_first)
    got = v2.apply(logits.clone(), ctx)
    assert torch.equal(got, expected)

    v1 = WhisperSuppress(None, torch.device("cpu"), False)
    added = [(row, _params(row_wants[row]), [1] * 4, list(outputs[order[row]])) for row in range(len(order))]
    v1.update_state(BatchUpdate(batch_size=len(order), removed=[], added=added, moved=[]))
    assert torch.equal(v1.apply(logits.clone()), expected)


def test_model_runner_v2_slot_reuse():
    """A recycled slot takes its new request's rules: suppression dropped when the new one asks for none."""
    v2 = WhisperSuppress(None, _v2_state([4] * SLOTS, [6] * SLOTS))
    assert v2.add_request(0, _params(True))
    ctx = SimpleNamespace(expanded_idx_mapping=torch.tensor([0], dtype=torch.int32))
    logits = torch.zeros((1, VOCAB))
    assert torch.isinf(v2.apply(logits.clone(), ctx)[0, list(ALWAYS)]).all()
    assert not v2.add_request(0, _params(False))
    assert torch.equal(v2.apply(logits.clone(), ctx), logits)
