"""Continuous batching: several sequences decode together, one forward pass over all of them per
step, each with its own `DecodingStrategy` (sampling parameters, seed, grammar), stops, budget and
cancel event. Sequences join after their prefill and leave when they finish, without draining the
batch.

Built on mlx-lm's batched KV cache (`mlx_lm.models.cache.BatchKVCache`: rows left-padded to a common
length; `merge` builds one from single caches, `extend` adds rows, `filter` drops rows, `extract`
copies one row out, `prepare(right_padding=)` + `finalize()` shift rows right) and on its
`LRUPromptCache` for the multi-entry prefix cache. mlx-lm's `BatchGenerator` itself is not used: it
samples every row with one sampler call and one token per row per step, while a row here may append
several tokens in one step (jump-forward, accepted drafts) and may need its own KV trim (rejected
draft, rollback), and every row is stepped by its own strategy (the one guided path).

The batch decides, `runtime.kv_batch.KVBatch` executes: each step's decisions are one
`runtime.step_plan.StepPlan` (rows added, cancelled, trimmed, leaving, and each row's feed), the only
input of the KV caches and the network (the model-call boundary, which a distributed model's other
ranks replay). One step (`BatchGenerator.step`):

    apply each row's strategy.step(its logits)          -> Sequence.apply: trims, EOS, budget, cancel
    emit each row's text (detokenizer, stop strings)    -> Sequence.emit
    the plan, executed by the KV layer:
    trim rows' KV caches (prepare(right_padding=trims) + finalize: the trimmed tail becomes left padding)
    rows that finished leave (filter; their cache goes to the prefix cache); waiting rows prefill,
        together in one pass when their prompts fit a chunk (else one chunk of one row), and join
        (merge + extend) once only their last prompt token is left
    feed every row its new tokens in ONE forward pass, right-padded to the longest feed, mx.async_eval
    strategy.prepare() of every row (grammar masks) while MLX computes

Rows with several new tokens: a row's feed is all its new tokens (a jump-forward run, or accepted
draft tokens) and the other rows are right-padded to that length, as mlx-lm pads prompts of different
lengths; every row is stepped every pass, so forced tokens never stall the others (they only widen
that one pass). Speculative drafts are fed only while a single row is active: with several rows the
batch already fills the pass, and a draft would widen every row's feed.

The KV cache must be one mlx-lm can batch. Plain `KVCache` layers can be trimmed per row; models
with rotating (sliding-window) layers batch, but get no drafts, and a rollback ends that row with
an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache

from runtime.errors import InputError
from runtime.generate import default_prefill_step
from runtime.kv_batch import KVBatch, Slot
from runtime.sampling import check_max_tokens
from runtime.sequence import Delta, Sequence
from runtime.step_plan import StepPlan
from runtime.strategy import DecodingStrategy, Drafter

# Executes a step's plan on the KV layer (`KVBatch.run`, or on a distributed model the leader's
# broadcast then run) and returns each active row's logits.
Executor = Callable[[StepPlan], dict[int, mx.array]]


@dataclass
class Row:
    """One sequence of the batch. `tag`: the caller's handle (e.g. a server job); `slot`: its KV state."""

    seq: Sequence
    strategy: DecodingStrategy
    tag: Any
    slot: Slot
    logits: mx.array | None = None  # [rows, vocab], lazy until the step


class BatchGenerator:
    """Runs many generations in one batch on one thread; not thread-safe (the server's worker owns it).

    network: an mlx-lm model (nn.Module) returning logits [batch, seq, vocab].
    tokenizer: `runtime.tokenizer.Tokenizer`.
    max_batch: the most rows decoding together (>= 1); more added rows wait, prefilled one at a time.
    prompt_cache: an mlx-lm `LRUPromptCache` (entries LRU, bounded by bytes), or None for no reuse.
        A prompt starts from its longest cached prefix; a finished row's KV cache is stored with the
        token ids it holds (prompt and output), so a follow-up turn reuses the whole conversation.
    prefill_step_size: prompt tokens per prefill chunk (default `default_prefill_step(interleaved=True)`); one chunk
        runs per step, between the decode passes of the running rows.
    execute: how a step's plan is executed (default: this batch's `KVBatch.run`; a distributed
        model's leader broadcasts it first, `runtime.distributed.Leader.execute`).
    Raises InputError for max_batch < 1.
    """

    def __init__(
        self,
        network,
        tokenizer,
        *,
        max_batch: int = 4,
        prompt_cache: LRUPromptCache | None = None,
        prefill_step_size: int | None = None,
        execute: Callable[[KVBatch, StepPlan], dict[int, mx.array]] | None = None,
    ):
        if max_batch < 1:
            raise InputError(f"max_batch must be >= 1, got {max_batch}")
        self.tokenizer = tokenizer
        self.kv = KVBatch(network, max_batch, prompt_cache, prefill_step_size or default_prefill_step(interleaved=True))
        self._execute: Executor = (lambda plan: execute(self.kv, plan)) if execute is not None else self.kv.run
        self.rows: dict[int, Row] = {}  # by row id, until the row leaves
        self._plan = StepPlan()  # the next step's plan, adds so far
        self._next_rid = 0

    @property
    def max_batch(self) -> int:
        return self.kv.max_batch

    @property
    def trimmable(self) -> bool:
        """Whether a row's KV can be trimmed (plain KV caches; not rotating ones)."""
        return self.kv.trimmable

    @property
    def active(self) -> list[Row]:
        """The decoding rows, in the order of the batch cache."""
        return [self.rows[s.rid] for s in self.kv.active]

    @property
    def waiting(self) -> list[Row]:
        """The rows prefilling or waiting for a free row."""
        return [self.rows[s.rid] for s in self.kv.waiting]

    def __len__(self) -> int:
        """Rows decoding or waiting."""
        return len(self.kv.active) + len(self.kv.waiting)

    def add(
        self,
        prompt_ids: list[int],
        strategy: DecodingStrategy,
        *,
        max_tokens: int = 256,
        stop: list[str] | None = None,
        cancel: threading.Event | None = None,
        drafter: Drafter | None = None,
        tag: Any = None,
    ) -> Row:
        """Queue a generation; its `Delta`s come out of `step()` with this row. Raises InputError for
        an empty prompt or max_tokens < 1."""
        if not prompt_ids:
            raise InputError("the prompt is empty")
        check_max_tokens(max_tokens)
        start = time.perf_counter()
        rid, self._next_rid = self._next_rid, self._next_rid + 1
        slot = self.kv.add(rid, list(prompt_ids))
        self._plan.add.append((rid, list(prompt_ids), slot.reused))
        if drafter is not None and self.trimmable:
            # the row drafts only while it is alone (`solo`); its drafter is not even asked otherwise,
            # so a draft model's passes are not wasted on drafts that would not be fed
            strategy.begin(list(prompt_ids), drafter, budget=max_tokens, solo=lambda: self.solo)
        else:
            strategy.begin(list(prompt_ids))
        seq = Sequence(
            self.tokenizer,
            prompt_ids,
            max_tokens=max_tokens,
            stop=stop,
            cancel=cancel,
            reused=slot.reused,
            start=start,
        )
        row = Row(seq, strategy, tag, slot)
        self.rows[rid] = row
        return row

    @property
    def solo(self) -> bool:
        """One row decodes and none waits: the only time drafts are fed."""
        return len(self.kv.active) == 1 and not self.kv.waiting

    def step(self, deliver: Callable[[list[tuple[Row, Delta]]], None] | None = None) -> list[tuple[Row, Delta]]:
        """One step of the batch: apply the last pass's logits and emit each row's text, then execute
        the step's plan (rows leave and join, the next forward pass is launched), then fill the rows'
        masks while it computes. Returns the `Delta`s of this step (a row's last one carries its
        `GenerationResult`). deliver: called with them before the plan executes, so they reach the
        clients without waiting for the next pass: on the CPU backend `mx.async_eval` returns only
        once most of the pass has run (`runtime.generate`). A row whose strategy raises ends with
        finish_reason "error"; an error of the forward pass itself propagates (after `deliver`) and
        drops every row (the batch is then empty)."""
        out: list[tuple[Row, Delta]] = []
        plan, self._plan = self._plan, StepPlan()
        for row in self.active:
            trim = self._apply(row, out)
            if trim:
                plan.trim.append((row.slot.rid, trim))
            if row.seq.finish is not None:
                plan.leave.append((row.slot.rid, row.seq.finish != "error"))
            else:
                plan.feed.append((row.slot.rid, *row.seq.next_feed()))
        for row in self.waiting:
            if row.seq.cancelled:
                plan.cancel.append(row.slot.rid)
                out.append((row, row.seq.end("cancelled")))
        if deliver is not None:
            deliver(out)
        try:
            logits = self._execute(plan)
        except Exception:
            self.rows = {}
            self.kv.clear()
            raise
        for rid, _ in plan.leave:
            del self.rows[rid]
        for rid in plan.cancel:
            del self.rows[rid]
        for row in self.active:
            row.logits = logits[row.slot.rid]
            row.seq.reused = row.slot.reused  # more than at `add` when it shared another row's prefill
            try:
                row.strategy.prepare()  # grammar masks, while MLX computes the pass
            except Exception as exc:  # noqa: BLE001 - this row's failure ends this row only
                row.seq.finish, row.seq.error = "error", f"{type(exc).__name__}: {exc}"
        return out

    def _apply(self, row: Row, out: list) -> int:
        """Step one row on its logits and emit its text (stop strings are matched before the row is
        fed again, so a stop never costs a pass). Returns its KV trim count."""
        if row.seq.finish is not None:  # failed in prepare()
            out.append((row, row.seq.end(row.seq.finish, row.seq.error)))
            return 0
        try:
            assert row.logits is not None  # set by the pass before the step
            trim = row.seq.apply(row.strategy.step(row.logits))
            if row.seq.overrun:
                row.strategy.rollback(row.seq.overrun)
        except Exception as exc:  # noqa: BLE001 - this row's failure ends this row only
            out.append((row, row.seq.end("error", f"{type(exc).__name__}: {exc}")))
            return 0
        if trim and not self.trimmable:
            out.append((row, row.seq.end("error", "this model's KV cache cannot be trimmed for a rollback")))
            return 0
        delta = row.seq.emit()
        if delta is not None:
            out.append((row, delta))
        return trim


def stream_batched(
    network,
    tokenizer,
    prompt_ids: list[int],
    strategy: DecodingStrategy,
    *,
    execute: Callable[[KVBatch, StepPlan], dict[int, mx.array]],
    max_tokens: int = 256,
    context_length: int | None = None,
    stop: list[str] | None = None,
    cancel: threading.Event | None = None,
    drafter: Drafter | None = None,
) -> Iterator[Delta]:
    """One generation as a batch of one row whose plans go through `execute` (a distributed model's
    leader: the other ranks replay them); arguments and `Delta`s as `runtime.generate.stream_tokens`,
    whose output it gives token for token. Checks its arguments at the call. Raises InputError."""
    if context_length and len(prompt_ids) >= context_length:
        raise InputError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {context_length}")
    batch = BatchGenerator(network, tokenizer, max_batch=1, execute=execute)
    batch.add(prompt_ids, strategy, max_tokens=max_tokens, stop=stop, cancel=cancel, drafter=drafter)

    def run() -> Iterator[Delta]:
        while len(batch):
            for _, delta in batch.step():
                yield delta

    return run()
