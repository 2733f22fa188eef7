"""Token bitmasks in MLX memory, written in place by the grammar engine, applied with compiled MLX ops.

Layout (the same as llguidance and xgrammar): int32 words, ceil(V / 32) per row, token i allowed iff
bit i % 32 of word i // 32 is 1 (LSB first). V is the model's logit width.

How the engine writes into an `mx.array` without a copy: MLX arrays support the buffer protocol, and
`np.asarray(evaluated_mx_array)` is a writable NumPy view of the array's own storage (CPU memory on
Linux, unified memory visible to Metal on Apple silicon). The engine writes through the view's
address (`LLMatcher.unsafe_compute_mask_ptr`); `TokenBitmask.__init__` verifies that a write through
the view is seen by MLX, so a future MLX that copied instead would fail loudly, not silently.
The buffers are allocated once; MLX cannot donate (reuse) them for op outputs because this object
keeps a reference. Two buffers alternate, so filling the next mask never overwrites one that a lazy
MLX computation may still read.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from runtime.errors import InputError


@mx.compile
def _apply(logits: mx.array, bitmask: mx.array) -> mx.array:
    bits = (bitmask[..., None] >> mx.arange(32, dtype=mx.int32)) & 1  # [batch, words, 32], LSB first
    allowed = bits.reshape(bitmask.shape[0], -1)[:, : logits.shape[-1]]
    return mx.where(allowed.astype(mx.bool_), logits, -float("inf"))


def apply_token_bitmask(logits: mx.array, bitmask: mx.array) -> mx.array:
    """Set disallowed logits to -inf.

    logits: mx.array [batch, V] float32, float16 or bfloat16 (or [V]).
    bitmask: mx.array [batch, ceil(V / 32)] int32 (or [words]).
    Returns a new array of the logits' shape and dtype. Raises ValueError when the widths do not match.
    """
    squeeze = logits.ndim == 1
    if squeeze:
        logits = logits[None]
    if bitmask.ndim == 1:
        bitmask = bitmask[None]
    if bitmask.shape[-1] != (logits.shape[-1] + 31) // 32 or bitmask.shape[0] != logits.shape[0]:
        raise InputError(
            f"bitmask {tuple(bitmask.shape)} does not fit logits {tuple(logits.shape)}: "
            f"need [batch, ceil(V / 32)] int32"
        )
    out = _apply(logits, bitmask)
    return out[0] if squeeze else out


class TokenBitmask:
    """Double-buffered bitmasks for one session: `batch` rows of `words = ceil(vocab_size / 32)` int32.

    `fill(matcher, row)` lets the matcher write its mask into row `row`; filling row 0 starts a new
    mask and switches to the other buffer first, so rows 0..n of one step are filled in order.
    `current` is the buffer last filled (mx.array [batch, words] int32). Allocated once; no per-token
    allocation or copy. Raises RuntimeError at construction if MLX does not share its buffer.
    """

    def __init__(self, vocab_size: int, batch: int = 1, buffers: int = 2):
        self.vocab_size = vocab_size
        self.batch = batch
        self.words = (vocab_size + 31) // 32
        # From NumPy, so each buffer has its own contiguous storage (mx.zeros may be a broadcast scalar).
        self.arrays = [mx.array(np.zeros((batch, self.words), np.int32)) for _ in range(buffers)]
        mx.eval(self.arrays)
        self.views = [np.asarray(a) for a in self.arrays]
        for array, view in zip(self.arrays, self.views, strict=False):
            view[0, 0] = -1
            if array[0, 0].item() != -1 or not view.flags.writeable:
                raise RuntimeError("MLX did not expose a writable view of its buffer; cannot fill masks in place")
            view[0, 0] = 0
        self.addresses = [view.ctypes.data for view in self.views]
        self.index = 0

    @property
    def current(self) -> mx.array:
        return self.arrays[self.index]

    def fill(self, matcher, row: int = 0) -> mx.array:
        """Fill row `row` from `matcher` (a `GrammarMatcher`), in the next buffer when `row` is 0;
        return that buffer. Raises IndexError for a row outside [0, batch)."""
        if not 0 <= row < self.batch:
            raise IndexError(f"row {row} outside this bitmask's {self.batch} rows")
        if row == 0:
            self.index = (self.index + 1) % len(self.arrays)
        matcher.fill_bitmask_at(self.addresses[self.index] + row * self.words * 4, self.words * 4)
        return self.arrays[self.index]

    def allow(self, row: int, token: int) -> None:
        """Also allow `token` in row `row` of the buffer last filled (before it is applied)."""
        view = self.views[self.index].view(np.uint32)
        view[row, token // 32] |= np.uint32(1 << (token % 32))

    def apply(self, logits: mx.array) -> mx.array:
        """`apply_token_bitmask(logits, current)` for logits [rows, V] or [V]: the first rows of `current`."""
        rows = 1 if logits.ndim == 1 else logits.shape[0]
        return apply_token_bitmask(logits, self.current[:rows] if rows < self.batch else self.current)
