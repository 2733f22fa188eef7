"""Attention at long context on MLX's CPU backend, with the softmax in NumPy.

MLX has no fused attention kernel on the CPU: `mx.fast.scaled_dot_product_attention` runs as its
composed fallback (scores matmul, softmax, values matmul), and there the softmax's `exp` is scalar
and single-threaded: ~14 ns an element, against ~1 ns for NumPy's vectorised one on the same core.
At a 16,384-token context the softmax is ~95 % of a prefill chunk's attention and prefill falls to
~15 tok/s (`python -m benchmarks.attention_split`, docs/reports/performance.md). Here the matmuls stay
in MLX (BLAS) and the softmax runs in NumPy, its rows split over the usable cores (NumPy's ufuncs
release the GIL), normalised after the values matmul ((e @ V) / sum(e): a [.., L, D] divide).

It is used only where it pays and only for this engine's own passes: on the CPU device, float32,
no attention sinks, an unquantized KV cache, at least `LONG_CONTEXT` keys and `MIN_QUERIES` queries
(the NumPy step evaluates the graph up to the scores: fine inside a prefill chunk, which is
evaluated anyway), and inside `engine()`. mlx-lm's own generation in the same process, Metal and
short contexts keep MLX's fused call unchanged, bit for bit.

Guards keep a wrong result impossible rather than unlikely; each falls back to mlx-lm's own
call (the fused one), which is always correct:
- `COREAI_CPU_ATTENTION=0` (or false, off, no) turns the route off: `install` rebinds nothing and an
  already installed route takes the fused call (read at install and at every call).
- `install` compares the signature of `mlx_lm.models.base.scaled_dot_product_attention` with the
  router's; a new mlx-lm whose function differs keeps its own in every module, with one warning.
- The softmax is written into the scores only when NumPy's view of them is MLX's own buffer:
  float32, their shape, C-contiguous, writable, and a probe written through the view is read back
  by MLX (the check `guided.bitmask.TokenBitmask` makes of its buffers). Otherwise the fused call.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache

import mlx.core as mx
import numpy as np

log = logging.getLogger("coreai.attention")

SWITCH = "COREAI_CPU_ATTENTION"  # 0, false, off or no: MLX's fused call everywhere
LONG_CONTEXT = 1024  # keys; below it the softmax is a small part of the pass and the fused call stays
MIN_QUERIES = 16  # a decode step (1 query a row) keeps the fused call: no evaluation mid-graph
_ENGINE: ContextVar[bool] = ContextVar("coreai_attention_engine", default=False)


@contextmanager
def engine() -> Iterator[None]:
    """The runtime's forward passes: a patched model's attention calls inside take `attention`
    where `applies` says so."""
    token = _ENGINE.set(True)
    try:
        yield
    finally:
        _ENGINE.reset(token)


def enabled() -> bool:
    """False when the environment variable `COREAI_CPU_ATTENTION` is 0, false, off or no (any case):
    then nothing is installed and every attention call is mlx-lm's. True when unset or anything else."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


@cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="coreai-softmax")


def _additive_mask(mask: mx.array | str | None, kv_heads: int, query_len: int, key_len: int):
    """`mask` as an additive float32 array broadcastable to [B, Hkv, group, L, S], or None; a masked
    key of a bool mask adds float32's lowest value, as MLX's fallback fills it (so a row with every
    key masked attends to all alike). As large as the mask, not as the scores."""
    if mask is None:
        return None
    if isinstance(mask, str):  # "causal": query i sits at position S - L + i (MLX's alignment)
        mask = mx.arange(key_len - query_len, key_len)[:, None] >= mx.arange(key_len)[None]
    if mask.dtype == mx.bool_:
        mask = mx.where(mask, mx.array(0.0, mx.float32), mx.array(mx.finfo(mx.float32).min, mx.float32))
    else:  # the scores' dtype (NumPy has no bfloat16)
        mask = mask.astype(mx.float32)
    while mask.ndim < 4:
        mask = mask[None]
    b, h, rows, keys = mask.shape
    if h == 1:
        return mask[:, :, None]
    return mask.reshape(b, kv_heads, h // kv_heads, rows, keys)


def _as_numpy(array: mx.array) -> np.ndarray:
    """NumPy's view of an evaluated MLX array (the buffer protocol: no copy in MLX 0.32)."""
    return np.asarray(array)


def _unsafe_to_write(array: mx.array, view: np.ndarray) -> str | None:
    """Why writing into `view` in place would not change `array` (evaluated, float32) as intended,
    or None when it would: `view` must be a float32 ndarray of `array`'s shape, C-contiguous (so a
    row split is rows of the buffer) and writable, and a probe written into its first element must
    be read back by MLX (then it is `array`'s own storage, not a copy). The element is restored."""
    if not isinstance(view, np.ndarray) or view.dtype != np.float32 or view.shape != tuple(array.shape):
        return "NumPy's view of the scores is not a float32 array of their shape"
    if not view.flags.c_contiguous or not view.flags.writeable:
        return "NumPy's view of the scores is not C-contiguous and writable"
    first = (0,) * view.ndim
    kept = view[first].copy()
    probe = np.float32(0.5 if kept != 0.5 else -0.5)
    view[first] = probe
    seen = array[first].item() == probe
    view[first] = kept
    return None if seen else "a write into NumPy's view of the scores is not seen by MLX (a copy)"


def _exp_rows(scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """In place: scores [.., Lp, S] become exp(scores + mask - row max); returns the row sums [.., Lp, 1]."""
    if mask is not None:
        np.add(scores, mask, out=scores)
    np.subtract(scores, scores.max(axis=-1, keepdims=True), out=scores)
    np.exp(scores, out=scores)
    return scores.sum(axis=-1, keepdims=True)


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask=None) -> mx.array:
    """What `mx.fast.scaled_dot_product_attention(queries, keys, values, scale=, mask=)` computes, by
    the module docstring's method. queries [B, Hq, L, D], keys [B, Hkv, S, D] and values [B, Hkv,
    S, Dv] (Hq a multiple of Hkv; Dv may differ from D, as in MLA models), float32; mask None,
    "causal", or a bool (True attends) or additive array broadcastable to [B, Hq, L, S]. Evaluates
    the graph up to the scores. Returns [B, Hq, L, Dv] float32: the fused call's own result, with
    one warning, when NumPy's view of the scores is not MLX's writable buffer (`_unsafe_to_write`)."""
    b, heads, length, dim = queries.shape
    kv_heads, key_len = keys.shape[1], keys.shape[2]
    q = (queries * scale).reshape(b, kv_heads, heads // kv_heads, length, dim)
    scores = q @ keys[:, :, None].swapaxes(-1, -2)  # [B, Hkv, G, L, S], a fresh buffer
    additive = _additive_mask(mask, kv_heads, length, key_len)
    mx.eval(scores) if additive is None else mx.eval(scores, additive)
    # NumPy shares the evaluated buffer and the softmax is written into it, as MLX's NumPy
    # interop documents: no copy of the [.., L, S] scores either way. Checked, never assumed.
    s = _as_numpy(scores)
    unsafe = _unsafe_to_write(scores, s)
    if unsafe is not None:
        _warn_once(f"runtime.attention: {unsafe}; the softmax is left to MLX's fused attention call")
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
    m = None if additive is None else np.broadcast_to(np.array(additive, copy=False), s.shape)
    parts = min(_cores(), length)
    bounds = [length * i // parts for i in range(parts + 1)]
    cuts = [np.s_[..., lo:hi, :] for lo, hi in zip(bounds, bounds[1:], strict=False)]
    sums = _pool(parts).map(lambda cut: _exp_rows(s[cut], None if m is None else m[cut]), cuts)
    total = mx.array(np.concatenate(list(sums), axis=-2))
    return ((scores @ values[:, :, None]) / total).reshape(b, heads, length, values.shape[-1])


def applies(queries: mx.array, keys: mx.array, cache, sinks) -> bool:
    """Whether a model's attention call takes `attention`: see the module docstring."""
    return (
        _ENGINE.get()
        and enabled()
        and not hasattr(cache, "bits")  # mlx-lm's quantized KV cache (keys a tuple) has its own attention
        and keys.shape[-2] >= LONG_CONTEXT
        and queries.shape[-2] >= MIN_QUERIES
        and sinks is None
        and queries.dtype == mx.float32
        and mx.default_device() == mx.cpu
    )


def _route(stock):
    """The router rebound in mlx-lm's model modules: `attention` where `applies`, else `stock`.
    Its parameters are the ones `install` requires of mlx-lm's function."""

    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if applies(queries, keys, cache, sinks):
            return attention(queries, keys, values, scale, mask)
        return stock(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

    return scaled_dot_product_attention


def _parameters(function) -> list[str]:
    """`function`'s parameters as written (name, `*`/`**`, `=default`; no annotations), a `*`
    entry before the keyword-only ones. Raises ValueError or TypeError when they cannot be read."""
    params = inspect.signature(function).parameters.values()
    plain = [str(p.replace(annotation=inspect.Parameter.empty)) for p in params]
    kinds = [p.kind for p in params]
    if inspect.Parameter.KEYWORD_ONLY in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds:
        plain.insert(kinds.index(inspect.Parameter.KEYWORD_ONLY), "*")
    return plain


def _difference(stock, router) -> str | None:
    """None when `stock` takes exactly `router`'s parameters (names, order, kinds, defaults;
    annotations aside), else a sentence naming the difference."""
    want = _parameters(router)
    try:
        have = _parameters(stock)
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be read ({exc})"
    if have == want:
        return None
    new = [p for p in have if p not in want]
    gone = [p for p in want if p not in have]
    what = "; ".join(
        part for part in (new and "new: " + ", ".join(new), gone and "missing: " + ", ".join(gone)) if part
    )
    return f"({', '.join(have)}) where ({', '.join(want)}) is expected: {what or 'the order differs'}"


def install() -> int:
    """Route the attention of every imported mlx-lm model module through `applies` / `attention`
    (mlx-lm's models call `mlx_lm.models.base.scaled_dot_product_attention`, bound by name at
    import). Idempotent; call after the model's module is imported (at load). Returns the number of
    modules patched by this call: 0 as well when `enabled()` is False, or when mlx-lm's function
    does not take the router's parameters (a new mlx-lm): then the modules keep it, and one warning
    (logger `coreai.attention`) names the difference. Raises nothing."""
    if not enabled():
        return 0
    from mlx_lm.models import base

    stock = base.scaled_dot_product_attention
    scaled_dot_product_attention = _route(stock)
    difference = _difference(stock, scaled_dot_product_attention)
    if difference is not None:
        _warn_once(
            f"runtime.attention not installed: mlx_lm.models.base.scaled_dot_product_attention takes "
            f"{difference}; MLX's fused attention call is used everywhere"
        )
        return 0
    patched = 0
    for name, module in list(sys.modules.items()):
        if name.startswith("mlx_lm.models.") and module is not base:
            if getattr(module, "scaled_dot_product_attention", None) is stock:
                module.__dict__["scaled_dot_product_attention"] = scaled_dot_product_attention
                patched += 1
    return patched
