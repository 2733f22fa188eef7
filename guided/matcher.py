"""`GrammarMatcher`: one generation's grammar state over llguidance's `LLMatcher`.

The engine never raises for grammar-level problems: a rejected token or a limit hit puts the matcher
in an error state it never leaves (`error` then says why). Methods here return False in that case.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np
from llguidance import LLMatcher

from runtime.errors import InputError

if TYPE_CHECKING:
    from guided.tokenizer_info import TokenizerInfo


class GrammarMatcher:
    """The grammar state of one generation. Not thread-safe; make one per generation.

    Token ids are ints in [0, vocab_size). Bitmask rows are int32 words, ceil(vocab_size / 32) per
    row, token i allowed iff bit i % 32 of word i // 32 is set (LSB first).
    """

    def __init__(self, template: LLMatcher, tokenizer: TokenizerInfo):
        self._template = template  # the compiled grammar's start state, shared and never advanced
        self._m = template.deep_copy()
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_ids)
        self.words = (tokenizer.vocab_size + 31) // 32
        self.num_accepted = 0  # tokens that rollback can remove, the final EOS included
        # llguidance 1.9.1 accepts EOS without counting it for rollback (rollback(1) then undoes the
        # token before it) and ignores tokens after it, so the final EOS is tracked here.
        self._ended = False
        self._error = ""

    def accept_token(self, token: int) -> bool:
        """Advance by one token. False (and error state) if the grammar does not allow it: a token
        outside the grammar, EOS where the grammar cannot end, or any token after EOS."""
        if self._ended:
            self._error = f"token {token} after the end of the grammar (EOS was accepted)"
            return False
        if token in self.eos_ids and self._m.is_accepting() and not self._m.is_error():
            self._ended = True
            self.num_accepted += 1
            return True
        ok = self._m.consume_token(token)
        self.num_accepted += ok
        return ok

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by several tokens; False (and error state) at the first one not allowed."""
        return all(self.accept_token(t) for t in tokens)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the grammar allows from here, EOS excluded (a draft never
        ends the output); does not change the state."""
        end = next((i for i, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
        if self._ended or not end:
            return 0
        return self._m.validate_tokens(tokens[:end])

    def fill_bitmask_at(self, address: int, nbytes: int) -> None:
        """Write the next-token mask (one row, `nbytes == 4 * words`) at a raw address. Drops the GIL.
        After the final EOS or a token refused after it, only EOS is allowed."""
        if not (self._ended or self._error):
            self._m.unsafe_compute_mask_ptr(address, nbytes)
            return
        row = np.ctypeslib.as_array((ctypes.c_uint32 * (nbytes // 4)).from_address(address))
        row[:] = 0
        for t in self.eos_ids:
            row[t // 32] |= np.uint32(1 << (t % 32))

    def fill_next_token_bitmask(self, bitmask: np.ndarray, row: int = 0) -> None:
        """Write the next-token mask into row `row` of `bitmask` (np.ndarray int32 [batch, words], C-contiguous).

        Raises ValueError for a wrong dtype, shape or layout.
        """
        if (
            bitmask.dtype != np.int32
            or bitmask.ndim != 2
            or bitmask.shape[1] != self.words
            or not bitmask.flags.c_contiguous
        ):
            raise InputError(
                f"bitmask must be C-contiguous int32 [batch, {self.words}], got {bitmask.dtype} {bitmask.shape}"
            )
        self.fill_bitmask_at(bitmask.ctypes.data + row * self.words * 4, self.words * 4)

    def is_accepting(self) -> bool:
        """True if the text so far is a complete match (EOS would be allowed now, or was accepted)."""
        return not self.error and (self._ended or self._m.is_accepting())

    def is_terminated(self) -> bool:
        """True if no further token but EOS can be accepted (complete, EOS accepted, or an error state)."""
        return self._ended or bool(self._error) or self._m.is_stopped()

    def jump_forward_tokens(self) -> list[int]:
        """Tokens the grammar forces from here (canonical tokenization); does not change the state."""
        return self._m.compute_ff_tokens()

    def jump_forward_string(self) -> str:
        """Text the grammar forces from here (may end mid-token); does not change the state."""
        return self._m.compute_ff_bytes().decode("utf-8", errors="replace")

    def captures(self) -> list[tuple[str, bytes]]:
        """The grammar's captures so far, in order: (rule name, the exact bytes it matched), one per
        completed `name[capture]` rule. A rollback does not remove them: read them from a matcher
        fed only final tokens."""
        return self._m.get_captures()

    def rollback(self, n: int) -> bool:
        """Undo the last `n` accepted tokens (any number up to all of them, the final EOS first).
        False, with the state unchanged, if n is more than were accepted or the matcher is in an
        error state (use `reset`)."""
        if not 0 <= n <= self.num_accepted or self.error:
            return False
        if n and self._ended:
            self._ended = False
            self.num_accepted -= 1
            n -= 1
        if n and not self._m.rollback(n):
            return False
        self.num_accepted -= n
        return True

    def reset(self) -> None:
        """Back to the grammar's start, also from a finished or error state (LLMatcher.reset keeps an
        error, so this takes a fresh copy of the start state: microseconds)."""
        self._m = self._template.deep_copy()
        self.num_accepted = 0
        self._ended = False
        self._error = ""

    @property
    def error(self) -> str:
        """The engine's error message, or "" when not in an error state."""
        # Non-verbose limits (see compiler.default_limits) leave a "<non-verbose/>" marker in messages.
        return self._error or self._m.get_error().replace("<non-verbose/>", "").strip()
