"""One generating sequence: its bookkeeping (`Sequence`) and what it produces (`Delta`,
`GenerationResult`, `Usage`, `Timings`). Shared by the single-sequence loop (`runtime.generate`)
and the batched one (`runtime.batch`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import mlx.core as mx

from runtime.stops import StopStrings
from runtime.strategy import Step


@dataclass
class Timings:
    """Seconds and tokens per second of one generation; peak_memory in bytes (MLX allocator)."""

    ttft: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    total: float = 0.0
    peak_memory: int = 0


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the prompt cache (not prefilled)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    forward_passes: int = 0  # passes that produced logits to sample from (the prompt's last one included)
    # Of `token_ids` (the delivered tokens): the jump-forward ones, and the accepted draft tokens (emitted
    # without a pass of their own). drafted_tokens: every draft token the model scored, so drafted -
    # accepted are the ones not delivered: rejected, or accepted past the cut (stop, EOS, max_tokens).
    forced_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    error: str | None = None
    stop_string: str | None = None  # the stop string that ended the output (trimmed from `text`), if one did
    parts: list[tuple[str | None, str]] = field(default_factory=list)  # `text` by channel (`Step.channels`)

    @property
    def tokens_per_pass(self) -> float:
        """Completion tokens per forward pass (1.0 without jump-forward or speculation)."""
        return len(self.token_ids) / max(self.forward_passes, 1)


@dataclass
class Delta:
    """One streamed piece. `text` never splits a UTF-8 character. The last delta of a stream has
    `finish_reason` set and carries the `result`."""

    text: str
    token_ids: list[int]
    logprobs: list[mx.array | None] | None = None  # per token: [vocab] float32, None for a forced token
    finish_reason: str | None = None
    result: GenerationResult | None = field(default=None, repr=False)
    parts: list[tuple[str | None, str]] = field(default_factory=list)  # `text` by channel, in order
    # How each of `token_ids` came: "sampled", "forced" by the grammar (jump-forward) or "drafted"
    # (a speculative draft token the model accepted). Read by the server's `token_provenance` field.
    origins: list[str] = field(default_factory=list)


class Sequence:
    """The bookkeeping of one generating sequence, shared by the single-sequence loop (`_generate`)
    and the batched one (`runtime.batch`): applying a strategy's `Step` (trim counts for rejected
    drafts and rollback, EOS, max_tokens, cancel), what to feed the model next, what text to emit
    (detokenizer, stop strings), and the final `GenerationResult`. It touches neither the model nor
    the KV cache: the loop feeds `next_feed()` and trims what `apply()` returns.

    Per step the loop calls, in this order: `apply(step)` (then trims the KV cache), `next_feed()`
    unless `finish` is set (then launches the forward pass), `emit()` (CPU work overlapping the pass).

    prompt_ids: the prompt (non-empty). reused: prompt tokens taken from a prompt cache (not
    prefilled). start: `time.perf_counter()` when the request started (seconds).
    """

    def __init__(
        self,
        tokenizer,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        stop: list[str] | None = None,
        cancel: threading.Event | None = None,
        reused: int = 0,
        start: float | None = None,
    ):
        self.tokenizer = tokenizer
        self.prompt_len = len(prompt_ids)
        self.max_tokens = max_tokens
        self.cancel = cancel
        self.reused = reused
        self.start = time.perf_counter() if start is None else start
        self.first: float | None = None  # when the first step was applied (TTFT)
        self.out: list[int] = []
        self.labels: list[str | None] = []  # the channel of each output token (`Step.channels`)
        self.origins: list[str] = []  # how each output token came (`Delta.origins`)
        self.reported = 0  # output tokens reported so far: they are always a prefix of `out`
        self.text_parts: list[tuple[str | None, str]] = []
        # The costs: passes run and draft tokens fed. The counts of delivered tokens by origin (accepted
        # drafts, forced) are taken from `origins` at the end, so a token cut off is never counted.
        self.stats = dict(forward_passes=1, drafted_tokens=0)
        self.detok = tokenizer.detokenizer()
        self.stops = StopStrings(stop)
        self.finish: str | None = None
        self.error: str | None = None
        self.stop_string: str | None = None
        self.step: Step | None = None  # the step applied last
        self.appended: list[int] = []  # the tokens it appended to the output
        self.drafted = 0  # draft tokens fed in the last forward pass
        self.held: list[tuple[int, mx.array | None]] = []  # output not streamed yet (Step.hold), with logprobs
        # Stop strings: tokens not reported yet, the content characters past the reported tokens, and
        # the token before them (decoding context).
        self.unreported: list[tuple[int, mx.array | None]] = []
        self.unreported_chars = 0
        self.reported_last = prompt_ids[-1]
        self.last_prompt_token = prompt_ids[-1]
        self.refeed = False  # the last step appended nothing new to the KV cache: score the last kept token again
        self.overrun = 0  # tokens of the last step dropped at max_tokens: the loop hands them back (`rollback`)

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def apply(self, step: Step) -> int:
        """Apply one strategy step to the output (rejected draft, rollback, new tokens, EOS,
        max_tokens, the strategy's finish, cancel). Returns how many tokens to trim from the end of
        this sequence's KV cache (the rejected draft tokens, then the rolled-back ones). A step cut
        by max_tokens ends "length" and sets `overrun`: the loop rolls the strategy back by it, so
        its state (a grammar matcher) holds the output and nothing past it."""
        if self.first is None:
            self.first = time.perf_counter()
        self.step = step
        trim = self.drafted - step.verified
        if step.rollback:
            if step.rollback > len(self.held):
                raise RuntimeError(f"the strategy rolled back {step.rollback} tokens; {len(self.held)} were held back")
            del self.out[len(self.out) - step.rollback :], self.held[len(self.held) - step.rollback :]
            del self.labels[len(self.labels) - step.rollback :], self.origins[len(self.origins) - step.rollback :]
            trim += step.rollback
        appended: list[int] = []
        for t in step.tokens:
            if t in self.tokenizer.eos_ids:
                self.finish = "stop"
                break
            appended.append(t)
            if len(self.out) + len(appended) >= self.max_tokens:
                break
        # Tokens of the step past the budget: the strategy took them, the output never will. The budget
        # decides the finish then, also over a strategy's "stop" (its grammar ended in the dropped part).
        self.overrun = len(step.tokens) - len(appended) if self.finish is None else 0
        self.out.extend(appended)
        self.labels += [None] * len(appended)
        # `tokens` is the accepted draft, then the sampled token(s), then the forced ones.
        sampled_end = len(step.tokens) - step.forced
        for j in range(len(appended)):
            self.origins.append("drafted" if j < step.verified else "forced" if j >= sampled_end else "sampled")
        self.appended = appended
        rows = [] if step.logprobs is None else list(step.logprobs)  # the sampled tokens' rows; forced ones have none
        self.held += [(t, rows[j] if j < len(rows) else None) for j, t in enumerate(appended)]
        if step.channels:
            labels = step.channels[: len(step.channels) - (len(step.tokens) - len(appended))]  # tokens not appended
            if len(labels) > len(self.held):
                raise RuntimeError(f"the strategy labelled {len(labels)} tokens; {len(self.held)} are held back")
            if labels:
                self.labels[len(self.labels) - len(labels) :] = labels
        if self.finish is None and self.overrun:
            self.finish = "length"
        if self.finish is None and step.finish:
            self.finish, self.error = step.finish, step.message
        if self.finish is None and len(self.out) >= self.max_tokens:
            self.finish = "length"
        if self.finish is None and self.cancelled:
            self.finish = "cancelled"
        # Nothing appended beyond the draft tokens already fed (none at all, or only accepted draft
        # tokens when a rollback took back the token sampled after them): score the last kept token
        # again, its KV trimmed, so the next pass is never empty.
        self.refeed = self.finish is None and len(appended) <= step.verified
        return trim + self.refeed

    def next_feed(self) -> tuple[list[int], int]:
        """The tokens of the next forward pass and how many logits rows the strategy needs from its
        end: (the appended tokens not already in the KV cache + the step's draft, 1 + draft length).
        The draft is fed whole: the strategy cut it (`runtime.draft_policy`)."""
        step = self.step
        assert step is not None  # called after a step was applied (`apply`)
        draft = step.draft
        self.drafted = len(draft)
        self.stats["forward_passes"] += 1
        self.stats["drafted_tokens"] += self.drafted
        if self.refeed:
            return [self.out[-1] if self.out else self.last_prompt_token] + draft, self.drafted + 1
        return self.appended[step.verified :] + draft, self.drafted + 1

    def emit(self) -> Delta | None:
        """The text of the tokens released by the last step, as a `Delta` (the last one, with the
        result, when the sequence finished), or None when there is nothing to stream. The last
        `Step.hold` tokens wait (the strategy may still roll them back). Token by token, so a stop
        string ends the output at the token that completes it, also when one step appended several
        (accepted drafts, jump-forward); a stop string hit sets `finish` to "stop". Stop strings are
        matched on content tokens only (`_add_text`)."""
        if self.finish is not None:
            release = len(self.held)
        else:
            assert self.step is not None  # unfinished: emitted after a step was applied
            release = max(0, len(self.held) - self.step.hold)
        base = len(self.out) - len(self.held)  # the output index of the first held token
        emitted, self.held = self.held[:release], self.held[release:]
        parts: list[tuple[str | None, str]] = []
        streamed = []
        label = self.labels[base - 1] if base else None
        for i, entry in enumerate(emitted):
            self.detok.add_token(entry[0])
            label = self.labels[base + i]
            chars, hit = self._add_text(parts, label, self.detok.last_segment)
            streamed += self._stream_tokens(entry, chars, hit)
            if hit:  # the tokens after this one are never delivered (`result` counts the reported ones)
                self.finish, self.stop_string = "stop", hit
                self.held = []
                break
        else:
            if self.finish is not None:
                self.detok.finalize()
                chars, hit = self._add_text(parts, label, self.detok.last_segment)
                if not hit:  # the end: content held back as a possible stop string's start is out
                    rest = self.stops.flush()
                    _add_part(parts, None, rest)
                    chars += len(rest)
                streamed += self._stream_tokens(None, chars, hit)
                if hit:
                    self.finish, self.stop_string = "stop", hit
        for part in parts:
            _add_part(self.text_parts, *part)
        text = "".join(t for _, t in parts)
        ids, logprobs = [t for t, _ in streamed], [row for _, row in streamed]
        origins, self.reported = self.origins[self.reported : self.reported + len(ids)], self.reported + len(ids)
        if self.finish is not None:
            return Delta(text, ids, logprobs, self.finish, self.result(), parts, origins)
        return Delta(text, ids, logprobs, parts=parts, origins=origins) if text or ids else None

    def _add_text(self, parts: list, label: str | None, segment: str) -> tuple[int, str | None]:
        """Add `segment`, the text of a token labelled `label` (`Step.channels`), to `parts` through
        the stop strings: they apply to content (label None) only, never to a tool call or its
        markup, whose end the grammar decides (a stop string inside a call's arguments would cut a
        constrained call). Content held back as a possible stop string's start is released when a
        labelled token comes. Returns (characters added, the stop string hit or None)."""
        if label is None:
            piece, hit = self.stops.feed(segment)
            _add_part(parts, None, piece)
            return len(piece), hit
        held = self.stops.flush()
        _add_part(parts, None, held)
        _add_part(parts, label, segment)
        return len(held) + len(segment), None

    def _stream_tokens(self, entry, out_chars: int, hit: str | None) -> list:
        """The tokens to report now (`Delta.token_ids`, logprobs): a token is reported iff all of its
        text is in the content, so the reported tokens' text is always a prefix of the content (no
        token of a stop string, nor one it cuts through). `entry`: the token and its logprobs (None:
        the detokenizer's last bytes); `out_chars`: characters the stop matcher let out with it."""
        if not self.stops.stops:
            return [entry] if entry is not None else []
        if entry is not None:
            self.unreported.append(entry)
        self.unreported_chars += out_chars
        if not hit and self.finish is not None and entry is None:  # the end: all the text is out
            out, self.unreported = self.unreported, []
            return out
        # Token ends are measured on the decoded text (one token of context before, so a leading
        # space is kept): the detokenizer's segments lag behind tokens (a lone space, an incomplete
        # UTF-8 character, SentencePiece words wait for the next token), so they cannot say whose
        # text a character is. A token ending inside a character ends where that character does.
        ids = [self.reported_last] + [t for t, _ in self.unreported]
        before = len(self._decode(ids[:1]))
        release, ends = 0, 0
        for k in range(1, len(ids)):
            text = self._decode(ids[: k + 1])
            if text.endswith("\ufffd"):
                continue
            if len(text) - before > self.unreported_chars:
                break
            release, ends = k, len(text) - before
        out, self.unreported = self.unreported[:release], self.unreported[release:]
        if out:
            self.reported_last = out[-1][0]
            self.unreported_chars -= ends
        if hit:  # the content is final: the rest is never reported
            self.unreported = []
        return out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def end(self, finish: str, error: str | None = None) -> Delta:
        """End the sequence outside a step (cancelled during prefill, failed): the last `Delta`."""
        self.finish, self.error = finish, error
        return Delta("", [], finish_reason=finish, result=self.result())

    def result(self) -> GenerationResult:
        """The finished sequence's result. Its tokens are the delivered ones, those reported with the
        deltas: not the tokens of a stop string (nor one it cuts through), not the tokens held back
        when it ended outside a step. Every count of tokens (completion tokens, accepted drafts,
        forced tokens) is a count of them, whatever the steps appended past the cut."""
        now = time.perf_counter()
        first, out, origins = self.first, self.out[: self.reported], self.origins[: self.reported]
        assert self.finish is not None  # called once the sequence finished (`emit`, `end`)
        ttft = (first or now) - self.start
        decode_time = now - (first or now)
        timings = Timings(
            ttft=ttft,
            prefill_tps=(self.prompt_len - self.reused) / max(ttft, 1e-9) if first else 0.0,
            decode_tps=(len(out) - 1) / decode_time if len(out) > 1 and decode_time > 0 else 0.0,
            total=now - self.start,
            peak_memory=mx.get_peak_memory(),
        )
        usage = Usage(self.prompt_len, len(out), self.reused)
        return GenerationResult(
            "".join(t for _, t in self.text_parts),
            out,
            self.finish,
            usage,
            timings,
            error=self.error,
            stop_string=self.stop_string,
            parts=list(self.text_parts),
            forced_tokens=origins.count("forced"),
            accepted_tokens=origins.count("drafted"),
            **self.stats,
        )


def _add_part(parts: list, label: str | None, text: str) -> None:
    """Append `text` under `label`, joined to the last part when it has the same label."""
    if not text:
        return
    if parts and parts[-1][0] == label:
        parts[-1] = (label, parts[-1][1] + text)
    else:
        parts.append((label, text))
