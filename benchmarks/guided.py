"""`make bench`: guided-generation cost side by side with the raw engine and with peers, in one run.

- Per-token mask bench on MaskBench valid instances (a deterministic sample: the first N files of each
  subset), with the Qwen (151,936) and Gemma 3 (262,144) vocabularies: mean / p50 / p99 / max of our
  fill (`TokenBitmask.fill`, into MLX memory), apply (`apply_token_bitmask`, evaluated, float32) and
  accept (`GrammarMatcher.accept_token`), against raw llguidance calls (`unsafe_compute_mask_ptr` into
  NumPy, `consume_token`) on the same tokens, interleaved token by token (the order rotates).
- Compile time p50 / p99: ours cold (`make_spec` + `compile_grammar`), ours from the `GrammarCache`,
  raw llguidance (`grammar_from_json_schema` + `LLMatcher` + first mask).
- Peers on the same schemas and token sequences (the `bench` extra): xgrammar (compact separators,
  strict mode, no compile cache, one thread) and outlines-core (regex from the schema, `Index`,
  `Guide.write_mask_into`), each in a child process with a per-schema watchdog, so a compile that
  takes minutes is recorded as a timeout instead of stalling the run. Failures are findings.
- End to end on the real Qwen2.5-Coder-0.5B (float32, CPU backend here), `benchmarks.generation.run_guided_bench`:
  unconstrained vs constrained decode tok/s, jump-forward on vs off (forward passes, tok/s), TTFT with a
  cold compile, same prompts, greedy, interleaved; beside it the peers driving mlx-lm with a logits
  processor (xgrammar, outlines-core, llguidance.mlx, Outlines' `from_mlxlm`), validity by jsonschema.
- Speculative decoding (prompt lookup) on the `benchmarks/cases` prompts (the demo's fly_to call, an
  invoice extraction, free prose): guided with and without speculation (jump-forward on in both),
  unconstrained ours and mlx-lm, interleaved, medians; forward passes, drafted / accepted tokens, and
  whether the greedy outputs with and without speculation are identical. Written to
  `benchmarks/results/speculative.{json,md}`.

    python -m benchmarks.guided                     # the full run (make bench)
    python -m benchmarks.guided --speculative-only  # only the speculative part (about 25 min here)
    python -m benchmarks.guided --quick             # seconds: what tests/test_bench_smoke.py runs
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import time
import traceback
from pathlib import Path

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
import mlx.core as mx
import numpy as np

from conformance.common import MASKBENCH, REPO, machine, md_table, serialize
from conformance.suite import maskbench_subset

RESULTS = REPO / "benchmarks" / "results"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _stats(samples, scale: float) -> dict:
    if not len(samples):
        return {"n": 0}
    a = np.asarray(samples, dtype=np.float64) * scale
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def stats_us(samples) -> dict:
    """Summary of durations in seconds, in microseconds."""
    return _stats(samples, 1e6)


def stats_ms(samples) -> dict:
    """Summary of durations in seconds, in milliseconds."""
    return _stats(samples, 1e3)


def load_vocab(name: str):
    """(hf tokenizer, TokenizerInfo, eos ids) of the real Qwen or Gemma tokenizer."""
    from coreai import store
    from guided import get_tokenizer_info
    from runtime import Tokenizer

    folder = store.ensure({"qwen": "qwen2.5-coder-0.5b-instruct", "gemma": "gemma-3-270m"}[name])
    config = json.loads((folder / "config.json").read_text())
    tok = Tokenizer(folder, config)
    return tok.hf, get_tokenizer_info(tok.hf, config["vocab_size"], tok.eos_ids), sorted(tok.eos_ids)


def pick_files(per_subset: int) -> list[Path]:
    seen: dict[str, int] = {}
    out = []
    for p in sorted(MASKBENCH.rglob("*.json")):
        sub = maskbench_subset(p.name)
        if seen.get(sub, 0) < per_subset:
            seen[sub] = seen.get(sub, 0) + 1
            out.append(p)
    return out


# -- ours vs raw llguidance ---------------------------------------------------------------------------

RAW_OVERRIDES = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def cold_compile(schema, info):
    """Our cold compile: (CompiledGrammar, make_spec seconds, compile_grammar seconds), with make_spec's
    schema -> spec memo (guided.spec.json_spec, an lru_cache) cleared first and no GrammarCache.
    Raises as make_spec / compile_grammar."""
    from guided import compile_grammar, make_spec
    from guided.spec import json_spec

    json_spec.cache_clear()
    t0 = time.perf_counter()
    spec = make_spec(schema=schema)
    t1 = time.perf_counter()
    compiled = compile_grammar(spec, info)
    return compiled, t1 - t0, time.perf_counter() - t1


def raw_compile(schema, info, address: int, nbytes: int):
    """Raw llguidance compile, as a caller without our layer does it: schema -> grammar (compact
    separators) -> `LLMatcher` -> first mask written at `address` (`nbytes` = 4 * words). Returns the matcher."""
    from llguidance import LLMatcher

    from guided.compiler import default_limits

    m = LLMatcher(
        info.ll_tokenizer,
        LLMatcher.grammar_from_json_schema(schema, overrides=RAW_OVERRIDES),
        log_level=0,
        limits=default_limits(),
    )
    m.unsafe_compute_mask_ptr(address, nbytes)
    return m


def replay(ours, raw, tokens, bitmask, raw_buf: np.ndarray, t: dict, logits=None, first: int = 0) -> None:
    """Replay `tokens` on our `GrammarMatcher` (`TokenBitmask.fill` into MLX memory + `accept_token`, and
    an evaluated `apply_token_bitmask` when `logits` is given) and on a raw `LLMatcher` (mask into
    `raw_buf`, int32 [1, words], + `consume_token`), interleaved token by token with the order rotating:
    both share the engine's lazily built lexer, so whoever goes first pays for building it (`first` = 1
    starts with ours instead of raw: alternate it over repeats of a short sequence). Appends seconds to
    t["fill"], t["accept"], t["fill_accept"], t["raw_fill"], t["raw_accept"],
    t["raw_fill_accept"] (and t["apply"] with logits)."""
    from guided import apply_token_bitmask

    raw_addr, nbytes = raw_buf.ctypes.data, raw_buf.nbytes
    for i, tok in enumerate(tokens):
        for which in (0, 1) if (i + first) % 2 else (1, 0):
            if which == 0:
                a = time.perf_counter()
                bitmask.fill(ours)
                b = time.perf_counter()
                if logits is not None:
                    mx.eval(apply_token_bitmask(logits, bitmask.current))
                c = time.perf_counter()
                ours.accept_token(tok)
                d = time.perf_counter()
                t["fill"].append(b - a)
                if logits is not None:
                    t["apply"].append(c - b)
                t["accept"].append(d - c)
                t["fill_accept"].append(b - a + d - c)
            else:
                a = time.perf_counter()
                raw.unsafe_compute_mask_ptr(raw_addr, nbytes)
                b = time.perf_counter()
                raw.consume_token(tok)
                c = time.perf_counter()
                t["raw_fill"].append(b - a)
                t["raw_accept"].append(c - b)
                t["raw_fill_accept"].append(c - a)


def bench_ours(files, hf, info, instances_per_schema: int = 2) -> tuple[dict, list]:
    """Compile and per-token timings for ours and raw llguidance. Returns (results, jobs) where jobs are
    (file name, schema, [token lists]) of the schemas we compiled, for the peers."""
    from guided import GrammarCache, TokenBitmask, apply_token_bitmask, make_spec
    from guided.errors import GrammarError

    cache = GrammarCache(capacity=4096)
    bitmask = TokenBitmask(info.vocab_size)
    raw_buf = np.zeros((1, bitmask.words), np.int32)
    raw_addr, nbytes = raw_buf.ctypes.data, bitmask.words * 4
    logits = mx.random.normal((1, info.vocab_size))
    mx.eval(logits, apply_token_bitmask(logits, bitmask.current))
    t = {k: [] for k in ("fill", "apply", "accept", "fill_accept", "raw_fill", "raw_accept", "raw_fill_accept")}
    comp = {"ours_cold": [], "make_spec": [], "compile_grammar": [], "ours_cached": [], "cache_hit": [], "raw": []}
    counts = {"schemas": 0, "compiled": 0, "refused": 0, "instances": 0, "valid_refused": 0, "tokens": 0}
    jobs = []
    for path in files:
        case = json.loads(path.read_text())
        tests = [x for x in case.get("tests", []) if x.get("valid")][:instances_per_schema]
        if not tests:
            continue
        counts["schemas"] += 1
        try:
            compiled, s_spec, s_compile = cold_compile(case["schema"], info)
        except (GrammarError, ValueError):
            counts["refused"] += 1
            continue
        spec = compiled.spec
        comp["ours_cold"].append(s_spec + s_compile)
        comp["make_spec"].append(s_spec)
        comp["compile_grammar"].append(s_compile)
        cache.get(spec, info)  # fill the cache, then time a hit: the lookup alone, and a request (spec + lookup)
        t0 = time.perf_counter()
        cache.get(spec, info)
        t1 = time.perf_counter()
        cache.get(make_spec(schema=case["schema"]), info)
        t2 = time.perf_counter()
        comp["cache_hit"].append(t1 - t0)
        comp["ours_cached"].append(t2 - t1)
        t0 = time.perf_counter()
        raw_compile(case["schema"], info, raw_addr, nbytes)
        comp["raw"].append(time.perf_counter() - t0)
        counts["compiled"] += 1
        token_lists = []
        for test in tests:
            tokens = hf.encode(serialize(test["data"]), add_special_tokens=False)
            probe = compiled.matcher()
            if not (probe.accept_tokens(tokens) and probe.is_accepting()):
                counts["valid_refused"] += 1  # strict mode, key order or number form: see conformance
                continue
            token_lists.append(tokens)
            counts["instances"] += 1
            counts["tokens"] += len(tokens)
            replay(compiled.matcher(), compiled.template.deep_copy(), tokens, bitmask, raw_buf, t, logits)
        if token_lists:
            jobs.append((path.name, case["schema"], token_lists))
    return {
        "counts": counts,
        "per_token_us": {k: stats_us(v) for k, v in t.items()},
        "compile_ms": {k: stats_ms(v) for k, v in comp.items()},
    }, jobs


# -- peers, in a child process each ------------------------------------------------------------------


def _byte_decoder():
    """GPT-2 byte-level BPE: the printable character standing for each byte -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=False)}


def outlines_vocabulary(hf, eos_id: int, vocab_name: str):
    """outlines_core.Vocabulary from a fast tokenizer without the hub: byte-level (Qwen) or
    SentencePiece with byte fallback (Gemma) token spellings turned into bytes."""
    from outlines_core import Vocabulary

    special = set(hf.all_special_ids) | {i for i, t in hf.added_tokens_decoder.items() if t.special}
    dec = _byte_decoder()
    mapping: dict[bytes, list[int]] = {}
    for token, i in hf.get_vocab().items():
        if i in special or i == eos_id or token.startswith("[PAD"):
            continue
        if vocab_name == "qwen":
            try:
                b = bytes(dec[c] for c in token)
            except KeyError:
                b = token.encode()
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            b = bytes([int(token[3:5], 16)])
        else:
            b = token.replace("▁", " ").encode()
        if b:
            mapping.setdefault(b, []).append(i)
    return Vocabulary(eos_id, mapping)


def _peer_worker(peer: str, vocab_name: str, hf, vocab_size: int, eos_ids, jobs, start: int, out):
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        if peer == "xgrammar":
            import torch
            import xgrammar as xgr

            torch.set_num_threads(1)
            tinfo = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=list(eos_ids))
            compiler = xgr.GrammarCompiler(tinfo, max_threads=1, cache_enabled=False)
            bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        else:
            from outlines_core import Guide, Index
            from outlines_core.json_schema import build_regex_from_schema

            vocab = outlines_vocabulary(hf, eos_ids[0], vocab_name)
            mask = np.zeros((1, (vocab_size + 31) // 32), np.int32)
        out.put(("ready", None))
    except Exception as exc:  # the peer cannot run at all: a finding
        out.put(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    for idx in range(start, len(jobs)):
        name, schema, token_lists = jobs[idx]
        out.put(("start", idx))
        res = {"file": name, "fill": [], "accept": [], "refused_valid": 0, "instances": 0}
        try:
            t0 = time.perf_counter()
            if peer == "xgrammar":
                cg = compiler.compile_json_schema(
                    json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
                )
            else:
                index = Index(build_regex_from_schema(json.dumps(schema)), vocab)
            res["compile"] = time.perf_counter() - t0
            for tokens in token_lists:
                m = xgr.GrammarMatcher(cg) if peer == "xgrammar" else Guide(index)
                ok = True
                for tok in tokens:
                    a = time.perf_counter()
                    if peer == "xgrammar":
                        m.fill_next_token_bitmask(bitmask)
                    else:
                        m.write_mask_into(mask.ctypes.data, mask.size, 4)
                    b = time.perf_counter()
                    if peer == "xgrammar":
                        ok = m.accept_token(tok)
                    else:
                        try:
                            m.advance(tok)
                        except Exception:
                            ok = False
                    c = time.perf_counter()
                    res["fill"].append(b - a)
                    res["accept"].append(c - b)
                    if not ok:
                        break
                end_ok = ok and (m.accept_token(eos_ids[0]) if peer == "xgrammar" else m.is_finished())
                res["instances"] += 1
                res["refused_valid"] += not end_ok
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out.put(("done", (idx, res)))
    out.put(("end", None))


def bench_peer(peer: str, vocab_name: str, hf, info, eos_ids, jobs, schema_timeout: float, budget: float) -> dict:
    """Run `peer` on `jobs` in a forked child with a watchdog. Returns counts, timings and findings."""
    ctx = mp.get_context("fork")
    results, timeouts, errors = [], [], []
    start, t_begin, fatal = 0, time.perf_counter(), None
    while start < len(jobs) and fatal is None:
        out = ctx.Queue()
        proc = ctx.Process(
            target=_peer_worker, args=(peer, vocab_name, hf, info.vocab_size, eos_ids, jobs, start, out), daemon=True
        )
        proc.start()
        current = None
        try:
            while True:
                left = budget - (time.perf_counter() - t_begin)
                if left <= 0:
                    raise TimeoutError("budget")
                try:
                    kind, payload = out.get(timeout=min(schema_timeout if current is not None else 300, left))
                except queue_mod.Empty:
                    raise TimeoutError("schema") from None
                if kind == "fatal":
                    fatal = payload
                    break
                if kind == "start":
                    current = payload
                elif kind == "done":
                    idx, res = payload
                    (errors.append(res) if "error" in res else results.append(res))
                    current, start = None, idx + 1
                elif kind == "end":
                    start = len(jobs)
                    break
        except TimeoutError as exc:
            if str(exc) == "budget":
                skipped = len(jobs) - (start if current is None else current)
                proc.kill()
                proc.join()
                return _peer_summary(results, timeouts, errors, fatal, skipped_for_budget=skipped)
            timeouts.append(jobs[current][0] if current is not None else "(start-up)")
            start = (current + 1) if current is not None else len(jobs)
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join()
    return _peer_summary(results, timeouts, errors, fatal)


def _peer_summary(results, timeouts, errors, fatal, skipped_for_budget: int = 0) -> dict:
    fill = [x for r in results for x in r["fill"]]
    accept = [x for r in results for x in r["accept"]]
    return {
        "compiled": len(results),
        "errors": len(errors),
        "timeouts": len(timeouts),
        "fatal": fatal,
        "skipped_for_budget": skipped_for_budget,
        "instances": sum(r["instances"] for r in results),
        "valid_refused": sum(r["refused_valid"] for r in results),
        "compile_ms": stats_ms([r["compile"] for r in results]),
        "per_token_us": {
            "fill": stats_us(fill),
            "accept": stats_us(accept),
            "fill_accept": stats_us([a + b for a, b in zip(fill, accept, strict=False)]),
        },
        "error_examples": [f"{e['file']}: {e['error']}" for e in errors[:5]],
        "timeout_files": timeouts[:10],
    }


# -- end to end -----------------------------------------------------------------------------------------

# Outputs of about 20 tokens, so max 32 tokens lets every constrained run finish (valid is meaningful).
E2E_CASES = [
    (
        "Give the name, age and city of a fictional person as JSON.",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
            "required": ["name", "age", "city"],
        },
    ),
    (
        "Make up a weather report for Paris as JSON: city, temperature_c, sky, windy.",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "temperature_c": {"type": "integer", "minimum": -50, "maximum": 60},
                "sky": {"enum": ["clear", "cloudy", "rain", "snow"]},
                "windy": {"type": "boolean"},
            },
            "required": ["city", "temperature_c", "sky", "windy"],
        },
    ),
]


class MaskProcessor:
    """An mlx-lm logits processor around a peer's matcher, as peers plug into mlx-lm: accept the token
    sampled last, fill the peer's bitmask on the CPU, apply it to the MLX logits.

    accept(token) -> bool | None (False: the peer rejected a token it allowed); fill() -> the mask in
    whatever form apply(logits [1, V] mx.array, mask) -> logits takes. fill_seconds / fills: the CPU
    time of fill (s) and the number of fills. ready: perf_counter() when built (compile end)."""

    def __init__(self, accept, fill, apply, eos_ids):
        self.accept, self.fill, self.apply, self.eos_ids = accept, fill, apply, set(eos_ids)
        self.prompt_done, self.fill_seconds, self.fills = False, 0.0, 0
        self.ready = time.perf_counter()

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.prompt_done:  # the first call sees the prompt, later ones one new token at the end
            token = int(tokens[-1].item())
            if token in self.eos_ids:  # mlx-lm computes one step past EOS before it stops: nothing to mask
                return logits
            if self.accept(token) is False:
                raise RuntimeError(f"the peer rejected token {token} its own mask allowed")
        self.prompt_done = True
        t0 = time.perf_counter()
        mask = self.fill()
        self.fill_seconds += time.perf_counter() - t0
        self.fills += 1
        return self.apply(logits, mask)


def _peer_run(model, ids, max_tokens, processor: MaskProcessor, start: float) -> dict:
    from benchmarks.generation import mlx_lm_run

    out = mlx_lm_run(model, ids, max_tokens, [processor], start)
    return out | {
        "compile_ms": 1e3 * (processor.ready - start),
        "mask_ms_per_pass": 1e3 * processor.fill_seconds / max(1, processor.fills),
    }


E2E_PEERS = ("xgrammar", "outlines-core", "llguidance.mlx", "outlines.from_mlxlm")
# Outlines' xgrammar backend runs here (xgrammar's MLX op is portable) but repeats the xgrammar row with
# Outlines' defaults (free whitespace) at the cost of a minute of `make bench`: on request only.
E2E_PEERS_OPTIONAL = ("outlines.from_mlxlm-xgrammar",)


def e2e_peers(model, names=E2E_PEERS) -> dict:
    """Peer variants for `benchmarks.generation.run_guided_bench`, each driving mlx-lm's `stream_generate` with a
    logits processor on the same model. Per-model set-up (tokenizer tables) happens here, outside the
    timings, as ours (`get_tokenizer_info`); each run compiles its schema cold, inside TTFT.

    - xgrammar: compact separators, strict mode (as the mask bench), no compile cache; its mask applied
      with its own portable MLX op (`xgrammar.kernels.apply_token_bitmask_mlx`, plain MLX ops).
    - outlines-core: `Index` of the schema's regex; its own MLX kernel is Metal-only and its NumPy one
      needs numba, so the mask goes through our MLX op (`guided.apply_token_bitmask`), same layout.
    - llguidance.mlx: raw llguidance with llguidance's own MLX helper (a Metal kernel).
    - outlines.from_mlxlm: Outlines 1.x's own processor with its JSON default backend (outlines_core)
      and with llguidance, built by `outlines.Generator` (which compiles), run through `stream_generate`
      as `MLXLM.generate_stream` does; "outlines.from_mlxlm-xgrammar" (optional) with xgrammar.
    A peer whose import fails becomes a variant that raises, so the report carries the message."""
    hf, vocab_size = model.tokenizer.hf, model.vocab_size
    eos = sorted(model.tokenizer.eos_ids)
    peers = {}

    def unavailable(exc):
        def run(*_):
            raise exc

        return run

    for name in names:
        try:
            if name == "xgrammar":
                peers[name] = _xgrammar_peer(hf, vocab_size, eos)
            elif name == "outlines-core":
                peers[name] = _outlines_core_peer(hf, vocab_size, eos)
            elif name == "llguidance.mlx":
                peers[name] = _llguidance_mlx_peer(hf, vocab_size, eos)
            elif name == "outlines.from_mlxlm":
                peers.update(_outlines_peers(model, ("outlines_core", "llguidance")))
            elif name == "outlines.from_mlxlm-xgrammar":
                peers.update(_outlines_peers(model, ("xgrammar",)))
            else:
                raise ValueError(
                    f"unknown end-to-end peer {name!r}; known: {', '.join(E2E_PEERS + E2E_PEERS_OPTIONAL)}"
                )
        except ImportError as exc:
            peers[name] = unavailable(exc)
    return peers


def _xgrammar_peer(hf, vocab_size, eos):
    import xgrammar as xgr
    from xgrammar.kernels.apply_token_bitmask_mlx import apply_token_bitmask_mlx

    compiler = xgr.GrammarCompiler(
        xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=eos), cache_enabled=False
    )

    def run(model, ids, schema, max_tokens):
        start = time.perf_counter()
        matcher = xgr.GrammarMatcher(
            compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
            )
        )
        bitmask = xgr.allocate_token_bitmask(1, vocab_size)

        def fill():
            matcher.fill_next_token_bitmask(bitmask)
            return mx.array(bitmask.numpy())

        apply = lambda logits, mask: apply_token_bitmask_mlx(mask, logits, vocab_size)  # noqa: E731
        return _peer_run(model, ids, max_tokens, MaskProcessor(matcher.accept_token, fill, apply, eos), start)

    return run


def _outlines_core_peer(hf, vocab_size, eos):
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    from guided import apply_token_bitmask

    vocab = outlines_vocabulary(hf, hf.eos_token_id, "qwen")

    def run(model, ids, schema, max_tokens):
        start = time.perf_counter()
        guide = Guide(Index(build_regex_from_schema(json.dumps(schema)), vocab))
        mask = np.zeros((1, (vocab_size + 31) // 32), np.int32)

        def fill():
            guide.write_mask_into(mask.ctypes.data, mask.size, 4)
            return mx.array(mask)

        return _peer_run(model, ids, max_tokens, MaskProcessor(guide.advance, fill, apply_token_bitmask, eos), start)

    return run


def _llguidance_mlx_peer(hf, vocab_size, eos):
    import llguidance.mlx
    import llguidance.numpy
    from llguidance import LLMatcher

    from guided import get_tokenizer_info

    info = get_tokenizer_info(hf, vocab_size, eos)

    def run(model, ids, schema, max_tokens):
        start = time.perf_counter()
        matcher = LLMatcher(info.ll_tokenizer, LLMatcher.grammar_from_json_schema(schema, overrides=RAW_OVERRIDES))
        mask = llguidance.numpy.allocate_token_bitmask(1, vocab_size)

        def fill():
            llguidance.numpy.fill_next_token_bitmask(matcher, mask)
            return mask

        return _peer_run(
            model,
            ids,
            max_tokens,
            MaskProcessor(matcher.consume_token, fill, llguidance.mlx.apply_token_bitmask, eos),
            start,
        )

    return run


def _outlines_peers(model, backends) -> dict:
    import outlines
    from outlines.types import JsonSchema

    from benchmarks.generation import mlx_lm_run

    outlines_model = outlines.from_mlxlm(model.network, model.tokenizer._wrapper)

    def variant(backend):
        def run(model, ids, schema, max_tokens):
            start = time.perf_counter()
            processor = outlines.Generator(
                outlines_model, JsonSchema(json.dumps(schema)), backend=backend
            ).logits_processor
            compile_ms = 1e3 * (time.perf_counter() - start)
            return mlx_lm_run(model, ids, max_tokens, [processor], start) | {"compile_ms": compile_ms}

        return run

    return {f"outlines.from_mlxlm ({b})": variant(b) for b in backends}


def _qwen():
    """The real Qwen2.5-Coder-0.5B in float32 (the fast dtype on the CPU backend)."""
    from coreai import store
    from runtime import load_model

    return load_model(store.ensure("qwen2.5-coder-0.5b-instruct"), dtype="float32", name="qwen2.5-coder-0.5b-instruct")


def bench_e2e(max_tokens: int, repeats: int, peers=E2E_PEERS) -> dict:
    """`benchmarks.generation.run_guided_bench` on the real Qwen2.5-Coder-0.5B (float32 here) with `E2E_CASES`,
    ours and the `e2e_peers` interleaved. Returns its report."""
    from benchmarks.generation import run_guided_bench

    model = _qwen()
    return run_guided_bench(model, E2E_CASES, max_tokens, repeats, e2e_peers(model, peers))


# -- speculative decoding ---------------------------------------------------------------------------------

CASES = REPO / "benchmarks" / "cases"
SPECULATIVE_CASES = {
    "fly_to": 64,
    "invoice": 256,
    "order": 120,
    "story": 128,
    "agent_edit": 200,
    "agent_write": 360,
    "agent_patch": 200,
}
"""Case name -> max_tokens. `benchmarks/cases/NAME.messages.json` is the chat prompt and
`NAME.schema.json` the schema (none: free prose, unconstrained variants only). The extraction outputs
finish well within their budget (greedy: about 25, 150 and 90 tokens); the story is cut at 128
tokens. `order`: 7 string fields copied from a 3-sentence text (issue 29's order extraction).
`agent_*` (issue 49): the calls agents make most, after a `Read` tool result holding a 30-line file:
an `Edit` whose `old_string` is copied from it, a `Write` of the whole corrected file, and an
`apply_patch` patch (free text) whose context lines are copied from it."""


def speculative_cases(names=SPECULATIVE_CASES) -> list[tuple]:
    """[(messages, schema or None, max_tokens)] for `benchmarks.generation.run_guided_bench`."""
    out = []
    for name in names:
        schema = CASES / f"{name}.schema.json"
        out.append(
            (
                json.loads((CASES / f"{name}.messages.json").read_text()),
                json.loads(schema.read_text()) if schema.exists() else None,
                SPECULATIVE_CASES[name],
            )
        )
    return out


def bench_speculative(repeats: int, speculative: str = "prompt_lookup", model=None, cases=None) -> dict:
    """`benchmarks.generation.run_guided_bench` with `speculative` on `speculative_cases()` (default) and the real
    Qwen2.5-Coder-0.5B (default): guided with and without speculation, unconstrained ours (with and
    without) and mlx-lm, interleaved, medians of `repeats`. Returns its report."""
    from benchmarks.generation import run_guided_bench

    cases = speculative_cases() if cases is None else cases
    return run_guided_bench(model or _qwen(), cases, max(c[2] for c in cases), repeats, speculative=speculative)


def speculative_markdown(report: dict, host: dict, seconds: float) -> str:
    """The speculative report as markdown: a header line (machine, date, versions), a table per case
    (`benchmarks.generation.speculative_rows`) and a loud line per output mismatch."""
    from benchmarks.generation import SPECULATIVE_HEADER, mismatches, speculative_rows

    out = [
        f"Speculative decoding benchmark {host['date']}, {host['processor']} ({host['cpus']} cores, {host['system']} "
        f"{host['machine']}), Python {host['python']}; "
        + ", ".join(f"{k} {v}" for k, v in host["versions"].items())
        + f". {report['model']} {report['dtype']}, {report['machine']['device']}, "
        f"speculative: {report['speculative']}, "
        f"greedy, median of {report['repeats']} (variants interleaved in a rotating order, all in one run); "
        "decode tok/s excludes TTFT (ours: `timings.decode_tps`; mlx-lm: tokens after the first over their time)."
    ]
    for case in report["cases"]:
        kind = "free prose, no schema" if case["schema"] is None else "guided"
        out.append(
            f"{case['prompt'][:100]!r} ({kind}; {case['prompt_tokens']} prompt tokens, max {case['max_tokens']} tokens)"
        )
        out.append(md_table(SPECULATIVE_HEADER, speculative_rows(case)))
    out += [f"**MISMATCH**: speculative output differs from the non-speculative one: {m}" for m in mismatches(report)]
    out.append(
        "x guided: ratio to ours constrained with jump-forward, no speculation; x unconstrained: to ours "
        "unconstrained, no speculation; x mlx-lm: to mlx-lm's `stream_generate`, unconstrained; identical: the "
        f"greedy tokens equal the non-speculative variant's in every run. Run time {seconds:.0f} s."
    )
    return "\n\n".join(out)


# -- report ---------------------------------------------------------------------------------------------


def markdown(report: dict) -> str:
    m = report["machine"]
    out = [
        f"Guided benchmark {m['date']}, {m['processor']} ({m['cpus']} cores, {m['system']} {m['machine']}), "
        f"Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + "."
    ]
    f = lambda s, k: f"{s[k]:.1f}" if s.get("n") else "-"  # noqa: E731
    for vocab, v in report["vocabs"].items():
        c = v["ours"]["counts"]
        out.append(
            f"### Per-token cost, {vocab} vocabulary ({v['vocab_size']:,} logits): {c['compiled']}/{c['schemas']} "
            f"MaskBench schemas compiled, {c['instances']} valid instances, {c['tokens']} tokens (us per token)"
        )
        rows = []
        labels = {
            "fill": "ours: fill (TokenBitmask, MLX memory)",
            "apply": "ours: apply (evaluated, float32)",
            "accept": "ours: accept",
            "fill_accept": "ours: fill + accept",
            "raw_fill": "raw llguidance: fill (NumPy)",
            "raw_accept": "raw llguidance: consume_token",
            "raw_fill_accept": "raw llguidance: fill + consume",
        }
        for k, label in labels.items():
            s = v["ours"]["per_token_us"][k]
            rows.append([label, f(s, "mean"), f(s, "p50"), f(s, "p99"), f(s, "max"), "", ""])
        for peer, p in v.get("peers", {}).items():
            s = p["per_token_us"]["fill_accept"]
            note = p["fatal"] or (
                f"{p['compiled']} compiled, {p['errors']} errors, {p['timeouts']} timeouts"
                + (f", {p['skipped_for_budget']} not run (time budget)" if p["skipped_for_budget"] else "")
            )
            rows.append(
                [
                    f"{peer}: fill + accept",
                    f(s, "mean"),
                    f(s, "p50"),
                    f(s, "p99"),
                    f(s, "max"),
                    p.get("valid_refused", "-"),
                    note,
                ]
            )
        rows[0][5] = c["valid_refused"]
        out.append(md_table(["variant", "mean", "p50", "p99", "max", "valid instances refused", "notes"], rows))
        crow = []
        for k, label in (
            ("ours_cold", "ours cold (make_spec + compile_grammar)"),
            ("make_spec", "  of which make_spec"),
            ("compile_grammar", "  of which compile_grammar"),
            ("ours_cached", "ours cached request (memoized make_spec + GrammarCache hit)"),
            ("cache_hit", "GrammarCache hit alone (same spec)"),
            ("raw", "raw llguidance (grammar + LLMatcher + first mask)"),
        ):
            s = v["ours"]["compile_ms"][k]
            crow.append(
                [
                    label,
                    s.get("n", 0),
                    f"{s['p50']:.3f}" if s.get("n") else "-",
                    f"{s['p99']:.3f}" if s.get("n") else "-",
                    f"{s['max']:.3f}" if s.get("n") else "-",
                ]
            )
        for peer, p in v.get("peers", {}).items():
            s = p["compile_ms"]
            crow.append(
                [
                    f"{peer} cold",
                    s.get("n", 0),
                    f"{s['p50']:.3f}" if s.get("n") else "-",
                    f"{s['p99']:.3f}" if s.get("n") else "-",
                    f"{s['max']:.3f}" if s.get("n") else "-",
                ]
            )
        out.append(f"Compile time, {vocab} (ms; peers only on schemas we compiled; timeouts excluded):")
        out.append(md_table(["compile", "schemas", "p50", "p99", "max"], crow))
    if "e2e" in report:
        from benchmarks.generation import GUIDED_HEADER, guided_rows, ratio_base

        e = report["e2e"]
        out.append(
            f"### End to end, {e['model']} {e['dtype']}, greedy, max {e['max_tokens']} tokens, median of "
            f"{e['repeats']} (variants interleaved); TTFT includes a cold grammar compile"
        )
        for case in e["cases"]:
            out.append(f"{case['prompt']} ({case['prompt_tokens']} prompt tokens)")
            out.append(md_table(GUIDED_HEADER, guided_rows(case)))
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        srows = [
            [n]
            + [fmt(r[metric].get(ref)) for metric in ("decode_tps", "ttft") for ref in (ratio_base(n), "jump_forward")]
            for n, r in e["summary"].items()
        ]
        out.append(
            "Geometric means over the cases (base: the same engine unconstrained, ours or mlx-lm; "
            "ours: ours constrained with jump-forward):"
        )
        out.append(
            md_table(["variant", "decode tok/s x base", "decode tok/s x ours", "TTFT x base", "TTFT x ours"], srows)
        )
    out.append(f"Run time {report['seconds']:.0f} s.")
    return "\n\n".join(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 schemas, Qwen only, no peers, no end-to-end")
    ap.add_argument("--per-subset", type=int, default=8, help="MaskBench files per subset (default 8)")
    ap.add_argument("--vocabs", default="qwen,gemma")
    ap.add_argument("--peers", default="xgrammar,outlines-core")
    ap.add_argument("--schema-timeout", type=float, default=30.0, help="peer compile watchdog per schema (s)")
    ap.add_argument("--peer-budget", type=float, default=90.0, help="time budget per peer and vocabulary (s)")
    ap.add_argument("--e2e-tokens", type=int, default=32, help="max tokens per end-to-end generation (0 = skip)")
    ap.add_argument("--e2e-repeats", type=int, default=3, help="end-to-end runs per variant and case (medians)")
    ap.add_argument(
        "--e2e-peers",
        default=",".join(E2E_PEERS),
        help=f"end-to-end peers driving mlx-lm (also: {', '.join(E2E_PEERS_OPTIONAL)})",
    )
    ap.add_argument(
        "--speculative-repeats",
        type=int,
        default=3,
        help="runs per variant and case of the speculative bench (medians; 0 = skip)",
    )
    ap.add_argument("--speculative-only", action="store_true", help="only the speculative bench (speculative.json)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.speculative_only:
        return main_speculative(args.speculative_repeats or 3, args.out)
    if args.quick:
        args.per_subset, args.vocabs, args.peers, args.e2e_tokens, args.speculative_repeats = 1, "qwen", "", 0, 0
    t_start = time.perf_counter()
    files = pick_files(args.per_subset)
    if args.quick:
        files = files[:2]
    report = {"machine": machine(), "settings": {k: str(v) for k, v in vars(args).items()}, "vocabs": {}}
    for vocab in [v for v in args.vocabs.split(",") if v]:
        hf, info, eos = load_vocab(vocab)
        log(f"{vocab}: tokenizer ready ({info.vocab_size} logits); {len(files)} MaskBench files")
        ours, jobs = bench_ours(files, hf, info)
        entry = {"vocab_size": info.vocab_size, "ours": ours, "peers": {}}
        log(f"{vocab}: ours done {ours['counts']}")
        for peer in [p for p in args.peers.split(",") if p]:
            try:
                entry["peers"][peer] = bench_peer(
                    peer, vocab, hf, info, eos, jobs, args.schema_timeout, args.peer_budget
                )
            except Exception as exc:
                entry["peers"][peer] = {
                    "fatal": f"{type(exc).__name__}: {exc}",
                    "per_token_us": {"fill_accept": {"n": 0}},
                    "compile_ms": {"n": 0},
                    "compiled": 0,
                    "errors": 0,
                    "timeouts": 0,
                    "skipped_for_budget": 0,
                    "trace": traceback.format_exc()[-2000:],
                }
            log(
                f"{vocab}: {peer} done: compiled {entry['peers'][peer].get('compiled')}, "
                f"fatal {entry['peers'][peer].get('fatal')}"
            )
        report["vocabs"][vocab] = entry
    if args.e2e_tokens:
        report["e2e"] = bench_e2e(args.e2e_tokens, args.e2e_repeats, [p for p in args.e2e_peers.split(",") if p])
        log("end to end done")
    report["seconds"] = time.perf_counter() - t_start
    text = markdown(report)
    print(text)
    save_report(args.out or RESULTS / ("guided-quick.json" if args.quick else "guided.json"), report, text)
    if args.speculative_repeats:
        main_speculative(args.speculative_repeats)
    return report


def main_speculative(repeats: int, out: Path | None = None) -> dict:
    """Run `bench_speculative` on the real model, print its markdown and write it with the JSON to
    `out` (default `benchmarks/results/speculative.json`). Returns the report."""
    t_start = time.perf_counter()
    host = machine()
    report = bench_speculative(repeats)
    report["host"], report["seconds"] = host, time.perf_counter() - t_start
    text = speculative_markdown(report, host, report["seconds"])
    print(text)
    save_report(out or RESULTS / "speculative.json", report, text)
    return report


def save_report(out: Path, report: dict, text: str) -> None:
    """Write `report` as `out` (JSON) and `text` beside it as .md."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    out.with_suffix(".md").write_text(text + "\n")
    log(f"wrote {out} and {out.with_suffix('.md').name}")


if __name__ == "__main__":
    main()
