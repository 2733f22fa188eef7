"""`RollbackPlanner`: validate-and-rollback for the keywords a grammar cannot express.

The planner follows the answer's tokens, feeds their bytes to `guided.checker`'s `ValueChecker`
(which validates each value a checked keyword governs as it closes), and on a violation plans the
retry: where to roll the matcher back, and which tokens to ban there. It owns the answer's tokens,
their byte offsets, the bans, the retry budget and the hold-back of text that may still be rolled
back; the strategy owns the matcher, the bitmask and the sampler.

Where to retry, the first that works (its bans leave the grammar something to choose):
1. for a keyword the container broke by closing too early (`contains`, `dependentRequired`,
   `minProperties`, ...), the token that closed it (`}` becomes `,` and another member);
2. the first sampled token that wrote the value's text, banning every spelling of the rejected text
   from there (`r`, `re`, `red`, `red"`), so other tokens cannot write it again;
3. the last sampled token before the value that may still be rolled back (`,` becomes `]` or `}`:
   the member is left out).
Bans are keyed by byte offset, not token index, so a re-tokenized prefix keeps them. After
`max_retries` retries the generation ends with finish "error" naming the keyword.
"""

from __future__ import annotations

import bisect

import mlx.core as mx
import numpy as np

from guided.matcher import GrammarMatcher
from runtime.strategy import Step

_OPENING = frozenset(b"{[ \t\r\n")  # bytes that open a JSON value before its content (and a quote)
_LONGEST_TOKEN = 64  # bytes: longer spellings of a rejected value are not looked up
# Keywords a container can break by closing before a member that would satisfy them.
_CLOSED_TOO_EARLY = frozenset(
    {"contains", "minContains", "dependentRequired", "dependencies", "dependentSchemas", "minProperties", "required"}
)


class RollbackPlanner:
    """Validate-and-rollback state of one generation (see the module docstring).

    checker: the compiled grammar's `ValueChecker`. matcher: the generation's matcher (the planner
    moves it when it plans a retry). tokenizer: the `guided.TokenizerInfo` (token bytes).
    max_retries: retries allowed. stats: the strategy's `GuidedStats` (retries, violations).
    """

    def __init__(self, checker, matcher: GrammarMatcher, tokenizer, max_retries: int, stats):
        self.checker = checker
        self.matcher = matcher
        self.tokenizer = tokenizer
        self.max_retries = max_retries
        self.stats = stats
        self.answer: list[int] = []  # answer tokens so far
        self.ends: list[int] = []  # output byte offset after each of them
        self.sampled: list[bool] = []  # whether each was sampled (a retry can ban it) or forced
        self.bans: dict[int, set[int]] = {}  # output byte offset -> tokens banned there by retries
        self.held_from: int | None = None  # where the text the loop holds back begins (last `_hold`)

    # -- the strategy's hooks -------------------------------------------------------------------------

    def mask(self, x: mx.array, draft: list[int]) -> mx.array:
        """Logits [rows, vocab] float32 with the banned tokens of each row's offset at -inf (row j:
        after the first j draft tokens)."""
        if self.bans:
            for row, offset in enumerate(self._offsets(draft[: x.shape[0] - 1])):
                if banned := self.bans.get(offset):
                    x[row, mx.array(sorted(banned))] = -float("inf")
        return x

    def cut_draft(self, draft: list[int]) -> list[int]:
        """`draft` up to its first token banned at its offset."""
        if not self.bans:
            return draft
        offsets = self._offsets(draft)
        return next((draft[:i] for i, d in enumerate(draft) if d in self.bans.get(offsets[i], ())), draft)

    def validate(self, step: Step, first: int) -> Step:
        """Feed the answer tokens of `step` (from index `first`; the matcher has accepted them) to the
        checker; returns `step` with its `hold`, or on a violation the step that retries (its tokens
        cut before the value, or `rollback` of earlier tokens; the matcher is already moved there),
        or `step` ended with finish "error"."""
        before = len(self.answer)
        sampled = len(step.tokens) - step.forced  # the step's tokens before this index were sampled
        violation = None
        for i in range(first, len(step.tokens)):
            token = step.tokens[i]
            violation = self.checker.end() if token in self.matcher.eos_ids else self.checker.feed(self._bytes(token))
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

    def forget(self, n: int) -> None:
        """Take the last `n` answer tokens back (the strategy rolled them back)."""
        if n:
            keep = len(self.answer) - n
            self.checker.truncate(self._start(keep))
            del self.answer[keep:], self.ends[keep:], self.sampled[keep:]

    # -- planning a retry -------------------------------------------------------------------------------

    def _retry(self, step: Step, first: int, before: int, violation) -> Step:
        self._seek(len(self.answer))  # the matcher also took the step's tokens after the violating one
        reaching = bisect.bisect_right(self.ends, violation.start)  # tokens before it end at or before its start
        movable = self._movable(before)
        retry = bans = None
        closer_text = bytes(self.checker.text[violation.end - 1 : violation.end])
        if violation.keyword in _CLOSED_TOO_EARLY and closer_text in (b"}", b"]"):
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
        assert bans is not None  # found with `retry`
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
        by_bytes = self.tokenizer.token_ids_by_bytes
        return {
            t for n in range(shortest, min(len(rejected), _LONGEST_TOKEN) + 1) for t in by_bytes.get(rejected[:n], ())
        }

    def _allowed(self) -> set[int]:
        """The tokens the grammar allows at the matcher's position."""
        row = np.zeros((1, self.matcher.words), np.int32)
        self.matcher.fill_next_token_bitmask(row)
        return set(np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist())

    def _offsets(self, draft: list[int]) -> list[int]:
        """The answer's byte offset where each token of `draft` would start, and where the one after it would."""
        offsets = [len(self.checker.text)]
        for token in draft:
            offsets.append(offsets[-1] + len(self._bytes(token)))
        return offsets

    def _bytes(self, token: int) -> bytes:
        return self.tokenizer.ll_tokenizer.decode_bytes([token])

    def _start(self, i: int) -> int:
        """Byte offset where answer token `i` begins."""
        return self.ends[i - 1] if i else 0

    def _hold(self) -> int:
        """Trailing answer tokens whose text may still be rolled back."""
        self.held_from = start = self.checker.hold_from()
        return 0 if start is None else len(self.ends) - bisect.bisect_right(self.ends, start)
