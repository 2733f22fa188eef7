"""`ConstrainedDecodingStrategy`: the runtime's `SamplingStrategy` with a grammar in the loop.

It composes the runtime's pipeline (processors -> mask -> log-softmax -> sampler, speculative
verification) and fills in its hooks:

- `prepare()` fills the bitmask rows of the coming step on the CPU while MLX computes the logits
  (the loop calls it after `mx.async_eval` of the forward pass); llguidance drops the GIL while
  filling. Row j is the mask after the first j draft tokens: the matcher accepts each draft token
  after filling its row.
- `mask()` applies those rows to the logits of every position in one op (-inf where disallowed).
- `check_draft()` cuts a draft at its first token the grammar forbids (before the forward pass),
  and at an EOS (a draft never ends the output).
- `advance()`: the matcher rolls back the draft tokens the target rejected (the loop trims the KV
  cache by the same count), accepts the sampled token, then the jump-forward tokens the grammar
  forces, which go through the model in the same forward pass as the next draft; `Step.forced`
  counts them.
- EOS gating: EOS / end-of-turn ids are in the mask only where the grammar can end. When the grammar
  is finished (nothing but EOS possible) the step ends generation with finish "stop", without
  emitting an end token.
- An engine error (a rejected token, a limit hit while computing a mask) ends generation with
  finish "error" and the engine's message; the partial text is then not valid (`complete` is False).
- Reasoning (thinking models, `reasoning=`): the grammar is switched on after the reasoning block.
  Rather than a grammar `think? answer` (which would make the engine lex free text token by token
  and tie every grammar to a family's markers), the strategy runs in phases: "free" (the first
  token may open a block: the grammar's mask plus the start marker), "thinking" (every token but
  EOS, padding and the start marker; drafts cut at the end marker; after `max_tokens` reasoning
  tokens the end marker and separator are forced) and "answer" (the grammar, from its start; the
  end marker is followed by the forced separator and the grammar's jump-forward tokens).
- Validate-and-rollback (`guided.checker`): keywords the grammar leaves out are checked as each value
  they govern closes. On a violation the matcher rolls back to the first sampled token of that value
  (`Step.rollback` takes back tokens of earlier steps; the loop trims the KV cache), that token is
  banned at that position, and decoding resumes there, at most `max_retries` times per generation,
  then the generation ends with finish "error" naming the keyword. `Step.hold` tells the loop how
  many trailing tokens may still be rolled back, so their text is not streamed yet.
"""

from __future__ import annotations

import bisect
import ctypes
import time
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from guided.bitmask import TokenBitmask
from guided.compiler import CompiledGrammar
from runtime.reasoning import ReasoningTokens
from runtime.sampling import SamplingParams, SamplingStrategy
from runtime.strategy import Step


_OPENING = frozenset(b"{[ \t\r\n")  # bytes that open a JSON value before its content (and a quote)
_LONGEST_TOKEN = 64  # bytes: longer spellings of a rejected value are not looked up
# Keywords a container can break by closing before a member that would satisfy them.
_CLOSED_TOO_EARLY = frozenset(
    {"contains", "minContains", "dependentRequired", "dependencies", "dependentSchemas", "minProperties", "required"}
)


@dataclass(frozen=True)
class Reasoning:
    """A reasoning block before the constrained answer: the markers' token ids and the most
    reasoning tokens before the end marker is forced (`max_tokens`, >= 1)."""

    tokens: ReasoningTokens
    max_tokens: int = 1024


class _FreeMask:
    """Fills a bitmask row with a fixed mask (`fill_bitmask_at`, as `GrammarMatcher` does)."""

    def __init__(self, vocab_size: int, banned):
        bits = np.ones(-(-vocab_size // 32) * 32, np.uint8)
        bits[vocab_size:] = 0
        bits[list(banned)] = 0
        self.row = np.packbits(bits, bitorder="little").view(np.int32)

    def fill_bitmask_at(self, address: int, nbytes: int) -> None:
        ctypes.memmove(address, self.row.ctypes.data, nbytes)


@dataclass
class GuidedStats:
    """Counters of one generation. forward_passes: steps (each scores all positions of one forward
    pass); tokens_sampled / tokens_jumped / tokens_drafted: tokens chosen by the sampler (accepted
    draft tokens included) / forced by the grammar / accepted from drafts; rollbacks: draft tokens
    rolled back; mask_seconds: CPU time filling masks (s), mostly hidden behind the forward pass;
    masks: mask rows filled; reasoning_tokens: tokens inside the reasoning block (end marker included);
    retries: validate-and-rollback retries; violations: every violation found ("<keyword> at <pointer>:
    <message>"), one per retry, and the last one too when it ended the generation."""

    forward_passes: int = 0
    tokens_sampled: int = 0
    tokens_jumped: int = 0
    tokens_drafted: int = 0
    rollbacks: int = 0
    mask_seconds: float = 0.0
    masks: int = 0
    reasoning_tokens: int = 0
    retries: int = 0
    violations: list[str] = field(default_factory=list)


class ConstrainedDecodingStrategy(SamplingStrategy):
    """Decoding constrained by a compiled grammar. One per generation; not thread-safe.

    compiled: the grammar (`GrammarCache.get` / `compile_grammar`).
    params: sampling settings.
    bitmask: buffers to reuse across generations of a session (allocated if None); its rows bound
        the draft length (rows - 1).
    jump_forward: append forced tokens without sampling (True) or sample every token.
    want_logprobs: return log-probabilities (after masking) of each sampled token in `Step.logprobs`.
    max_draft: the longest speculative draft (used when the loop passes a drafter).
    reasoning: let a thinking model reason before the constrained answer (`Reasoning`), or None.
    max_retries: validate-and-rollback retries allowed per generation (schemas with `compiled.checks`).
    Raises ValueError when the bitmask's width is not the grammar's.
    """

    def __init__(
        self,
        compiled: CompiledGrammar,
        params: SamplingParams | None = None,
        bitmask: TokenBitmask | None = None,
        jump_forward: bool = True,
        want_logprobs: bool = False,
        max_draft: int = 8,
        reasoning: Reasoning | None = None,
        max_retries: int = 8,
    ):
        vocab_size = compiled.tokenizer.vocab_size
        bitmask = bitmask or TokenBitmask(vocab_size, batch=max_draft + 1)
        if bitmask.vocab_size != vocab_size:
            raise ValueError(f"bitmask for {bitmask.vocab_size} tokens, grammar for {vocab_size}")
        super().__init__(params, want_logprobs, max_draft=min(max_draft, bitmask.batch - 1))
        self.compiled = compiled
        self.matcher = compiled.matcher()
        self.bitmask = bitmask
        self.jump_forward = jump_forward
        self.stats = GuidedStats()
        self._rows = 0  # bitmask rows filled for the coming step (0: not yet)
        self.reasoning = reasoning
        self.checker = compiled.checks.checker() if compiled.checks is not None else None
        self.max_retries = max_retries
        self.answer: list[int] = []  # answer tokens so far, when there is a checker
        self.ends: list[int] = []  # output byte offset after each of them
        self.sampled: list[bool] = []  # whether each was sampled (a retry can ban it) or forced
        self.bans: dict[int, set[int]] = {}  # output byte offset -> tokens banned there by retries
        self.held_from: int | None = None  # where the text the loop holds back begins (last `_hold`)
        self.phase = "answer"  # or "free" / "thinking" (see the module docstring)
        self.prompt_state = "none"  # the prompt's reasoning state (`ReasoningTokens.prompt_state`)
        if reasoning is not None:
            t = reasoning.tokens
            self._free = _FreeMask(
                vocab_size, set(compiled.tokenizer.eos_ids) | compiled.tokenizer.padding_ids | {t.start[0]}
            )

    def begin(self, prompt_ids: list[int], drafter=None) -> None:
        super().begin(prompt_ids, drafter)
        if self.reasoning is not None:
            self.prompt_state = self.reasoning.tokens.prompt_state(prompt_ids)
            self.phase = {"open": "thinking", "free": "free"}.get(self.prompt_state, "answer")

    @property
    def complete(self) -> bool:
        """True if the answer so far is a complete match of the grammar (and no engine error)."""
        return self.phase == "answer" and self.matcher.is_accepting()

    @property
    def error(self) -> str:
        return self.matcher.error

    def prepare(self) -> None:
        """Fill the bitmask rows of the coming step (once per step; a no-op if already filled)."""
        if self._rows:
            return
        t0 = time.perf_counter()
        if self.phase == "thinking":
            for j in range(len(self.draft) + 1):
                self.bitmask.fill(self._free, row=j)
        else:
            for j, token in enumerate(self.draft):
                self.bitmask.fill(self.matcher, row=j)
                self.matcher.accept_token(token)  # checked by check_draft
            self.bitmask.fill(self.matcher, row=len(self.draft))
            if self.phase == "free":
                self.bitmask.allow(0, self.reasoning.tokens.start[0])
        self._rows = len(self.draft) + 1
        self.stats.mask_seconds += time.perf_counter() - t0
        self.stats.masks += self._rows

    def step(self, logits: mx.array) -> Step:
        """logits: mx.array [1 + d, vocab_size] (float32/float16/bfloat16) -> the next Step."""
        if self.phase == "answer" and not self.draft and self.matcher.is_terminated():
            return self._finish()
        self.prepare()
        self._rows = 0
        if self.matcher.error:  # e.g. a lexer limit hit while computing a mask
            return self._finish()
        self.stats.forward_passes += 1
        return super().step(logits)

    def mask(self, logits: mx.array) -> mx.array:
        x = self.bitmask.apply(logits)
        if self.bans:
            for row, offset in enumerate(self._offsets(self.draft[: x.shape[0] - 1])):
                if banned := self.bans.get(offset):
                    x[row, mx.array(sorted(banned))] = -float("inf")
        return x

    def _offsets(self, draft: list[int]) -> list[int]:
        """The answer's byte offset where each token of `draft` would start, and where the one after it would."""
        offsets = [len(self.checker.text)]
        for token in draft:
            offsets.append(offsets[-1] + len(self._bytes(token)))
        return offsets

    def _bytes(self, token: int) -> bytes:
        return self.compiled.tokenizer.ll_tokenizer.decode_bytes([token])

    def check_draft(self, draft: list[int]) -> list[int]:
        if self.phase == "thinking":  # free text, up to the end marker and within the budget
            t = self.reasoning.tokens
            stop = set(self.matcher.eos_ids) | {t.start[0], t.end[0]}
            end = next((i for i, d in enumerate(draft) if d in stop), len(draft))
            return draft[: min(end, self.reasoning.max_tokens - self.stats.reasoning_tokens - 1)]
        if self.phase == "free":
            return []
        draft = draft[: self.matcher.valid_prefix(draft)]
        if self.bans:
            offsets = self._offsets(draft)
            draft = next((draft[:i] for i, d in enumerate(draft) if d in self.bans.get(offsets[i], ())), draft)
        return draft

    def advance(self, accepted: list[int], token: int) -> Step:
        if self.phase == "free":
            if token == self.reasoning.tokens.start[0]:
                self.phase = "thinking"
                return Step(tokens=[token])
            self.phase = "answer"
        if self.phase == "thinking":
            return self._think(accepted, token)
        rejected = len(self.draft) - len(accepted)
        if rejected and not self.matcher.rollback(rejected):
            return self._finish()
        self.stats.rollbacks += rejected
        self.stats.tokens_drafted += len(accepted)
        self.stats.tokens_sampled += len(accepted) + 1
        if not self.matcher.accept_token(token):
            return self._finish()
        if token in self.matcher.eos_ids:  # allowed only where the grammar can end: the loop stops, emits no text
            return self._validate(Step(tokens=accepted + [token], verified=len(accepted), finish="stop"), 0)
        forced = []
        if self.jump_forward and not self.matcher.is_terminated():
            forced = self.matcher.jump_forward_tokens()
            if forced and not self.matcher.accept_tokens(forced):
                return self._finish()
            self.stats.tokens_jumped += len(forced)
        finish = "stop" if self.matcher.is_terminated() else None
        step = Step(tokens=accepted + [token] + forced, verified=len(accepted), finish=finish, forced=len(forced))
        return self._validate(step, 0)

    def _think(self, accepted: list[int], token: int) -> Step:
        """A step inside the reasoning block: free tokens; the end marker (sampled, or forced once the
        budget is spent) switches to the answer, after the separator and jump-forward tokens."""
        t = self.reasoning.tokens
        tokens = accepted + [token]
        self.stats.reasoning_tokens += len(tokens)
        self.stats.tokens_sampled += len(tokens)
        self.stats.tokens_drafted += len(accepted)
        if token == t.end[0]:
            forced = list(t.end[1:] + t.separator)
        elif self.stats.reasoning_tokens >= self.reasoning.max_tokens:
            forced = list(t.end + t.separator)
        else:
            return Step(tokens=tokens, verified=len(accepted))
        self.phase = "answer"
        if self.jump_forward:
            jump = self.matcher.jump_forward_tokens()
            if jump and not self.matcher.accept_tokens(jump):
                return self._finish()
            self.stats.tokens_jumped += len(jump)
            forced += jump
            step = Step(tokens=tokens + forced, verified=len(accepted), forced=len(forced))
            return self._validate(step, len(step.tokens) - len(jump))
        return Step(tokens=tokens + forced, verified=len(accepted), forced=len(forced))

    def _validate(self, step: Step, first: int) -> Step:
        """Feed the answer tokens of `step` (from index `first`) to the checker; on a violation, the
        step that rolls back to the value's first sampled token (see the module docstring)."""
        if self.checker is None:
            return step
        before = len(self.answer)
        sampled = len(step.tokens) - step.forced  # the step's tokens before this index were sampled
        violation = None
        for i in range(first, len(step.tokens)):
            token = step.tokens[i]
            if token in self.matcher.eos_ids:
                violation = self.checker.end()
            else:
                violation = self.checker.feed(self._bytes(token))
            self.answer.append(token)
            self.ends.append(len(self.checker.text))
            self.sampled.append(i < sampled)
            if violation is not None:
                break
        if violation is None and step.finish == "stop":
            violation = self.checker.end()  # a root number ends with the output
        if violation is None:
            step.hold = self._hold()
            return step
        return self._retry(step, first, before, violation)

    def _retry(self, step: Step, first: int, before: int, violation) -> Step:
        """Roll back to a sampled token that led to the violating value, and ban the rejected text
        there; or end with finish "error" when nothing can change or the retry budget is spent.

        Where to retry, first that works (its bans leave the grammar something to choose):
        1. for a keyword the container broke by closing too early (`contains`, `dependentRequired`,
           `minProperties`, ...), the token that closed it (`}` becomes `,` and another member);
        2. the first sampled token that wrote the value's text (`_bans_for`: every spelling of the
           rejected text from there, `r`, `re`, `red`, `red"`, so other tokens cannot write it again);
        3. the last sampled token before the value that may still be rolled back (`,` becomes `]`
           or `}`: the member is left out)."""
        self._seek(len(self.answer))  # the matcher also took the step's tokens after the violating one
        reaching = bisect.bisect_right(self.ends, violation.start)  # tokens before it end at or before its start
        movable = self._movable(before)
        retry = bans = None
        if violation.keyword in _CLOSED_TOO_EARLY and bytes(self.checker.text[violation.end - 1 : violation.end]) in (
            b"}",
            b"]",
        ):
            closer = bisect.bisect_left(self.ends, violation.end)  # the token that wrote the closing bracket
            if closer < len(self.answer) and self.sampled[closer] and movable(closer):
                bans = self._try(closer, violation.end)
                retry = closer if bans is not None else None
        for i in range(reaching, len(self.answer)) if retry is None else ():
            if self.sampled[i] and movable(i):
                self._seek(i)
                if (bans := self._bans_for(i, violation)) is not None:
                    retry = i
                    break
        for i in range(reaching - 1, -1, -1) if retry is None else ():  # nothing in the value can change
            if not movable(i):
                break
            if self.sampled[i] and (bans := self._try(i, violation.end)) is not None:
                retry = i
                break
        self.stats.violations.append(str(violation))
        if retry is None or self.stats.retries >= self.max_retries:
            why = "no sampled token to change" if retry is None else f"{self.max_retries} retries spent"
            step.finish, step.message = "error", f"validate-and-rollback: {violation} ({why})"
            return step
        self.stats.retries += 1
        self._seek(retry)
        offset = self._start(retry)
        for later in [o for o in self.bans if o > offset]:
            del self.bans[later]
        for at, tokens in bans.items():
            self.bans.setdefault(at, set()).update(tokens)
        self.checker.truncate(offset)
        del self.answer[retry:], self.ends[retry:], self.sampled[retry:]
        if retry >= before:  # the value started in this step: keep the step's tokens before it
            keep = first + retry - before
            sampled = len(step.tokens) - step.forced
            return Step(
                tokens=step.tokens[:keep],
                verified=min(step.verified, keep),
                forced=max(0, keep - sampled),
                hold=self._hold(),
            )
        SamplingStrategy.rollback(self, before - retry)  # history and drafter context; the matcher is done
        return Step(rollback=before - retry, hold=self._hold())

    def _bans_for(self, i: int, violation) -> dict[int, set[int]] | None:
        """{byte offset: tokens} to ban so that answer token `i` (the matcher is at its position) and
        what follows cannot spell the rejected text again; None if token `i` wrote none of the value's
        content (its opening brackets and quote and its closer are not content), or if the bans leave
        no allowed token at its offset."""
        text = bytes(self.checker.text)
        start, end = self._start(i), self.ends[i]
        content = violation.start  # the value's first content byte: after its opening brackets and quote
        while content < violation.end - 1 and text[content] in _OPENING:
            content += 1
        content += text[content : content + 1] == b'"' and content < violation.end - 1
        last = violation.end - (text[violation.end - 1 : violation.end] in (b'"', b"]", b"}"))  # before its closer
        if start >= last or end <= content:  # the token wrote none of the value's content
            return None
        content = max(content, start)
        bans: dict[int, set[int]] = {start: {self.answer[i]}}
        for at in range(start, content + 1):  # every spelling that reaches the content byte
            bans.setdefault(at, set()).update(self._spellings(text[at : violation.end], content - at + 1))
        return bans if self._allowed() - bans[start] - self.bans.get(start, set()) else None

    def _movable(self, before: int):
        """Whether answer token `i` may still be rolled back: it came in this step (answer tokens from
        `before` on) or the loop still holds it back (the last step's `hold`)."""
        held = self.held_from
        return lambda i: i >= before or (held is not None and self.ends[i] > held)

    def _seek(self, i: int) -> None:
        """Put the matcher after the first `i` answer tokens (rolling back or accepting again)."""
        if self.matcher.num_accepted > i:
            self.matcher.rollback(self.matcher.num_accepted - i)
        else:
            self.matcher.accept_tokens(self.answer[self.matcher.num_accepted : i])

    def _try(self, i: int, end: int) -> dict[int, set[int]] | None:
        """{offset: tokens} banning answer token `i` and every spelling of the output from its offset
        to `end` at least as long; None if that leaves the grammar nothing to choose there."""
        self._seek(i)
        start = self._start(i)
        banned = {self.answer[i]} | self._spellings(bytes(self.checker.text[start:end]), self.ends[i] - start)
        return {start: banned} if self._allowed() - banned - self.bans.get(start, set()) else None

    def _spellings(self, rejected: bytes, shortest: int) -> set[int]:
        """The tokens spelling a prefix of `rejected` at least `shortest` bytes long."""
        by_bytes = self.compiled.tokenizer.token_ids_by_bytes
        return {
            t for n in range(shortest, min(len(rejected), _LONGEST_TOKEN) + 1) for t in by_bytes.get(rejected[:n], ())
        }

    def _allowed(self) -> set[int]:
        """The tokens the grammar allows at the matcher's position."""
        row = np.zeros((1, self.matcher.words), np.int32)
        self.matcher.fill_next_token_bitmask(row)
        return set(np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist())

    def _start(self, i: int) -> int:
        """Byte offset where answer token `i` begins."""
        return self.ends[i - 1] if i else 0

    def _hold(self) -> int:
        """Trailing answer tokens whose text may still be rolled back."""
        self.held_from = start = self.checker.hold_from()
        return 0 if start is None else len(self.ends) - bisect.bisect_right(self.ends, start)

    def _finish(self) -> Step:
        if self.matcher.error:
            return Step(finish="error", message=f"grammar engine: {self.matcher.error}")
        return Step(finish="stop")

    def rollback(self, n: int) -> None:
        """Remove the last `n` generated tokens from the grammar state and the processors' history.
        Raises ValueError if fewer than `n` tokens were accepted."""
        if self._rows:  # prepare() ran: the matcher holds this step's draft
            self.matcher.rollback(self._rows - 1)
            self._rows = 0
        if not self.matcher.rollback(n):
            raise ValueError(f"cannot roll back {n} tokens: only {self.matcher.num_accepted} accepted")
        if self.checker is not None and n:
            keep = len(self.answer) - n
            self.checker.truncate(self._start(keep))
            del self.answer[keep:], self.ends[keep:], self.sampled[keep:]
        super().rollback(n)
