"""The `token_provenance` stream extension of chat completions (opt-in, `stream: true` only; the
playground sets it): each chunk's choice carries the tokens read since its previous chunk and how
each came, and the choice's last chunk the generation's stats.

    "token_provenance": [{"id": 1234, "token": "{\\"", "origin": "forced"}, ...]
    "generation_stats": {"ttft": 0.05, "decode_tps": 210.0, "forward_passes": 9, "completion_tokens": 31,
                         "tokens_per_pass": 3.44, "forced_tokens": 20, "drafted_tokens": 4,
                         "accepted_tokens": 2}

`origin` is "sampled" (drawn from the logits), "forced" (written by the grammar, jump-forward) or
"drafted" (a speculative draft token the model accepted); `token` is the text the token adds to the
output, so the tokens of a choice spell its output: a token that ends inside a UTF-8 character adds
"" and the one that completes the character adds all of it. The tokens of a choice, across its
chunks, are its output tokens in order (a stop string's tokens excluded, as in logprobs); a token's
text is in the content (or a tool call's markup) of the chunk that lists it or an earlier one.
`ttft` is in seconds, `decode_tps` in tokens per second.
"""

from __future__ import annotations

from coreai.service.engine import Piece
from runtime import GenerationResult, Tokenizer

MAX_CHARACTER_TOKENS = 4  # a UTF-8 character has at most 4 bytes, so spans at most 4 byte-level tokens


class Provenance:
    """The extension's state for one streamed reply of a model with `tokenizer`."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.pending: dict[int, list[dict]] = {}  # choice index -> token entries not sent yet
        self.results: dict[int, GenerationResult] = {}
        # choice index -> (the last token whose text was complete, the tokens since: they end inside a character)
        self.tails: dict[int, tuple[int | None, list[int]]] = {}

    def add(self, index: int, item: Piece | GenerationResult) -> None:
        """Record a piece's tokens, or the result, of choice `index`."""
        if isinstance(item, GenerationResult):
            self.results[index] = item
        else:
            entries = [{"id": t, "token": self._text(index, t), "origin": o} for t, o in item.origins or []]
            self.pending.setdefault(index, []).extend(entries)

    def _text(self, index: int, token: int) -> str:
        """What `token` adds to choice `index`'s decoded output: "" while it ends inside a UTF-8
        character (then the token completing it adds the whole character). Decoded after the previous
        complete token, so a SentencePiece word keeps its leading space."""
        context, waiting = self.tails.get(index, (None, []))
        head = [] if context is None else [context]
        text = self._decode(head + waiting + [token])[len(self._decode(head)) :]
        if text.endswith("\ufffd") and len(waiting) + 1 < MAX_CHARACTER_TOKENS:
            self.tails[index] = (context, waiting + [token])
            return ""
        self.tails[index] = (token, [])
        return text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def take(self, index: int, last: bool) -> dict:
        """The extension fields of choice `index`'s next chunk (the stats too when it is the `last`)."""
        tokens = self.pending.pop(index, [])
        fields: dict = {"token_provenance": tokens}
        result = self.results.get(index)
        if last and result is not None:
            fields["generation_stats"] = {
                "ttft": round(result.timings.ttft, 4),
                "decode_tps": round(result.timings.decode_tps, 1),
                "forward_passes": result.forward_passes,
                "completion_tokens": result.usage.completion_tokens,
                "tokens_per_pass": round(result.tokens_per_pass, 2),
                "forced_tokens": result.forced_tokens,
                "drafted_tokens": result.drafted_tokens,
                "accepted_tokens": result.accepted_tokens,
            }
        return fields
