"""`TokenizerInfo`: the engine's view of a model's vocabulary, built once per tokenizer per process.

Three facts shape it:

- The model's logit width `vocab_size` (from its config) can be larger than the tokenizer's
  vocabulary. Ids past the real vocabulary are padding: the grammar engine sees them as empty
  tokens, so they are never allowed in a mask.
- GGUF files converted by llama.cpp pad the vocabulary with entries spelled `[PAD<id>]`
  (llama.cpp `convert_hf_to_gguf.py`, `get_vocab_base`); a tokenizer rebuilt from such a file has them
  as ordinary tokens, and an engine would happily emit `[PAD151700]` as nine characters of text.
  They are removed from the vocabulary handed to the engine, so they too become padding.
- llguidance treats every added token (`<|im_end|>`, `</tool_call>`) as special, never as text, but
  tokenizes forced text with the HF tokenizer, which turns the text "<|im_end|>" into that special
  token: a JSON string that must spell the text would get a mask allowing only a token the engine
  then rejects. So the engine gets the token bytes read by llguidance itself and an encoder without
  added tokens, which spells such text with ordinary tokens (`TokenizerWrapper`).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import threading
import weakref
from dataclasses import dataclass
from functools import cached_property

import llguidance
import tokenizers

from runtime.errors import InputError
from runtime.tokenizer import padding_entries

_keys = itertools.count(1)


@dataclass(frozen=True)
class TokenizerInfo:
    """A tokenizer as the grammar engine sees it.

    ll_tokenizer: the llguidance tokenizer, `n_vocab == vocab_size`.
    vocab_size: the model's logit width (tokens); bitmask rows have ceil(vocab_size / 32) int32 words.
    eos_ids: every end-of-sequence / end-of-turn id; allowed only where the grammar can end.
    padding_ids: ids that are never allowed (range(real vocabulary size, vocab_size) plus `[PAD<id>]` entries).
    key: an integer unique in this process, used in compiled-grammar cache keys.
    """

    ll_tokenizer: llguidance.LLTokenizer
    vocab_size: int
    eos_ids: tuple[int, ...]
    padding_ids: frozenset[int]
    key: int

    @cached_property
    def fingerprint(self) -> str:
        """sha256 (hex) of the vocabulary as the engine reads it, the logit width and the EOS ids:
        equal for the same tokenizer in every process (`key` is not)."""
        digest = hashlib.sha256(f"{self.vocab_size}:{self.eos_ids}".encode())
        for i in range(self.vocab_size):
            digest.update(len(spelled := self.ll_tokenizer.decode_bytes([i])).to_bytes(4, "little") + spelled)
        return digest.hexdigest()

    @cached_property
    def token_ids_by_bytes(self) -> dict[bytes, tuple[int, ...]]:
        """Token ids by their bytes as the engine reads them (special and padding tokens left out);
        built on first use (~0.2 s)."""
        ids: dict[bytes, list[int]] = {}
        for i in range(self.vocab_size):
            if i not in self.padding_ids and (spelled := self.ll_tokenizer.decode_bytes([i])):
                ids.setdefault(spelled, []).append(i)
        return {spelled: tuple(group) for spelled, group in ids.items()}


def _engine_vocabulary(hf_tokenizer) -> tuple[dict, set[int]]:
    """The tokenizer's `tokenizer.json` (parsed) without `[PAD<id>]` entries, and their ids.

    Raises ValueError for slow (non-Rust) tokenizers, which llguidance cannot read.
    """
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InputError(f"{type(hf_tokenizer).__name__} is not a fast tokenizer; guided generation needs one")
    # Copy, as llguidance.hf.from_tokenizer does: padding/truncation settings must not leak into the JSON.
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    vocab = spec["model"].get("vocab")
    padding: set[int] = set()
    if isinstance(vocab, dict):  # BPE / WordPiece / WordLevel: {token: id}
        padding = padding_entries(vocab)
        for i in padding:
            del vocab[f"[PAD{i}]"]
    return spec, padding


class _EngineTokenizer:
    """What `llguidance.TokenizerWrapper` reads: token bytes and special ids from `ll` (the engine's own
    reading of tokenizer.json), and an encoder that never produces an added token."""

    def __init__(self, ll: llguidance.LLTokenizer, spec: dict, eos_id: int):
        self.eos_token_id, self.bos_token_id = eos_id, None
        self.tokens = [ll.decode_bytes([i]) for i in range(ll.vocab_size)]
        self.special_token_ids = [i for i in range(ll.vocab_size) if ll.is_special_token(i)]
        spec = dict(spec, added_tokens=[])
        self._encoder = tokenizers.Tokenizer.from_str(json.dumps(spec))

    def __call__(self, text: str) -> list[int]:
        return self._encoder.encode(text, add_special_tokens=False).ids


def build_tokenizer_info(hf_tokenizer, vocab_size: int, eos_ids) -> TokenizerInfo:
    """Build a `TokenizerInfo` (about 4 s for Qwen's 151,936 tokens, 11 s for Gemma's 262,144; use
    `get_tokenizer_info`, which caches).

    hf_tokenizer: a transformers fast tokenizer (or any object with `.hf` holding one).
    vocab_size: the model's logit width; must be >= the tokenizer's vocabulary size.
    eos_ids: iterable of end-of-sequence / end-of-turn ids (at least one).
    Raises ValueError for a slow tokenizer, no EOS id, or a vocabulary wider than `vocab_size`.
    """
    hf_tokenizer = getattr(hf_tokenizer, "hf", hf_tokenizer)
    eos = tuple(sorted(set(int(i) for i in eos_ids)))
    if not eos:
        raise InputError("at least one EOS id is needed: the grammar signals its end through it")
    spec, pad_entries = _engine_vocabulary(hf_tokenizer)
    if len(hf_tokenizer) > vocab_size:
        raise InputError(f"the tokenizer has {len(hf_tokenizer)} tokens but the model only {vocab_size} logits")
    ll = llguidance.LLTokenizer(json.dumps(spec), n_vocab=vocab_size, eos_token=list(eos))
    wrapper = llguidance.TokenizerWrapper(_EngineTokenizer(ll, spec, eos[0]))
    ll = llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos))
    padding = frozenset(pad_entries) | frozenset(range(len(hf_tokenizer), vocab_size))
    return TokenizerInfo(ll, vocab_size, eos, padding, next(_keys))


_cache: dict[tuple, tuple[weakref.ref, TokenizerInfo]] = {}
_lock = threading.Lock()


def get_tokenizer_info(hf_tokenizer, vocab_size: int, eos_ids) -> TokenizerInfo:
    """`build_tokenizer_info`, cached per process by (tokenizer identity, vocab_size, eos_ids).

    The entry holds only a weak reference to the tokenizer, so an id reused after garbage collection
    never returns a stale entry. Thread-safe; two threads may build the same entry once each.
    """
    hf_tokenizer = getattr(hf_tokenizer, "hf", hf_tokenizer)
    key = (id(hf_tokenizer), int(vocab_size), tuple(sorted(set(int(i) for i in eos_ids))))
    with _lock:
        hit = _cache.get(key)
    if hit is not None and hit[0]() is hf_tokenizer:
        return hit[1]
    info = build_tokenizer_info(hf_tokenizer, vocab_size, key[2])
    with _lock:
        _cache[key] = (weakref.ref(hf_tokenizer), info)
    return info
