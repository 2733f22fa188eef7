"""`GrammarMatcher`: one generation's grammar state over llguidance's `LLMatcher`.

The engine never raises for grammar-level problems: a rejected token or a limit hit puts the matcher
in an error state it never leaves (`error` then says why). Methods here return False in that case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from llguidance import LLMatcher

if TYPE_CHECKING:
    from guided.tokenizer_info import TokenizerInfo

class GrammarMatcher:
    """The grammar state of one generation. Not thread-safe; make one per generation.

    Token ids are ints in [0, vocab_size). Bitmask rows are int32 words, ceil(vocab_size / 32) per
    row, token i allowed iff bit i % 32 of word i // 32 is set (LSB first).
    """

    def __init__(self, template: LLMatcher, tokenizer: "TokenizerInfo"):
        self._template = template  # the compiled grammar's start state, shared and never advanced
        self._m = template.deep_copy()
        self.tokenizer = tokenizer
        self.words = (tokenizer.vocab_size + 31) // 32
        self.num_accepted = 0  # tokens that rollback can remove

    def accept_token(self, token: int) -> bool:
        """Advance by one token. False (and error state) if the grammar does not allow it."""
        ok = self._m.consume_token(token)
        self.num_accepted += ok
        return ok

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by several tokens; False (and error state) at the first one not allowed."""
        n = self._m.try_consume_tokens(tokens)
        self.num_accepted += n
        if n < len(tokens):
            return self._m.consume_token(tokens[n])  # puts the matcher in its error state, with the reason
        return True

    def fill_bitmask_at(self, address: int, nbytes: int) -> None:
        """Write the next-token mask (one row, `nbytes == 4 * words`) at a raw address. Drops the GIL."""
        self._m.unsafe_compute_mask_ptr(address, nbytes)

    def fill_next_token_bitmask(self, bitmask: np.ndarray, row: int = 0) -> None:
        """Write the next-token mask into row `row` of `bitmask` (np.ndarray int32 [batch, words], C-contiguous).

        Raises ValueError for a wrong dtype, shape or layout.
        """
        if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[1] != self.words or not bitmask.flags.c_contiguous:
            raise ValueError(f"bitmask must be C-contiguous int32 [batch, {self.words}], got {bitmask.dtype} {bitmask.shape}")
        self.fill_bitmask_at(bitmask.ctypes.data + row * self.words * 4, self.words * 4)

    def is_accepting(self) -> bool:
        """True if the text so far is a complete match (EOS would be allowed now)."""
        return self._m.is_accepting()

    def is_terminated(self) -> bool:
        """True if no further token but EOS can be accepted (complete, or in an error state)."""
        return self._m.is_stopped()

    def jump_forward_tokens(self) -> list[int]:
        """Tokens the grammar forces from here (canonical tokenization); does not change the state."""
        return self._m.compute_ff_tokens()

    def jump_forward_string(self) -> str:
        """Text the grammar forces from here (may end mid-token); does not change the state."""
        return self._m.compute_ff_bytes().decode("utf-8", errors="replace")

    def rollback(self, n: int) -> bool:
        """Undo the last `n` accepted tokens (any number up to all of them). False if n is more than
        were accepted (the state is left unchanged then)."""
        if not 0 <= n <= self.num_accepted:
            return False
        ok = self._m.rollback(n)
        self.num_accepted -= n
        return ok

    def reset(self) -> None:
        """Back to the grammar's start, also from a finished or error state (LLMatcher.reset keeps an
        error, so this takes a fresh copy of the start state: microseconds)."""
        self._m = self._template.deep_copy()
        self.num_accepted = 0

    @property
    def error(self) -> str:
        """The engine's error message, or "" when not in an error state."""
        # Non-verbose limits (see compiler.default_limits) leave a "<non-verbose/>" marker in messages.
        return self._m.get_error().replace("<non-verbose/>", "").strip()
