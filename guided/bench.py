"""Per-token cost of our guided work against raw llguidance calls, measured in the same run.

For each MaskBench schema (`{"schema", "tests": [{"valid", "data"}]}` files, see
shared/data/jsonschemabench/README.md) and each valid instance that our grammar accepts (compact
JSON, schema key order), the instance's tokens are replayed by each variant, interleaved per token
so all see the same machine state:

- raw llguidance: `LLMatcher.unsafe_compute_mask_ptr` into a NumPy buffer + `consume_token`
  (and, as a second figure, with llguidance's NumPy apply);
- ours: `TokenBitmask.fill` (into MLX memory) + `GrammarMatcher.accept_token`, with and without an
  evaluated `apply_token_bitmask` on float32 logits.

Prints figures (microseconds per token: mean, p50, p99); asserts nothing. Run:
`python -m guided.bench TOKENIZER_DIR VOCAB_SIZE [MASKBENCH_FILES...]`.
"""

from __future__ import annotations

import json
import sys
import time

import mlx.core as mx
import numpy as np

from guided.bitmask import TokenBitmask, apply_token_bitmask
from guided.compiler import compile_grammar
from guided.errors import GrammarError
from guided.spec import make_spec


def _percentiles(samples: list[float]) -> dict:
    a = np.array(samples) * 1e6
    return {"mean_us": float(a.mean()), "p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99))}


def mask_overhead(files: list[str], hf_tokenizer, info) -> dict:
    """Per-token timings ({variant: mean/p50/p99 us}) plus schema/instance/token counts, over MaskBench
    `files` with the tokenizer `info`. Variants, run on separate matchers for the same token, in an
    order that rotates per token (the matchers share the engine's lazily built lexer, so whoever
    goes first pays for building it):

    raw: llguidance fill into NumPy + consume_token.
    raw_numpy_apply: raw plus llguidance.numpy.apply_token_bitmask_inplace on float32 NumPy logits
        (llguidance's own CPU apply; its MLX apply is a Metal kernel).
    ours_fill_accept: TokenBitmask.fill (MLX memory) + GrammarMatcher.accept_token.
    ours_fill_apply_accept: the same plus an evaluated apply_token_bitmask on float32 MLX logits.
    """
    from llguidance.numpy import apply_token_bitmask_inplace

    bitmask = TokenBitmask(info.vocab_size)
    raw_buf = np.zeros((1, bitmask.words), np.int32)
    raw_addr, nbytes = raw_buf.ctypes.data, bitmask.words * 4
    logits = mx.random.normal((1, info.vocab_size))
    np_logits = np.array(logits)
    scratch = np_logits.copy()
    mx.eval(apply_token_bitmask(logits, bitmask.current))  # compile the apply once

    def raw(m, t):
        m.unsafe_compute_mask_ptr(raw_addr, nbytes)
        m.consume_token(t)

    def raw_numpy_apply(m, t):
        m.unsafe_compute_mask_ptr(raw_addr, nbytes)
        apply_token_bitmask_inplace(scratch, raw_buf)
        m.consume_token(t)

    def ours(m, t):
        bitmask.fill(m)
        m.accept_token(t)

    def ours_apply(m, t):
        bitmask.fill(m)
        mx.eval(apply_token_bitmask(logits, bitmask.current))
        m.accept_token(t)

    variants = {"raw": raw, "raw_numpy_apply": raw_numpy_apply, "ours_fill_accept": ours,
                "ours_fill_apply_accept": ours_apply}
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    counts = {"schemas": 0, "refused": 0, "instances": 0, "skipped_instances": 0, "tokens": 0}
    for path in files:
        with open(path, encoding="utf-8") as f:
            case = json.load(f)
        try:
            compiled = compile_grammar(make_spec(schema=case["schema"]), info)
        except (GrammarError, ValueError):
            counts["refused"] += 1
            continue
        counts["schemas"] += 1
        for test in case.get("tests", []):
            if not test.get("valid"):
                continue
            text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
            tokens = hf_tokenizer.encode(text, add_special_tokens=False)
            probe = compiled.matcher()
            if not probe.accept_tokens(tokens) or not probe.is_accepting():
                counts["skipped_instances"] += 1  # strict mode, key order, or a string form we do not produce
                continue
            counts["instances"] += 1
            counts["tokens"] += len(tokens)
            matchers = {n: compiled.template.deep_copy() if n.startswith("raw") else compiled.matcher() for n in names}
            for i, t in enumerate(tokens):
                scratch[...] = np_logits
                for n in names[i % 4:] + names[: i % 4]:
                    t0 = time.perf_counter()
                    variants[n](matchers[n], t)
                    times[n].append(time.perf_counter() - t0)
    return {"counts": counts, **{n: _percentiles(v) for n, v in times.items()}}


def apply_cost(vocab_size: int, runs: int = 200) -> dict:
    """Mean microseconds of one evaluated `apply_token_bitmask` at `vocab_size`, per logits dtype."""
    out = {}
    mask = mx.array(np.random.default_rng(0).integers(-(2**31), 2**31, (1, (vocab_size + 31) // 32)).astype(np.int32))
    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        logits = mx.random.normal((1, vocab_size)).astype(dtype)
        mx.eval(apply_token_bitmask(logits, mask))
        t0 = time.perf_counter()
        for _ in range(runs):
            mx.eval(apply_token_bitmask(logits, mask))
        out[str(dtype)] = (time.perf_counter() - t0) / runs * 1e6
    return out


def main(argv: list[str]) -> None:
    from transformers import AutoTokenizer

    from guided.tokenizer_info import get_tokenizer_info

    hf = AutoTokenizer.from_pretrained(argv[0])
    info = get_tokenizer_info(hf, int(argv[1]), [hf.eos_token_id])
    print(json.dumps({"mask": mask_overhead(argv[2:], hf, info), "apply_us": apply_cost(int(argv[1]))}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
