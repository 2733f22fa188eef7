"""`ConstrainedDecodingStrategy`: the runtime's `SamplingStrategy` with a grammar in the loop.

It composes the runtime's pipeline (processors -> mask -> log-softmax -> sampler, speculative
verification) and fills in its hooks. Three parts, each with its own state:

| part | owns | decides |
| --- | --- | --- |
| this class (mask/draft core) | the matcher, the bitmask, `GuidedStats` | masks, drafts, jump-forward, EOS gating |
| `guided.reasoning.ReasoningGate` | the phase, the reasoning-token count | when the grammar is on |
| `guided.rollback.RollbackPlanner` | answer tokens, offsets, bans, retries | validate-and-rollback retries |

- `prepare()` fills the bitmask rows of the coming step on the CPU while MLX computes the logits
  (the loop calls it after `mx.async_eval` of the forward pass); llguidance drops the GIL while
  filling. Row j is the mask after the first j draft tokens: the matcher accepts each draft token
  after filling its row, and is rolled back to the step's start once the rows are filled (as vLLM's
  structured-output manager does), so between steps the matcher holds exactly the output.
- `mask()` applies those rows to the logits of every position in one op (-inf where disallowed).
- `check_draft()` cuts a draft at its first token the grammar forbids (before the forward pass),
  and at an EOS (a draft never ends the output); where a draft ends before tokens the grammar
  forces (the next key after a value), it chains them and the drafter's proposal after them.
- `advance()`: the matcher accepts the accepted draft tokens and the sampled token, then the
  jump-forward tokens the grammar forces, which go through the model in the same forward pass as
  the next draft; `Step.forced` counts them.
- EOS gating: EOS / end-of-turn ids are in the mask only where the grammar can end. When the grammar
  is finished (nothing but EOS possible) the step ends generation with finish "stop", without
  emitting an end token.
- An engine error (a rejected token, a limit hit while computing a mask) ends generation with
  finish "error" and the engine's message; the partial text is then not valid (`complete` is False).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from guided.bitmask import TokenBitmask
from guided.compiler import CompiledGrammar
from guided.reasoning import ReasoningGate
from guided.rollback import RollbackPlanner
from guided.tools.calls import CallTracker
from runtime.errors import InputError
from runtime.reasoning import ReasoningPlan
from runtime.sampling import SamplingParams, SamplingStrategy
from runtime.strategy import Step


@dataclass
class GuidedStats:
    """Guided counters of one generation (the loop's counters, forward passes, forced, drafted and
    accepted tokens, are on `GenerationResult`; the reasoning tokens, counted from the delivered
    ones, on its `Outcome`). masks: bitmask rows filled; mask_seconds: CPU time filling them (s),
    mostly hidden behind the forward pass; retries: validate-and-rollback retries; violations:
    every violation found ("<keyword> at <pointer>: <message>"), one per retry, and the last one too
    when it ended the generation; repeated_calls: calls left out of a tools reply: the first one
    identical to an earlier call of the same reply (name and arguments), which ended the reply, and
    any the same step carried after it (`guided.tools.calls`)."""

    masks: int = 0
    mask_seconds: float = 0.0
    retries: int = 0
    violations: list[str] = field(default_factory=list)
    repeated_calls: int = 0


class ConstrainedDecodingStrategy(SamplingStrategy):
    """Decoding constrained by a compiled grammar. One per generation; not thread-safe.

    compiled: the grammar (`GrammarCache.get` / `compile_grammar`).
    params: sampling settings.
    bitmask: buffers to reuse across generations of a session (allocated if None); its rows bound
        the draft length (rows - 1).
    jump_forward: append forced tokens without sampling (True) or sample every token.
    want_logprobs: return log-probabilities (after masking) of each sampled token in `Step.logprobs`.
    max_draft: the longest speculative draft (used when the loop passes a drafter).
    reasoning: the generation's `runtime.reasoning.ReasoningPlan` (a thinking model reasons before
        the constrained answer), or None.
    max_retries: validate-and-rollback retries allowed per generation (schemas with `compiled.checks`).
    tracker: a `guided.tools.calls.CallTracker` for a tools constraint: it labels the answer tokens
        (`Step.channels`, `Step.hold`) and keeps the calls; None otherwise.
    checker: this generation's validate-and-rollback checker (`guided.tools.check.CallChecker` inside
        tool calls); None: the compiled schema's (`compiled.checks`), if it has one.
    Raises ValueError when the bitmask's width is not the grammar's.
    """

    def __init__(
        self,
        compiled: CompiledGrammar,
        params: SamplingParams | None = None,
        bitmask: TokenBitmask | None = None,
        jump_forward: bool = True,
        want_logprobs: bool = False,
        max_draft: int = 32,
        reasoning: ReasoningPlan | None = None,
        max_retries: int = 8,
        tracker: CallTracker | None = None,
        checker=None,
    ):
        info = compiled.tokenizer
        bitmask = bitmask or TokenBitmask(info.vocab_size, batch=max_draft + 1)
        if bitmask.vocab_size != info.vocab_size:
            raise InputError(f"bitmask for {bitmask.vocab_size} tokens, grammar for {info.vocab_size}")
        super().__init__(params, want_logprobs, max_draft=min(max_draft, bitmask.batch - 1))
        self.compiled = compiled
        self.matcher = compiled.matcher()
        self.bitmask = bitmask
        self.jump_forward = jump_forward
        self.stats = GuidedStats()
        self._filled = False  # the bitmask rows of the coming step are filled
        self.gate = ReasoningGate(reasoning, info.vocab_size, set(info.eos_ids) | info.padding_ids)
        self.tracker = tracker
        self.outside = 0  # output tokens before the answer (the reasoning block)
        self.planner = None
        if checker is None and compiled.checks is not None:
            checker = compiled.checks.checker()
        if checker is not None:
            self.planner = RollbackPlanner(checker, self.matcher, info, max_retries, self.stats)

    @property
    def complete(self) -> bool:
        """True if the answer so far is a complete match of the grammar (and no engine error)."""
        return self.gate.answering and self.matcher.is_accepting()

    @property
    def error(self) -> str:
        return self.matcher.error

    def prepare(self) -> None:
        """Fill the bitmask rows of the coming step (once per step; a no-op if already filled)."""
        if self._filled:
            return
        t0 = time.perf_counter()
        rows = len(self.draft) + 1
        if self.gate.phase == "free":
            self.gate.fill(self.bitmask, rows)
        else:
            for j, token in enumerate(self.draft):
                self.bitmask.fill(self.matcher, row=j)
                self.matcher.accept_token(token)  # checked by check_draft
            self.bitmask.fill(self.matcher, row=len(self.draft))
            if self.draft:
                self.matcher.rollback(len(self.draft))
            self.gate.allow_start(self.bitmask)
        self._filled = True
        self.stats.mask_seconds += time.perf_counter() - t0
        self.stats.masks += rows

    def step(self, logits: mx.array) -> Step:
        """logits: mx.array [1 + d, vocab_size] (float32/float16/bfloat16) -> the next Step."""
        if self.gate.answering and not self.draft and self.matcher.is_terminated():
            return self._finish()
        self.prepare()
        self._filled = False
        if self.matcher.error:  # e.g. a lexer limit hit while computing a mask
            return self._finish()
        return super().step(logits)

    def mask(self, logits: mx.array) -> mx.array:
        x = self.bitmask.apply(logits)
        return self.planner.mask(x, self.draft) if self.planner is not None else x

    def check_draft(self, draft: list[int]) -> list[int]:
        if not self.gate.answering:
            return self.gate.cut_draft(draft)
        draft = draft[: self.matcher.valid_prefix(draft)]
        if self.jump_forward and draft and self.drafter is not None:
            draft = self._chain(draft)
        return self.planner.cut_draft(draft) if self.planner is not None else draft

    CHAIN_LINKS = 4  # drafter calls per step at most (each about 0.5 ms)

    def _chain(self, draft: list[int]) -> list[int]:
        """`draft` (valid) extended across the grammar's forced tokens: where it ends before tokens
        the grammar forces (a value's closing `","` before the next key), append them and what the
        drafter proposes after them, up to `max_draft` tokens; each extension cut at its first
        forbidden token. The matcher is back at the step's start afterwards."""
        accepted = 0
        assert self.drafter is not None  # `check_draft` chains only with a drafter
        try:
            for _ in range(self.CHAIN_LINKS - 1):
                if not self.matcher.accept_tokens(draft[accepted:]):  # validated: cannot fail
                    break
                accepted = len(draft)
                forced = [] if self.matcher.is_terminated() else self.matcher.jump_forward_tokens()
                room = self.max_draft - len(draft) - len(forced)
                more = self.drafter.propose(self.context + draft + forced, room) if forced and room > 0 else []
                if not more:
                    break
                extension = forced + more
                cut = self.matcher.valid_prefix(extension)
                draft += extension[:cut]
                if cut < len(extension):
                    break
        finally:
            self.matcher.rollback(accepted)
        return draft

    def advance(self, accepted: list[int], token: int) -> Step:
        if not self.gate.answering and (gated := self.gate.advance(accepted, token)) is not None:
            self.outside += len(gated.tokens) + len(gated.forced)
            if not gated.answer:
                return Step(tokens=gated.tokens, verified=len(accepted))
            tokens = gated.tokens + gated.forced
            return self._answer(tokens, len(accepted), forced=len(gated.forced), first=len(tokens))
        if not self.matcher.accept_tokens(accepted + [token]):
            return self._finish()
        if token in self.matcher.eos_ids:  # allowed only where the grammar can end: the loop stops, emits no text
            return self._validate(Step(tokens=accepted + [token], verified=len(accepted), finish="stop"), 0)
        return self._answer(accepted + [token], len(accepted))

    def _answer(self, tokens: list[int], verified: int, forced: int = 0, first: int = 0) -> Step:
        """The step of `tokens` (the last `forced` of them forced: a reasoning block's end marker
        and separator) followed by the grammar's jump-forward tokens, validated from index `first`
        (where the answer's tokens begin)."""
        jump = []
        if self.jump_forward and not self.matcher.is_terminated():
            jump = self.matcher.jump_forward_tokens()
            if jump and not self.matcher.accept_tokens(jump):
                return self._finish()
        finish = "stop" if self.matcher.is_terminated() else None
        step = Step(tokens=tokens + jump, verified=verified, finish=finish, forced=forced + len(jump))
        return self._validate(step, first)

    def _validate(self, step: Step, first: int) -> Step:
        """Validate-and-rollback of the answer tokens of `step` from index `first` (see `guided.rollback`);
        the tracker's labels of them."""
        held = 0
        if self.tracker is not None:  # first: the checker inside calls reads the tracker's labels
            if self.tracker.start is None:
                self.tracker.start = self.outside
            held = self.tracker.hold
            self.tracker.feed([t for t in step.tokens[first:] if t not in self.matcher.eos_ids])
            self._channels(step, first, held)
            step.hold = self.tracker.hold
        if self.planner is None:
            return self._end_at_repeat(step)
        retries = self.stats.retries
        step = self.planner.validate(step, first)
        if step.rollback:  # the planner moved the matcher; history and drafter context follow
            SamplingStrategy.rollback(self, step.rollback)
        if self.tracker is not None:
            if self.stats.retries > retries:  # the retry took back tokens the tracker was fed
                self.tracker.forget(self.tracker.fed - len(self.planner.answer))
                if not step.rollback:
                    self._channels(step, first, held)
            step.hold = max(step.hold, self.tracker.hold)  # a trigger the tracker holds, text the planner may retry
        return self._end_at_repeat(step)

    def _end_at_repeat(self, step: Step) -> Step:
        """End the reply once a call repeats an earlier one of it and the grammar may end there (the
        repeat is left out of the result: `CallTracker.result`): a small model that loops on one
        call would otherwise write it until the budget runs out."""
        if self.tracker is not None and self.tracker.repeated and not step.finish and self.matcher.is_accepting():
            step.finish = "stop"
        return step

    def _channels(self, step: Step, first: int, held: int) -> None:
        """Label the step's answer tokens (`first` on) and the `held` ones before them (tools), from
        the tracker's labels of the tokens it has been fed."""
        tracker = self.tracker
        assert tracker is not None  # labelled only with a tracker (`step`)
        answer = len([t for t in step.tokens[first:] if t not in self.matcher.eos_ids])
        labels = tracker.labels[len(tracker.labels) - held - answer :]
        step.channels = labels[:held] + [None] * first + labels[held:]
        step.channels += [None] * (len(step.tokens) - first - answer)  # the final EOS (not appended)

    def _finish(self) -> Step:
        if self.matcher.error:
            return Step(finish="error", message=f"grammar engine: {self.matcher.error}")
        return Step(finish="stop")

    def rollback(self, n: int) -> None:
        """Remove the last `n` generated tokens from the grammar state and the processors' history.
        Tokens of a reasoning block (before the answer; the matcher never takes them) leave the
        grammar state as it is. Raises InputError, without a reasoning plan, if fewer than `n`
        tokens were accepted."""
        answer = n
        if self.gate.plan is not None:
            answer = min(n, self.matcher.num_accepted) if self.gate.answering else 0
        if not self.matcher.rollback(answer):
            raise InputError(f"cannot roll back {n} tokens: only {self.matcher.num_accepted} accepted")
        if self.planner is not None:
            self.planner.forget(answer)
        if self.tracker is not None:
            self.tracker.forget(min(answer, self.tracker.fed))
        super().rollback(n)
