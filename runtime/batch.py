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

One step (`BatchGenerator.step`):

    apply each row's strategy.step(its logits)          -> Sequence.apply: trims, EOS, budget, cancel
    emit each row's text (detokenizer, stop strings)    -> Sequence.emit
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

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, LRUPromptCache, make_prompt_cache, trim_prompt_cache

from runtime.errors import InputError
from runtime.generate import default_prefill_step
from runtime.sampling import check_max_tokens
from runtime.sequence import Delta, Sequence
from runtime.strategy import DecodingStrategy, Drafter

_MODEL_KEY = "model"  # LRUPromptCache keys entries by model; one batch serves one model


@dataclass
class Row:
    """One sequence of the batch. `tag`: the caller's handle (e.g. a server job)."""

    seq: Sequence
    strategy: DecodingStrategy
    tag: Any
    cache: list | None  # its own KV cache (mlx-lm caches, one per layer) while prefilling; None once joined
    pending: list[int]  # prompt tokens not yet in the KV cache (the last one is fed with the batch)
    tokens: list[int] = field(default_factory=list)  # token ids in this row's KV cache
    feed: list[int] = field(default_factory=list)  # tokens of the running forward pass
    rows: int = 1  # logits rows the strategy takes from the end of `feed`
    logits: mx.array | None = None  # [rows, vocab], lazy until the step


def _state(row: Row) -> tuple:
    """What a waiting row's prefill depends on: the tokens in its KV cache and the rest of its prompt."""
    return tuple(row.tokens), tuple(row.pending)


class BatchGenerator:
    """Runs many generations in one batch on one thread; not thread-safe (the server's worker owns it).

    network: an mlx-lm model (nn.Module) returning logits [batch, seq, vocab].
    tokenizer: `runtime.tokenizer.Tokenizer`.
    max_batch: the most rows decoding together (>= 1); more added rows wait, prefilled one at a time.
    prompt_cache: an mlx-lm `LRUPromptCache` (entries LRU, bounded by bytes), or None for no reuse.
        A prompt starts from its longest cached prefix; a finished row's KV cache is stored with the
        token ids it holds (prompt and output), so a follow-up turn reuses the whole conversation.
    prefill_step_size: prompt tokens per prefill chunk (default `default_prefill_step()`); one chunk
        runs per step, between the decode passes of the running rows.
    Raises ValueError for max_batch < 1.
    """

    def __init__(
        self,
        network,
        tokenizer,
        *,
        max_batch: int = 4,
        prompt_cache: LRUPromptCache | None = None,
        prefill_step_size: int | None = None,
    ):
        if max_batch < 1:
            raise InputError(f"max_batch must be >= 1, got {max_batch}")
        self.network = network
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.prompt_cache = prompt_cache
        self.prefill_step_size = prefill_step_size or default_prefill_step()
        self.active: list[Row] = []  # decoding, in the order of the batch cache's rows
        self.waiting: list[Row] = []  # prefilling (the first one) or waiting for a free row
        self.cache: list | None = None  # one BatchKVCache (or batched rotating cache) per layer
        self._short_next = True  # short prompts go first, then turns alternate while both wait
        # A row's KV can be trimmed (rejected drafts, rollback) only in plain KV caches: a rotating
        # (sliding-window) one may have overwritten what a trim would uncover.
        self.trimmable = all(type(c) is KVCache for c in make_prompt_cache(network))

    def __len__(self) -> int:
        """Rows decoding or waiting."""
        return len(self.active) + len(self.waiting)

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
        """Queue a generation; its `Delta`s come out of `step()` with this row. Raises ValueError for
        an empty prompt or max_tokens < 1."""
        if not prompt_ids:
            raise InputError("the prompt is empty")
        check_max_tokens(max_tokens)
        start = time.perf_counter()
        cache, reused = None, 0
        if self.prompt_cache is not None:
            cache, rest = self.prompt_cache.fetch_nearest_cache(_MODEL_KEY, list(prompt_ids))
            if cache is not None and not rest:  # an exact hit: the last prompt token still gives the first logits
                if trim_prompt_cache(cache, 1) == 1:
                    rest = prompt_ids[-1:]
                else:  # a rotating cache past its window cannot give the token back
                    cache, rest = None, prompt_ids
            reused = len(prompt_ids) - len(rest) if cache is not None else 0
        cache = cache or make_prompt_cache(self.network)
        if drafter is not None and self.trimmable:
            # the row drafts only while it is alone (`solo`); its drafter is not even asked otherwise,
            # so a draft model's passes are not wasted on drafts that would not be fed
            strategy.begin(list(prompt_ids), drafter, budget=max_tokens, solo=lambda: self.solo)
        else:
            strategy.begin(list(prompt_ids))
        seq = Sequence(
            self.tokenizer, prompt_ids, max_tokens=max_tokens, stop=stop, cancel=cancel, reused=reused, start=start
        )
        row = Row(seq, strategy, tag, cache, list(prompt_ids[reused:]), list(prompt_ids[:reused]))
        self.waiting.append(row)
        return row

    @property
    def solo(self) -> bool:
        """One row decodes and none waits: the only time drafts are fed."""
        return len(self.active) == 1 and not self.waiting

    def step(self) -> list[tuple[Row, Delta]]:
        """One step of the batch: apply the last pass's logits and emit each row's text, let rows leave
        and join, launch the next forward pass, fill the rows' masks while it computes. Returns the
        `Delta`s of this step (a row's last one carries its `GenerationResult`). A row whose strategy
        raises ends with finish_reason "error"; an error of the forward pass itself propagates and
        drops every row (the batch is then empty)."""
        out: list[tuple[Row, Delta]] = []
        try:
            trims = [self._apply(row, out) for row in self.active]
            self._trim(trims)
            self._leave()
            self._admit(out)
            if self.active:
                self._forward()
        except Exception:
            self.active, self.waiting, self.cache = [], [], None
            raise
        for row in self.active:
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
        if trim:
            del row.tokens[len(row.tokens) - trim :]
        delta = row.seq.emit()
        if delta is not None:
            out.append((row, delta))
        return trim

    def _trim(self, trims: list[int]) -> None:
        """Drop each row's last `trims[i]` KV entries: shifted right, they become left padding."""
        if any(trims):
            assert self.cache is not None  # rows are active
            for c in self.cache:
                c.prepare(right_padding=trims)
                c.finalize()

    def _leave(self) -> None:
        """Rows whose sequence ended leave the batch; their KV cache goes to the prefix cache."""
        keep = [i for i, row in enumerate(self.active) if row.seq.finish is None]
        if len(keep) == len(self.active):
            return
        for i, row in enumerate(self.active):
            if row.seq.finish is not None and row.seq.finish != "error" and self.prompt_cache is not None:
                assert self.cache is not None  # rows are active
                self.prompt_cache.insert_cache(_MODEL_KEY, list(row.tokens), [c.extract(i) for c in self.cache])
        self.active = [self.active[i] for i in keep]
        if not keep:
            self.cache = None
            return
        assert self.cache is not None  # rows stay active
        for c in self.cache:
            c.filter(keep)

    def _admit(self, out: list) -> None:
        """Cancelled waiting rows end; waiting rows prefill and join the batch once only their last
        prompt token is left (that token is fed with the batch). Rows whose remaining prompts fit one
        chunk prefill together in ONE pass (as mlx-lm's `BatchGenerator` prefills a batch of prompts),
        up to the free rows and `2 * prefill_step_size` padded positions (rows in the same state, which
        share a row of the pass, count once), so several requests arriving
        together pause the running rows once, not once each. A longer prompt prefills alone, one chunk
        per step; while one does, steps alternate between its chunks and the short prompts, so a short
        request does not wait for a long prompt's whole prefill, nor a long one forever."""
        for row in [r for r in self.waiting if r.seq.cancelled]:
            self.waiting.remove(row)
            out.append((row, row.seq.end("cancelled")))
        room = self.max_batch - len(self.active)
        if not self.waiting or room < 1:
            return
        self._share_prefill()
        short = [r for r in self.waiting if len(r.pending) - 1 <= self.prefill_step_size]
        long = [r for r in self.waiting if r not in short]
        long_turn = bool(long) and (not short or not self._short_next)
        self._short_next = long_turn or not long
        if long_turn:
            self._prefill_alone(long[0])
            return
        group: list[Row] = []
        for row in short[:room]:
            width = max(len(r.pending) - 1 for r in group + [row])
            if group and len({_state(r) for r in group + [row]}) * width > 2 * self.prefill_step_size:
                break
            group.append(row)
        self._join(group, self._prefill_together(group))

    def _share_prefill(self) -> None:
        """A waiting row whose prompt starts with more tokens than it has in its KV cache, all of them
        already in another waiting row's KV cache, takes a copy of that cache instead of computing it
        again: the `n` choices of one request with a long prompt, or requests with one long system
        prompt arriving together, prefill it once (the prefix cache only holds finished rows)."""
        for row in self.waiting:
            prompt = row.tokens + row.pending
            donors = [
                o
                for o in self.waiting
                if len(row.tokens) < len(o.tokens) < len(prompt) and prompt[: len(o.tokens)] == o.tokens
            ]
            if donors:
                donor = max(donors, key=lambda o: len(o.tokens))
                row.cache, row.tokens = copy.deepcopy(donor.cache), list(donor.tokens)
                row.pending = prompt[len(donor.tokens) :]

    def _prefill_alone(self, row: Row) -> None:
        """One chunk of a row's prompt into its own KV cache."""
        n = min(self.prefill_step_size, len(row.pending) - 1)
        self.network(mx.array(row.pending[:n])[None], cache=row.cache)
        assert row.cache is not None  # a waiting row has its own cache
        mx.eval([c.state for c in row.cache])
        row.tokens += row.pending[:n]
        row.pending = row.pending[n:]

    def _prefill_together(self, group: list[Row]) -> list:
        """Merge the rows' own KV caches into a batched one and prefill all but the last token of
        each remaining prompt in one pass, right-padded to the longest (the padding moves to the left
        and is masked, as in `_forward`). Rows in the same state (the `n` choices of one request)
        share one row of that pass, copied out after it. Returns the batched caches, one per layer,
        rows in order."""
        states: dict[tuple, int] = {}
        pick = [states.setdefault(_state(row), len(states)) for row in group]
        unique = [group[pick.index(k)] for k in range(len(states))]
        merged = [type(layer[0]).merge(list(layer)) for layer in zip(*(row.cache for row in unique))]
        chunks = [row.pending[:-1] for row in unique]
        lengths = [len(c) for c in chunks]
        width = max(lengths)
        if width:
            padding = [width - n for n in lengths]
            for c in merged:
                c.prepare(lengths=lengths, right_padding=padding)
            self.network(mx.array([c + [0] * p for c, p in zip(chunks, padding)]), cache=merged)
            for c in merged:
                c.finalize()
            mx.eval([c.state for c in merged])
        if len(unique) < len(group):
            for c in merged:
                c.filter(pick)  # repeated indices copy a row
        for row in group:
            row.tokens += row.pending[:-1]
            row.pending = row.pending[-1:]
        return merged

    def _join(self, rows: list[Row], caches: list) -> None:
        """Rows whose prompt is in `caches` (batched, one per layer, rows in order) join the batch."""
        if self.cache is None:
            self.cache = caches
        else:
            for c, j in zip(self.cache, caches):
                c.extend(j)
        for row in rows:
            self.waiting.remove(row)
            row.cache = None
            row.feed, row.rows = row.pending, 1
            row.pending = []
            self.active.append(row)

    def _forward(self) -> None:
        """One forward pass over every active row's feed, right-padded to the longest; each row's
        logits are the last `rows` positions of its own feed."""
        for row in self.active:
            if row.seq.step is not None:  # not the first pass of a row that just joined
                row.feed, row.rows = row.seq.next_feed()
            row.tokens += row.feed
        lengths = [len(row.feed) for row in self.active]
        width = max(lengths)
        padding = [width - n for n in lengths]
        if any(padding):
            assert self.cache is not None  # rows are active
            for c in self.cache:
                c.prepare(lengths=lengths, right_padding=padding)
        ids = mx.array([row.feed + [0] * p for row, p in zip(self.active, padding)])
        logits = self.network(ids, cache=self.cache)
        if any(padding):  # the padded tail moves to the left padding, masked from later passes
            assert self.cache is not None  # rows are active
            for c in self.cache:
                c.finalize()
        for i, (row, n) in enumerate(zip(self.active, lengths)):
            row.logits = logits[i, n - row.rows : n]
        mx.async_eval([row.logits for row in self.active])
