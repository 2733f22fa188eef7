"""Scaling study: how our guided cost grows with schema size (number of properties, nesting depth,
enum size) and vocabulary size (Qwen 151,936 and Gemma 3 262,144 logits), beside raw llguidance.

Each point is one synthetic JSON Schema and one valid instance of it, serialized as our grammar writes
it (compact JSON, schema key order) and tokenized with the real tokenizer. Measured per point:

- compile (ms, p50 over repeats): ours cold (`make_spec` + `compile_grammar`, the schema -> spec memo
  cleared, no `GrammarCache`) and raw llguidance (grammar + `LLMatcher` + first mask);
- per token (us): our `TokenBitmask.fill` (into MLX memory) + `accept_token`, and raw llguidance's
  mask into NumPy + `consume_token`, interleaved token by token (`benchmarks.guided.replay`); mean /
  p50 / p99 over the instance's tokens, the median of each over repeats.

Writes benchmarks/results/scaling.{json,md,png} (the plot needs matplotlib, the `bench` extra).
Figures only, no assertions; the machine is shared, so they are indicative.

    python -m benchmarks.scaling            # the full run (make bench): 1-2 minutes here
    python -m benchmarks.scaling --quick    # seconds plus the tokenizer load: tests/test_bench_smoke.py
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from pathlib import Path

import numpy as np

from benchmarks.guided import RESULTS, cold_compile, load_vocab, log, raw_compile, replay, save_report, stats_us
from conformance.common import accepts, machine, md_table, serialize, tokenize

AXES = {"properties": [1, 4, 16, 64, 256], "depth": [1, 2, 4, 8, 16, 32], "enum": [2, 16, 128, 1024, 4096]}
QUICK_AXES = {"properties": [1, 4], "depth": [1, 2], "enum": [2, 16]}
TOKEN_KEYS = ("fill", "accept", "fill_accept", "raw_fill", "raw_accept", "raw_fill_accept")

_KINDS = (("string", "some text"), ("integer", 42), ("number", 2.5), ("boolean", True))


def properties_case(n: int):
    """(schema, instance): one object with `n` required properties, string/integer/number/boolean in turn."""
    names = [f"field_{i}" for i in range(n)]
    schema = {
        "type": "object",
        "properties": {k: {"type": _KINDS[i % 4][0]} for i, k in enumerate(names)},
        "required": names,
    }
    return schema, {k: _KINDS[i % 4][1] for i, k in enumerate(names)}


def depth_case(d: int):
    """(schema, instance): `d` objects nested in one another, the innermost holding one string."""
    schema, value = (
        {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]},
        {"value": "x"},
    )
    for _ in range(d - 1):
        schema, value = {"type": "object", "properties": {"child": schema}, "required": ["child"]}, {"child": value}
    return schema, value


def enum_case(k: int):
    """(schema, instance): one required property taking one of `k` distinct lowercase words (seeded, so a
    smaller enum is a prefix of a larger one); the instance is the last word. Random words rather than
    `value_0, value_1, ...` so the lexer sees a bushy trie, as with real product codes or names."""
    rng, words = random.Random(0), {}
    while len(words) < k:
        words["".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 12)))] = None
    values = list(words)
    return {"type": "object", "properties": {"choice": {"enum": values}}, "required": ["choice"]}, {
        "choice": values[-1]
    }


CASES = {"properties": properties_case, "depth": depth_case, "enum": enum_case}


def _repeat(fn, max_n: int, min_n: int, budget: float) -> int:
    """Call fn() at least `min_n` and at most `max_n` times, stopping once `budget` seconds are spent:
    big points get fewer repeats, so the run stays short."""
    t0, n = time.perf_counter(), 0
    while n < max_n and (n < min_n or time.perf_counter() - t0 < budget):
        fn()
        n += 1
    return n


def measure(schema, value, hf, info, bitmask, raw_buf, max_n: int, min_n: int, budget: float, samples: int = 0) -> dict:
    """One point: token count, compile ms (p50 over repeats) and per-token us (median over repeats of the
    mean / p50 / p99 over the instance's tokens). A short instance is replayed more often, up to about
    `samples` tokens (50 replays at most), so one noisy token does not make its figure.
    Raises RuntimeError if our grammar refuses the instance."""
    tokens, _ = tokenize(hf, info, serialize(value))
    comp = {"ours": [], "make_spec": [], "compile_grammar": [], "raw": []}
    last = {}

    def compile_once():
        last["compiled"], s_spec, s_compile = cold_compile(schema, info)
        t0 = time.perf_counter()
        raw_compile(schema, info, raw_buf.ctypes.data, raw_buf.nbytes)
        comp["raw"].append(time.perf_counter() - t0)
        comp["ours"].append(s_spec + s_compile)
        comp["make_spec"].append(s_spec)
        comp["compile_grammar"].append(s_compile)

    n_compile = _repeat(compile_once, max_n, min_n, budget)
    compiled = last["compiled"]
    if not accepts(compiled, tokens):
        raise RuntimeError(f"our grammar refuses the synthetic instance {serialize(value)[:80]}")
    runs = []

    def replay_once():
        t = {k: [] for k in TOKEN_KEYS}
        replay(compiled.matcher(), compiled.template.deep_copy(), tokens, bitmask, raw_buf, t, first=len(runs) % 2)
        runs.append({k: stats_us(v) for k, v in t.items()})

    n_tokens = _repeat(replay_once, max(max_n, min(50, samples // len(tokens))), min_n, budget)
    return {
        "tokens": len(tokens),
        "schema_chars": len(json.dumps(schema)),
        "repeats": {"compile": n_compile, "tokens": n_tokens},
        "compile_ms": {k: 1e3 * float(np.median(v)) for k, v in comp.items()},
        "per_token_us": {
            k: {s: float(np.median([r[k][s] for r in runs])) for s in ("mean", "p50", "p99")} for k in TOKEN_KEYS
        },
    }


def bench_vocab(name: str, axes: dict, max_n: int, min_n: int, budget: float, samples: int) -> dict:
    """All points of `axes` ({axis: [sizes]}) for one vocabulary ("qwen" or "gemma")."""
    from guided import TokenBitmask

    hf, info, _ = load_vocab(name)
    bitmask = TokenBitmask(info.vocab_size)
    raw_buf = np.zeros((1, bitmask.words), np.int32)
    log(f"{name}: tokenizer ready ({info.vocab_size} logits)")
    measure(*properties_case(2), hf, info, bitmask, raw_buf, 2, 2, 0)  # warm-up: first calls pay one-off costs
    points = {}
    for axis, sizes in axes.items():
        points[axis] = []
        for x in sizes:
            p = {"x": x, **measure(*CASES[axis](x), hf, info, bitmask, raw_buf, max_n, min_n, budget, samples)}
            points[axis].append(p)
            log(
                f"{name} {axis}={x}: {p['tokens']} tokens, compile {p['compile_ms']['ours']:.1f} ms "
                f"(raw {p['compile_ms']['raw']:.1f}), fill+accept {p['per_token_us']['fill_accept']['mean']:.1f} us "
                f"(raw {p['per_token_us']['raw_fill_accept']['mean']:.1f})"
            )
    return {"vocab_size": info.vocab_size, "points": points}


# -- report ---------------------------------------------------------------------------------------------

LABELS = {"properties": "properties", "depth": "nesting depth", "enum": "enum size"}


def markdown(report: dict) -> str:
    m = report["machine"]
    out = [
        f"Scaling benchmark {m['date']}, {m['processor']} ({m['cpus']} cores, {m['system']} {m['machine']}), "
        f"Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + "."
    ]
    trio = lambda s: f"{s['mean']:.1f} / {s['p50']:.1f} / {s['p99']:.1f}"  # noqa: E731
    for axis, label in LABELS.items():
        rows = []
        for vocab, v in report["vocabs"].items():
            for p in v["points"].get(axis, []):
                c, t = p["compile_ms"], p["per_token_us"]
                rows.append(
                    [
                        vocab,
                        p["x"],
                        p["tokens"],
                        f"{c['ours']:.1f}",
                        f"{c['make_spec']:.1f}",
                        f"{c['raw']:.1f}",
                        trio(t["fill_accept"]),
                        trio(t["raw_fill_accept"]),
                        f"{100 * (t['fill_accept']['mean'] / t['raw_fill_accept']['mean'] - 1):+.0f}%",
                    ]
                )
        if rows:
            out.append(f"### Scaling with {label}")
            out.append(
                md_table(
                    [
                        "vocab",
                        label,
                        "tokens",
                        "ours compile p50 ms",
                        "of which make_spec",
                        "raw llguidance compile ms",
                        "ours fill + accept us (mean / p50 / p99)",
                        "raw fill + consume us (mean / p50 / p99)",
                        "ours vs raw (mean)",
                    ],
                    rows,
                )
            )
    out.append(
        f"Compile: cold, p50 over repeats. Per token: over the instance's tokens (p99 of a short instance "
        f"is its slowest token), median of repeats. "
        f"Plot: {report['plot']}. Run time {report['seconds']:.0f} s."
    )
    return "\n\n".join(out)


def plot(report: dict, path: Path) -> str:
    """Write a 2x3 figure (compile ms and per-token us against each axis, log-log; one color per
    vocabulary, solid ours, dashed raw llguidance) to `path`. Returns what happened, for the report."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display here; must precede pyplot
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        return "skipped (matplotlib not installed: pip install -e '.[bench]')"
    rows = (
        (lambda p: p["compile_ms"]["ours"], lambda p: p["compile_ms"]["raw"]),
        (lambda p: p["per_token_us"]["fill_accept"]["mean"], lambda p: p["per_token_us"]["raw_fill_accept"]["mean"]),
    )
    fig, axs = plt.subplots(2, len(LABELS), figsize=(11, 6), squeeze=False)
    for j, (axis, label) in enumerate(LABELS.items()):
        for color, (vocab, v) in zip(("C0", "C1", "C2"), report["vocabs"].items(), strict=False):
            pts = v["points"].get(axis, [])
            xs = [p["x"] for p in pts]
            name = f"{vocab} ({v['vocab_size'] // 1000}k)"
            for i, (ours, raw) in enumerate(rows):
                axs[i][j].plot(xs, [ours(p) for p in pts], "o-", color=color, label=f"ours, {name}")
                axs[i][j].plot(
                    xs, [raw(p) for p in pts], "s--", color=color, alpha=0.6, label=f"raw llguidance, {name}"
                )
        axs[0][j].set_title(f"vs {label}")
        axs[1][j].set_xlabel(label)
        sizes = sorted({p["x"] for v in report["vocabs"].values() for p in v["points"].get(axis, [])})
        for i in range(2):
            ax = axs[i][j]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(sizes, [str(x) for x in sizes])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # labels at 1, 2, 5, 10, ...: short ranges too
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="both", alpha=0.3)
    axs[0][0].set_ylabel("cold compile p50 (ms)")
    axs[1][0].set_ylabel("fill + accept per token, mean (us)")
    axs[0][0].legend(fontsize=7)
    fig.suptitle(
        f"Guided cost scaling ({report['machine']['date'][:10]}, {report['machine']['cpus']} cores, shared)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"written to {path.name}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two sizes per axis, Qwen only, one or two repeats")
    ap.add_argument("--vocabs", default="qwen,gemma")
    ap.add_argument("--repeats", type=int, default=9, help="most repeats per point, for compile and for tokens")
    ap.add_argument("--min-repeats", type=int, default=3)
    ap.add_argument(
        "--budget", type=float, default=2.0, help="seconds per point after which repeats stop (at the minimum)"
    )
    ap.add_argument(
        "--token-samples", type=int, default=600, help="replay short instances up to about this many tokens"
    )
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="JSON path; .md and .png beside it")
    args = ap.parse_args(argv)
    axes = AXES
    if args.quick:
        axes, args.vocabs, args.repeats, args.min_repeats, args.budget, args.token_samples = (
            QUICK_AXES,
            "qwen",
            2,
            1,
            0.2,
            0,
        )
    t_start = time.perf_counter()
    out = args.out or RESULTS / ("scaling-quick.json" if args.quick else "scaling.json")
    report = {"machine": machine(), "settings": {k: str(v) for k, v in vars(args).items()}, "axes": axes, "vocabs": {}}
    for vocab in [v for v in args.vocabs.split(",") if v]:
        report["vocabs"][vocab] = bench_vocab(
            vocab, axes, args.repeats, args.min_repeats, args.budget, args.token_samples
        )
    report["seconds"] = time.perf_counter() - t_start
    report["plot"] = "skipped (--no-plot)" if args.no_plot else plot(report, out.with_suffix(".png"))
    text = markdown(report)
    print(text)
    save_report(out, report, text)
    log(f"plot: {report['plot']}")
    return report


if __name__ == "__main__":
    main()
