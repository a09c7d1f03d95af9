"""Batch tokenization that gives the token ids vLLM's own text path would: in the command's process, and in a replica
that tokenizes its own share of a chunk (:func:`vllm_eval.engine.jobs.embed_texts_job`)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any


def private_tokenizer(tokenizer: Any) -> Any:
    """A copy of a Hugging Face tokenizer for the look-ahead thread of :func:`vllm_eval.models.streaming.prefetched`.

    A fast tokenizer keeps its truncation and padding settings on the shared Rust object and sets
    them before every call, so two threads calling one tokenizer with different settings get each
    other's (measured: sentence-transformers' padded batches came back ragged while another thread
    tokenized with ``max_length=257``; see huggingface/tokenizers#537 on thread safety). The
    backend's own tokenizer stays with the backend; ours is a deep copy (None stays None).
    """
    return None if tokenizer is None else copy.deepcopy(tokenizer)


#: Texts both tokenizer paths of :class:`BatchTokenizer` must agree on before the direct one is used: cases, accents,
#: CJK, emoji, special-token strings, whitespace, an empty text and texts past any limit.
PROBE_TEXTS = [
    "Hello, World! It's 2026 -- isn't it?",
    "naïve café Ångström ÉCOLE straße",
    "东京是日本的首都。 ソウル 서울",
    "emoji 🙂🚀 and symbols ≤ ≥ ∑ € £",
    "[CLS] <s> </s> <|endoftext|> [SEP] [MASK] <pad> [UNK]",
    "  leading and trailing   spaces\tand\ttabs\nnewlines  ",
    "",
    " ".join(f"word{i} token{i % 7}" for i in range(400)),
    "x" * 3000,
    " ".join(["z" * 150] * 20),  # words past WordPiece's 100 characters: a cut text that stays within a small limit
]

#: A text longer than this many characters per token of the limit is tokenized up to the first space past them,
#: where :func:`_splits_words_at_spaces` holds; its whole text only where that part stays within the limit. Touche2020's
#: documents cut to 512 tokens end by their 4,299th character at most; at 12 no text of the MTEB(eng, v2) replica at
#: ``--fraction 0.05`` (133,561 texts, 84 M characters) needed its whole text, at 8 there were 2,302
#: (``scripts/tokenize_bench.py --replica``).
CUT_CHARS_PER_TOKEN = 12

#: Normalizers that map each character on its own (or compose only within a run that a space ends).
_LOCAL_NORMALIZERS = frozenset({"BertNormalizer", "Lowercase", "NFD", "NFKD", "NFC", "NFKC", "StripAccents"})
#: Pre-tokenizers that end every word at a space, and those that only split further within words.
_SPACE_SPLITTERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
_WITHIN_WORDS = frozenset({"Punctuation", "Digits"})


def _rust_tokenizer(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind a transformers fast tokenizer (our private copy), else None."""
    rust = getattr(tokenizer, "_tokenizer", None)
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - transformers' fast tokenizers need it
        return None
    return rust if isinstance(rust, Tokenizer) else None


def _members(node: dict | None, key: str) -> list[dict]:
    """A tokenizer.json component as a flat list: a ``Sequence``'s members (under ``key``), else itself (none: [])."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        return [m for part in node.get(key, []) for m in _members(part, key)]
    return [node]


def _splits_words_at_spaces(rust: Any) -> bool:
    """Whether a text cut just before a space gives, for all it keeps, the ids its whole text gives: the tokenizer's
    normalizers are character-local, its pre-tokenizer ends every word at a space and no added token holds a space
    (then no token spans the cut, and the model tokenizes each word on its own: WordPiece, BPE, Unigram alike)."""
    spec = json.loads(rust.to_str())
    normalizers = {n.get("type") for n in _members(spec.get("normalizer"), "normalizers")}
    splitters = {p.get("type") for p in _members(spec.get("pre_tokenizer"), "pretokenizers")}
    spaced = any(any(c.isspace() for c in t.get("content", "")) for t in spec.get("added_tokens") or [])
    return (
        normalizers <= _LOCAL_NORMALIZERS
        and bool(splitters & _SPACE_SPLITTERS)
        and splitters <= _SPACE_SPLITTERS | _WITHIN_WORDS
        and not spaced
    )


def _cut_at_space(text: str, reach: int) -> str:
    """``text`` up to (not with) its first space at or past character ``reach``; the text itself where none is."""
    k = text.find(" ", reach)
    return text[:k] if k > 0 else text


def _template_frame(rust: Any, add_special_tokens: bool) -> tuple[int, int] | None:
    """How many special tokens the post-processor puts before and after one text's own tokens, e.g. (1, 1) for BERT's
    ``[CLS] ... [SEP]``: truncating a text to one token fewer drops the last (or first) of its own. None where the ids
    are not framed so."""
    if not add_special_tokens:
        return 0, 0
    try:
        rust.no_truncation()
        rust.no_padding()
        body = rust.encode("a b", add_special_tokens=False).ids
        whole = rust.encode("a b", add_special_tokens=True).ids
        extra = rust.num_special_tokens_to_add(False)
    except Exception:  # noqa: BLE001 - any failure: truncated texts are tokenized again instead
        return None
    if len(whole) != len(body) + extra:
        return None
    return next(((k, extra - k) for k in range(extra + 1) if whole[k : k + len(body)] == body), None)


class BatchTokenizer:
    """Batch tokenization that yields the token ids vLLM's own text path would produce.

    vLLM's pooling renderer calls the HF tokenizer with ``add_special_tokens=True``,
    ``truncation=True, max_length=max_model_len`` (``truncate_prompt_tokens=-1``) and lower-cases
    first when the sentence-transformers config says ``do_lower_case``. Doing the same here, in
    batches, lets us count what was truncated and feed ``TokensPrompt``s.

    A fast tokenizer is called through its Rust ``Tokenizer`` directly, with the truncation, padding and special-token
    settings transformers' call would set (the calling thread's CPU per text about halved: 6.5 -> 2.9 us for 12-token
    texts, 16.2 -> 8.8 us for 97-token ones, ``scripts/tokenize_bench.py`` on 2 cores), once both calls gave the same
    ids and truncations for :data:`PROBE_TEXTS`; otherwise, and for slow tokenizers, through transformers. That path
    tokenizes each text once (a text over the limit loses its last own token instead of being tokenized again) and,
    where the tokenizer ends words at spaces, a long text only up to a space past :data:`CUT_CHARS_PER_TOKEN` characters
    per token of the limit: the tokens past the limit are cut off anyway, and tokenizing them was most of the time on
    long documents.

    Args:
        tokenizer: a Hugging Face (fast) tokenizer; its ``truncation_side`` is respected. A private
            copy is kept (see :func:`private_tokenizer`), so the backend may go on using its own.
        max_length: token limit including special tokens.
        do_lower_case: lower-case texts before tokenizing.
        add_special_tokens: add the tokenizer's special tokens (False for text a chat template
            rendered, which carries them already).
        pad_to_max_length: pad every text's ids to ``max_length`` with the tokenizer's pad token, as
            SigLIP's text tower was trained (``padding="max_length"``; it pools the last position and has no
            attention mask, so the padding changes the vector).
    """

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        do_lower_case: bool = False,
        add_special_tokens: bool = True,
        pad_to_max_length: bool = False,
    ) -> None:
        self.tokenizer = private_tokenizer(tokenizer)
        self.max_length = int(max_length)
        self.do_lower_case = do_lower_case
        self.add_special_tokens = add_special_tokens
        self.pad_id = tokenizer.pad_token_id if pad_to_max_length else None
        self._fingerprint: str | None = None
        self._rust = _rust_tokenizer(self.tokenizer)
        self._frame = self._cuts = None
        if self._rust is not None:
            self._frame = _template_frame(self._rust, add_special_tokens)
            self._cuts = self.tokenizer.truncation_side != "left" and _splits_words_at_spaces(self._rust)
            if not self._same_as_transformers(PROBE_TEXTS):
                self._rust = None

    def _encode_transformers(self, texts: list[str], max_length: int) -> list[list[int]]:
        enc = self.tokenizer(
            texts,
            add_special_tokens=self.add_special_tokens,
            truncation=True,
            max_length=max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return [list(x) for x in enc["input_ids"]]

    def _encode_rust(self, texts: list[str], max_length: int) -> list[list[int]]:
        # What transformers' fast-tokenizer call does before and after the same Rust call, without its per-text
        # Python (a dict, a BatchEncoding and several lists per text): on a 64-core host that Python, under the
        # command's one GIL, was the busiest thread of a whole-benchmark run and set the pace of every replica.
        rust, tok = self._rust, self.tokenizer
        rust.no_padding()
        rust.enable_truncation(max_length, stride=0, strategy="longest_first", direction=tok.truncation_side)
        rust.encode_special_tokens = bool(getattr(tok, "split_special_tokens", False))
        encode = getattr(rust, "encode_batch_fast", rust.encode_batch)  # tokenizers >= 0.20: no character offsets
        return [e.ids for e in encode(texts, add_special_tokens=self.add_special_tokens)]

    def _truncated_transformers(self, texts: list[str], limit: int) -> tuple[list[list[int]], list[int]]:
        # One token over the limit tells "too long" apart from "exactly at the limit"; only those few are tokenized
        # again, truncated.
        ids = self._encode_transformers(texts, limit + 1)
        over = [i for i, x in enumerate(ids) if len(x) > limit]
        if over:
            for i, x in zip(over, self._encode_transformers([texts[i] for i in over], limit), strict=True):
                ids[i] = x
        return ids, over

    def _truncated_rust(self, texts: list[str], limit: int) -> tuple[list[list[int]], list[int]]:
        # Each text is tokenized once, to one token over the limit (at most its first CUT_CHARS_PER_TOKEN x limit
        # characters, where the tokenizer splits words at spaces); a text over the limit then loses the last (or
        # first) token of its body, which is what truncating it to the limit gives.
        whole = texts
        if self._cuts:
            reach = CUT_CHARS_PER_TOKEN * limit
            texts = [t if len(t) <= reach else _cut_at_space(t, reach) for t in texts]
        ids = self._encode_rust(texts, limit + 1)
        if self._cuts:  # a cut text that stayed within the limit: its whole text decides
            short = [
                i for i, (t, w) in enumerate(zip(texts, whole, strict=True)) if t is not w and len(ids[i]) <= limit
            ]
            for i, x in zip(short, self._encode_rust([whole[i] for i in short], limit + 1), strict=True):
                ids[i] = x
        over = [i for i, x in enumerate(ids) if len(x) > limit]
        if over and self._frame is None:
            for i, x in zip(over, self._encode_rust([whole[i] for i in over], limit), strict=True):
                ids[i] = x
        elif over:
            before, after = self._frame
            left = self.tokenizer.truncation_side == "left"
            for i in over:
                del ids[i][before if left else len(ids[i]) - 1 - after]
        return ids, over

    def _same_as_transformers(self, texts: list[str]) -> bool:
        """Whether the direct Rust call gives transformers' ids and truncations for ``texts`` (a tokenizer whose
        transformers class adds Python of its own keeps transformers' call)."""
        try:
            return all(
                self._truncated_rust(texts, n) == self._truncated_transformers(texts, n) for n in (self.max_length, 8)
            )
        except Exception:  # noqa: BLE001 - any failure of the direct call: keep transformers' call
            return False

    def __call__(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids per text, and how many texts were truncated to ``max_length``."""
        ids, over = self.with_truncated(texts)
        return ids, len(over)

    def with_truncated(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        """Token ids per text, and the positions of the texts truncated to ``max_length``."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        if self._rust is not None:
            ids, over = self._truncated_rust(texts, self.max_length)
        else:
            ids, over = self._truncated_transformers(texts, self.max_length)
        if self.pad_id is not None:
            ids = [x + [self.pad_id] * (self.max_length - len(x)) for x in ids]
        return ids, over

    def settings(self) -> tuple[int, bool, bool, bool]:
        """What besides the tokenizer decides the ids: ``(max_length, do_lower_case, add_special_tokens, pads)``,
        for a replica to build the same :class:`BatchTokenizer` around its engine's tokenizer."""
        return self.max_length, self.do_lower_case, self.add_special_tokens, self.pad_id is not None

    def fingerprint(self) -> str:
        """A digest of everything that decides the ids of a text: the tokenizer's whole definition (its
        ``tokenizer.json`` as the Rust tokenizer writes it; a slow tokenizer: its vocabulary), the truncation side and
        :meth:`settings`. Two equal fingerprints give equal ids for every text, so a cache may key outputs by text."""
        if self._fingerprint is None:
            h = hashlib.blake2b(digest_size=16)
            tok = self.tokenizer
            rust = _rust_tokenizer(tok)
            if rust is not None:  # without the truncation and padding each call sets anew
                definition = {k: v for k, v in json.loads(rust.to_str()).items() if k not in ("truncation", "padding")}
                h.update(json.dumps(definition, sort_keys=True).encode())
            else:
                h.update(repr(sorted(tok.get_vocab().items())).encode())
            h.update(repr((type(tok).__name__, getattr(tok, "truncation_side", None), self.settings())).encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint
