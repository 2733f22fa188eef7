"""The tokenizer wrapper: encoding, chat templates, end-of-turn ids, special ids and streaming
detokenizers, over mlx-lm's `TokenizerWrapper` (which picks a UTF-8-safe streaming detokenizer
from the tokenizer's decoder: byte-level BPE, SentencePiece, or a naive fallback).
"""

from __future__ import annotations

import json
from pathlib import Path

from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_tokenizer

from runtime.reasoning import detect_markers


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


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
        reasoning_markers: `runtime.reasoning.ReasoningMarkers` when the chat template is a thinking
            model's (settable), else None.
        add_bos: whether plain-text prompts get BOS prepended (tokenizer_config `add_bos_token`).
    """

    def __init__(self, folder: Path, config: dict):
        folder = Path(folder)
        generation = _json(folder / "generation_config.json")
        eos = _ids(config.get("eos_token_id")) | _ids(generation.get("eos_token_id"))
        self._wrapper: TokenizerWrapper = load_tokenizer(folder, eos_token_ids=sorted(eos) or None)
        self.hf = self._wrapper._tokenizer
        tok_config = _json(folder / "tokenizer_config.json")
        self.eos_ids: set[int] = set(self._wrapper.eos_token_ids) | eos | _ids(tok_config.get("eos_token_ids"))
        self.special_ids: set[int] = set(self.hf.all_special_ids) | {
            i for i, t in self.hf.added_tokens_decoder.items() if t.special
        }
        self.bos_id = self.hf.bos_token_id
        self.add_bos = bool(tok_config.get("add_bos_token", False)) and self.bos_id is not None
        self.has_chat_template = self._wrapper.has_chat_template
        self.reasoning_markers = detect_markers(getattr(self.hf, "chat_template", None))

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of plain text, with BOS prepended when the model wants it and asked for."""
        ids = self.hf.encode(text, add_special_tokens=False)
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, **template_kwargs) -> list[int]:
        """Token ids of a chat rendered with the model's template. `template_kwargs` are variables of
        the template (e.g. `enable_thinking=False` for Qwen3), as vLLM's `chat_template_kwargs`.

        Raises ValueError when the model has no chat template (a base model): pass a plain prompt.
        """
        if not self.has_chat_template:
            raise ValueError("this model has no chat template; pass a plain text prompt (or --no-chat-template)")
        text = self._wrapper.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs
        )
        return self.encode(text)

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
