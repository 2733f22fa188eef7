"""Draft sources for speculative decoding (the `Drafter` protocol of `runtime.strategy`).

- `PromptLookup`: the longest suffix of the prompt and output so far that occurred before in them
  (a suffix automaton), and the tokens that followed its most recent occurrence are the draft
  (prompt lookup decoding, Saxena 2023, without its fixed n-gram; vLLM's `ngram` speculator;
  SuffixDecoding). No extra model; pays where the output copies its input (extraction, tool calls,
  code edits).
- `runtime.value_lookup.ValueLookup` (`"prompt_lookup"`): `PromptLookup` with text-level drafts
  where a JSON string value starts (a field label in the prompt, the value so far found in it).
- `DraftModel`: a smaller model sharing the target's tokenizer decodes greedily ahead (as mlx-lm's
  `speculative_generate_step`), with its own KV cache kept in step with the accepted tokens.

Verification (and with it exactness) is the strategy's (`runtime.sampling`); a drafter only guesses.
`runtime.drafters.make_drafter` makes the drafter of a request's `speculative` option.
"""

from __future__ import annotations

from collections import deque
from typing import cast

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from runtime.attention import engine
from runtime.errors import InputError


class PromptLookup:
    """Drafts the continuation of the longest suffix of the context that occurred before in it.

    A suffix automaton (Blumer et al. 1985; the structure of SuffixDecoding, Oliaro et al. 2024,
    arXiv:2411.04975) indexes all but the last token of the context: built once when a generation
    starts (the prompt, O(len) time and memory), extended by each new token (amortized O(1)); the
    last `UNDO` tokens can be taken out again (a draft context that was not kept, a rollback), and
    it is rebuilt only when the context leaves what it indexed further back (another generation).
    The draft is what followed the most recent occurrence of the longest matching suffix: up to `n`
    tokens, so a copied 20-token span is drafted whole, not 3 tokens at a time.

    max_ngram: the longest suffix matched (None: any length; a shorter match is searched among more
    occurrences, so the most recent one may differ). min_ngram: the shortest match worth drafting
    from. Raises ValueError unless 1 <= min_ngram <= max_ngram. Not thread-safe; one per generation
    (the server's engine and `Model.generate` make one per request).
    """

    # The most recent end position is kept exact along at most this many suffix links per new
    # token (the link path is as long as the repeats at the end of the text; a repetitive text
    # could make it long); past it a state keeps an older occurrence, still a true one.
    RECENCY_DEPTH = 64
    # Tokens whose indexing can be undone: a speculative context (a chained draft) or a short
    # rollback costs their undo, not a rebuild of the whole index.
    UNDO = 128

    def __init__(self, max_ngram: int | None = None, min_ngram: int = 1):
        if not 1 <= min_ngram <= (max_ngram or min_ngram):
            raise InputError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._reset()

    def _reset(self) -> None:
        self.tokens: list[int] = []  # what the automaton indexes: the context but its last token
        self.next: list[dict[int, int]] = [{}]  # state -> {token: state}; state 0 is the empty string
        self.link: list[int] = [-1]  # suffix links
        self.length: list[int] = [0]  # the longest string of each state (tokens)
        self.last_end: list[int] = [-1]  # the most recent end position of its strings in `tokens`
        self.last = 0  # the state of all of `tokens`
        # Per indexed token (the last UNDO): (states before, last before, changed entries' old values)
        self.journal: deque[tuple[int, int, list[tuple]]] = deque(maxlen=self.UNDO)

    def _extend(self, token: int) -> None:
        """Append `token` to the index (the standard online construction), journaling what changed."""
        nxt, link, length, last_end = self.next, self.link, self.length, self.last_end
        pos = len(self.tokens)
        undo: list[tuple] = []  # (list, index, key or None, old value or None)
        self.journal.append((len(length), self.last, undo))
        self.tokens.append(token)
        cur = len(length)
        nxt.append({})
        link.append(0)
        length.append(length[self.last] + 1)
        last_end.append(pos)
        p = self.last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            undo.append((nxt, p, token, None))
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                last_end.append(last_end[q])
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = clone
                    undo.append((nxt, p, token, q))
                    p = link[p]
                undo.append((link, q, None, link[q]))
                link[q] = link[cur] = clone
        self.last = cur
        s, depth = link[cur], 0  # every suffix of the text now also ends at pos
        while s > 0 and depth < self.RECENCY_DEPTH:
            undo.append((last_end, s, None, last_end[s]))
            last_end[s], s, depth = pos, link[s], depth + 1

    def _undo(self) -> None:
        """Take the last indexed token out of the index (exactly the state before its `_extend`)."""
        states, last, undo = self.journal.pop()
        for table, i, key, old in reversed(undo):
            if key is None:
                table[i] = old
            elif old is None:
                del table[i][key]
            else:
                table[i][key] = old
        for table in (self.next, self.link, self.length, self.last_end):
            del table[states:]
        self.tokens.pop()
        self.last = last

    def _sync(self, context: list[int]) -> None:
        """Index `context[:-1]`: extend the automaton where the context grew from what it indexed,
        after undoing the tokens it indexed past their common prefix (a rejected draft, a rollback)
        when the journal holds them; else rebuild it."""
        m, want = len(self.tokens), len(context) - 1
        if want < m or context[:m] != self.tokens:
            keep = m - len(self.journal)  # the tokens that cannot be undone must be common
            if keep < 0 or keep > want or context[:keep] != self.tokens[:keep]:
                self._reset()
            else:
                common = keep
                while common < min(m, want) and context[common] == self.tokens[common]:
                    common += 1
                for _ in range(m - common):
                    self._undo()
        for token in context[len(self.tokens) : -1]:
            self._extend(token)

    def match(self, context: list[int]) -> tuple[int, int]:
        """(length, end): the longest suffix of `context` (at most max_ngram tokens) that occurred
        earlier in it, and the index in `context` of the last token of its most recent earlier
        occurrence; (0, -1) when even the last token is new or the match is under min_ngram."""
        if len(context) < 2:
            return 0, -1
        self._sync(context)
        # The longest suffix of the context occurring in context[:-1]: the longest suffix of
        # context[:-1] followed there by the last token, plus that token.
        token, p = context[-1], self.last
        while p != -1 and token not in self.next[p]:
            p = self.link[p]
        if p == -1:
            return 0, -1
        match, state = self.length[p] + 1, self.next[p][token]
        if self.max_ngram is not None and match > self.max_ngram:
            while self.length[self.link[state]] >= self.max_ngram:  # the state holding that suffix
                state = self.link[state]
            match = self.max_ngram
        if match < self.min_ngram:
            return 0, -1
        return match, self.last_end[state]

    def propose(self, context: list[int], n: int) -> list[int]:
        if n < 1:
            return []
        match, end = self.match(context)
        return context[end + 1 : end + 1 + n] if match else []


class DraftModel:
    """Drafts with a smaller model decoding greedily. `model`: a `runtime.Model` whose tokenizer is
    the target's (same ids). Raises ValueError if its KV cache cannot be trimmed (rollback needs it).
    Not thread-safe; one per generation (its KV cache follows one context)."""

    def __init__(self, model):
        self.model = model
        self.cache = make_prompt_cache(model.network)
        if not can_trim_prompt_cache(self.cache):
            raise InputError(f"the draft model {model.name} has a KV cache that cannot be trimmed")
        self.tokens: list[int] = []  # what the draft's KV cache holds

    def propose(self, context: list[int], n: int) -> list[int]:
        if n < 1:
            return []
        common = 0
        for a, b in zip(self.tokens, context, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # feed at least one token to get logits
        trim_prompt_cache(self.cache, len(self.tokens) - common)
        feed = context[common:]
        self.tokens = list(context)
        draft: list[int] = []
        for _ in range(n):
            with engine():
                logits = self.model.network(mx.array(feed)[None], cache=self.cache)[0, -1]
            token = int(cast(int, mx.argmax(logits).item()))
            draft.append(token)
            feed = [token]
            self.tokens.append(token)
        # The last draft token was never fed: the cache holds context + draft[:-1].
        self.tokens.pop()
        return draft
