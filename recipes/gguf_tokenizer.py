"""The tokenizer of a GGUF file rebuilt from its metadata: a fast tokenizer (transformers' converter,
no torch) saved as tokenizer.json + tokenizer_config.json, with every end-of-turn token as an EOS id.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import SourceError
from .gguf_file import plain_value

# Tokens that end a turn in the chat templates of these families; every one present in the
# vocabulary as a control token is written as an EOS id so generation stops on any of them.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "</s>", "<eos>")

# llama.cpp token types (gguf-py `TokenType`).
CONTROL, UNUSED = 3, 5


def write_gguf_tokenizer(gguf, folder: Path) -> list[int]:
    """Rebuild the fast tokenizer from GGUF metadata (transformers' converter, no torch) and save
    tokenizer.json + tokenizer_config.json in `folder`. Returns the EOS ids."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    md = gguf.metadata
    spec = {
        name: plain_value(md[f"tokenizer.{key}"])
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in md
    }
    if "tokens" not in spec:
        raise SourceError(f"{gguf.path}: GGUF has no tokenizer (tokenizer.ggml.tokens missing)")
    try:
        backend, _ = convert_gguf_tokenizer(md["general.architecture"], spec)
    except (ValueError, KeyError) as exc:
        raise SourceError(f"{gguf.path}: cannot rebuild the tokenizer ({exc})") from None
    tokens, types = spec["tokens"], spec.get("token_type") or [0] * len(spec["tokens"])

    # llama.cpp's padding entries ([PAD151665]...) are UNUSED tokens: make them special so that no
    # tokenizer or grammar engine ever treats them as text. Only ones already in the vocabulary
    # at their own id, so the vocabulary (and the logit width) does not grow.
    unused = [
        t for i, (t, k) in enumerate(zip(tokens, types, strict=False)) if k == UNUSED and backend.token_to_id(t) == i
    ]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in unused])

    def token(key: str) -> str | None:
        idx = md.get(f"tokenizer.ggml.{key}")
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    eos_ids = [
        md[f"tokenizer.ggml.{k}"]
        for k in ("eos_token_id", "eot_token_id", "eom_token_id")
        if f"tokenizer.ggml.{k}" in md
    ]
    eos_ids += [i for i, (t, k) in enumerate(zip(tokens, types, strict=False)) if k == CONTROL and t in END_OF_TURN]
    eos_ids = sorted(set(int(i) for i in eos_ids))
    # llama.cpp adds BOS to SentencePiece ("llama") vocabularies unless the file says otherwise.
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", spec.get("tokenizer_type") == "llama"))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        add_bos_token=add_bos,
        add_eos_token=bool(md.get("tokenizer.ggml.add_eos_token", False)),
    )
    if md.get("tokenizer.chat_template"):
        tokenizer.chat_template = md["tokenizer.chat_template"]
    tokenizer.save_pretrained(str(folder))
    _merge_json(folder / "tokenizer_config.json", {"add_bos_token": add_bos, "eos_token_ids": eos_ids})
    return eos_ids


def _merge_json(path: Path, entries: dict) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(entries)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False))
