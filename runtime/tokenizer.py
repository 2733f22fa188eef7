"""The tokenizer wrapper: encoding, chat templates, end-of-turn ids, special ids and streaming
detokenizers, over mlx-lm's `TokenizerWrapper` (which picks a UTF-8-safe streaming detokenizer
from the tokenizer's decoder: byte-level BPE, SentencePiece, or a naive fallback).
"""

from __future__ import annotations

import json
import re
import threading
from functools import partial
from pathlib import Path
from typing import Any

import tokenizers
from mlx_lm import tokenizer_utils
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import _tokenizer_defaults, load_tokenizer

from runtime.errors import InputError
from runtime.reasoning import detect_reasoning


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


# Placeholders for special-token text found in caller-supplied strings while the chat template
# renders: private-use characters, which templates neither produce nor escape (`tojson` keeps them,
# `trim` leaves them); a private-use start character already in the text gets a placeholder too.
_MARK, _MARK_END = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_MARK}(\\d+){_MARK_END}")


def _load_wrapper(folder: Path, tok_config: dict, eos_ids: list[int] | None) -> TokenizerWrapper:
    """mlx-lm's `load_tokenizer` for a local folder, without its second parse of tokenizer.json:
    mlx-lm JSON-decodes the whole file (0.4 s for Qwen, 1 s for Gemma) only to read the decoder,
    which the loaded tokenizer already has. Folders that use mlx-lm's chat-template modules
    (`chat_template_type`, model defaults) take mlx-lm's own path. Same detokenizer choice as
    mlx-lm's `tokenizer_utils.load`."""
    if "chat_template_type" in tok_config or _tokenizer_defaults(folder):
        return load_tokenizer(folder, eos_token_ids=eos_ids)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(folder)
    detokenizer: Any = tokenizer_utils.NaiveStreamingDetokenizer  # a class, or a partial of one
    backend = getattr(hf, "backend_tokenizer", None)
    if (folder / "tokenizer.json").exists() and backend is not None and backend.decoder is not None:
        decoder = json.loads(backend.decoder.__getstate__())
        if tokenizer_utils._is_spm_decoder(decoder):
            detokenizer = tokenizer_utils.SPMStreamingDetokenizer
        elif tokenizer_utils._is_spm_decoder_no_space(decoder):
            detokenizer = partial(tokenizer_utils.SPMStreamingDetokenizer, trim_space=False)
        elif tokenizer_utils._is_bpe_decoder(decoder):
            detokenizer = tokenizer_utils.BPEStreamingDetokenizer
    return TokenizerWrapper(hf, detokenizer, eos_token_ids=eos_ids)


def padding_entries(vocab: dict[str, int]) -> set[int]:
    """Ids of llama.cpp's vocabulary padding in a {token: id} map: entries spelled `[PAD<id>]`,
    which llama.cpp's `convert_hf_to_gguf.py` (`get_vocab_base`) adds up to the logit width. A
    tokenizer rebuilt from a GGUF file has them as ordinary tokens; they are never real text."""
    return {i for t, i in vocab.items() if t == f"[PAD{i}]"}


def _ids(value) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


class Tokenizer:
    """A model's tokenizer.

    Attributes:
        hf: the transformers fast tokenizer.
        eos_ids: every id that ends a turn: the tokenizer's EOS, `eos_token_id` of config.json and
            generation_config.json (int or list), and the end-of-turn ids of tokenizer_config.json.
        special_ids: ids of all special (control) tokens, which are never rendered as text.
        bos_id: the BOS id, or None.
        reasoning_tokens: `runtime.reasoning.ReasoningTokens` (markers and their ids) when the chat
            template is a thinking model's, else None; `reasoning_markers`: its markers, or None.
        add_bos: whether plain-text prompts get BOS prepended (tokenizer_config `add_bos_token`).
    """

    def __init__(self, folder: Path, config: dict):
        folder = Path(folder)
        generation = _json(folder / "generation_config.json")
        eos = _ids(config.get("eos_token_id")) | _ids(generation.get("eos_token_id"))
        tok_config = _json(folder / "tokenizer_config.json")
        self._wrapper: TokenizerWrapper = _load_wrapper(folder, tok_config, sorted(eos) or None)
        self.hf = self._wrapper._tokenizer
        self.eos_ids: set[int] = set(self._wrapper.eos_token_ids) | eos | _ids(tok_config.get("eos_token_ids"))
        self.special_ids: set[int] = set(self.hf.all_special_ids) | {
            i for i, t in self.hf.added_tokens_decoder.items() if t.special
        }
        self.bos_id = self.hf.bos_token_id
        self.add_bos = bool(tok_config.get("add_bos_token", False)) and self.bos_id is not None
        self.has_chat_template = self._wrapper.has_chat_template
        self.reasoning_tokens = detect_reasoning(getattr(self.hf, "chat_template", None), self.hf)
        self._backend: tokenizers.Tokenizer = self.hf.backend_tokenizer
        self._splitter: tokenizers.Tokenizer | None = None  # built on first need (a second parse)
        self._splitter_lock = threading.Lock()

    @property
    def reasoning_markers(self):
        return self.reasoning_tokens.markers if self.reasoning_tokens is not None else None

    def __len__(self) -> int:
        return len(self.hf)

    def padding_ids(self, vocab_size: int) -> frozenset[int]:
        """The ids in [0, vocab_size) (the model's logit width) that are no real token: llama.cpp's
        `[PAD<id>]` entries (`padding_entries`) and every id past the tokenizer's vocabulary."""
        return frozenset(padding_entries(self.hf.get_vocab())) | frozenset(range(len(self.hf), vocab_size))

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of plain text, with BOS prepended when the model wants it and asked for.

        parse_special: False (default) encodes special-token text such as "<|im_end|>" as ordinary
            text (Hugging Face's `split_special_tokens`, llama.cpp's `parse_special=false`); True turns
            it into the control tokens, for callers who write raw prompts on purpose.
        """
        ids = self._backend.encode(text, add_special_tokens=False).ids if parse_special else self._text_ids(text)
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def _text_ids(self, text: str) -> list[int]:
        """Ids of `text` with special-token text encoded as text."""
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if not any(i in self.special_ids for i in ids):
            return ids  # the usual case: nothing to split, same ids either way
        with self._splitter_lock:
            if self._splitter is None:
                self._splitter = tokenizers.Tokenizer.from_str(self._backend.to_str())
                self._splitter.encode_special_tokens = True
        return self._splitter.encode(text, add_special_tokens=False).ids

    def _mask_specials(self, value, found: list[str]):
        """`value` (messages, tools: nested dicts, lists, strings) with every special-token text in a
        string, and every private-use `_MARK`, replaced by a placeholder `_MARK<n>_MARK_END`, where
        `found[n]` is the replaced text."""
        if isinstance(value, dict):
            return {self._mask_specials(k, found): self._mask_specials(v, found) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._mask_specials(v, found) for v in value]
        if not isinstance(value, str):
            return value
        encoding = self._backend.encode(value, add_special_tokens=False)
        spans = [encoding.offsets[j] for j, i in enumerate(encoding.ids) if i in self.special_ids]
        spans += [(m.start(), m.end()) for m in re.finditer(_MARK, value)]
        if not spans:
            return value
        out, at = [], 0
        for start, end in sorted(spans):
            out += [value[at:start], f"{_MARK}{len(found)}{_MARK_END}"]
            found.append(value[start:end])
            at = end
        return "".join(out) + value[at:]

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs,
    ) -> list[int]:
        """Token ids of a chat rendered with the model's template. `template_kwargs` are variables of
        the template (e.g. `enable_thinking=False` for Qwen3), as vLLM's `chat_template_kwargs`.

        Control tokens come only from the template's own markup: special-token text inside any string
        of `messages` or `tools` (content, tool results, tool-call arguments, tool definitions) is
        encoded as text. The ids decode to exactly the text the template renders.
        Raises ValueError when the model has no chat template (a base model): pass a plain prompt;
        jinja2.TemplateError when the template refuses the messages.
        """
        if not self.has_chat_template:
            raise InputError("this model has no chat template; pass a plain text prompt (or --no-chat-template)")
        found: list[str] = []
        messages = self._mask_specials(messages, found)
        tools = self._mask_specials(tools, found) if tools is not None else None
        text = self._wrapper.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs
        )
        if not found:
            return self.encode(text, parse_special=True)
        # Every special token now in `text` is the template's. Keep those; encode the text between
        # them, with the placeholders put back, as text (the tokenizer splits at special tokens
        # anyway, so this matches encoding the whole when nothing was injected).
        encoding = self._backend.encode(text, add_special_tokens=False)
        ids: list[int] = []
        at, pending = 0, []
        for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=False):
            if token_id not in self.special_ids:
                pending.append(token_id)
                continue
            ids += self._segment_ids(text[at:start], pending, found) + [token_id]
            at, pending = end, []
        ids += self._segment_ids(text[at:], pending, found)
        if self.add_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def _segment_ids(self, segment: str, ids: list[int], found: list[str]) -> list[int]:
        if _MARK not in segment:
            return ids
        return self._text_ids(_PLACEHOLDER.sub(lambda m: found[int(m.group(1))], segment))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def detokenizer(self):
        """A fresh streaming detokenizer (mlx-lm's): `add_token(id)`, `last_segment`, `finalize()`.
        It holds back incomplete UTF-8 sequences, so segments never split a character. The text is
        exactly the tokens' text: mlx-lm drops the first leading space (a display choice), which would
        turn a grammar's " yes" into "yes", an output outside the grammar."""
        detokenizer = self._wrapper.detokenizer
        if hasattr(detokenizer, "_maybe_trim_space"):  # BPEStreamingDetokenizer
            detokenizer._maybe_trim_space = lambda text: text
        if hasattr(detokenizer, "trim_space"):  # SPMStreamingDetokenizer
            detokenizer.trim_space = False
        return detokenizer
