"""Generation benchmarks, medians of n runs after a warm-up, everything compared in the same run.

- `run_bench`: our loop against mlx-lm's `stream_generate`, same model and prompt. EOS is ignored on
  both sides so every run decodes exactly `gen_tokens` tokens.
- `run_guided_bench`: end-to-end guided generation per (prompt, schema): unconstrained decode
  against constrained decode with jump-forward on and off, and TTFT including a cold grammar compile,
  greedy, the variants interleaved. Callers may add variants (benchmarks/guided.py adds the peers).
  With `speculative`, it adds the speculative variants (guided with jump-forward, and unconstrained)
  and checks that their greedy outputs equal the non-speculative ones; a case without a schema runs
  only the unconstrained variants (free prose).
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from datetime import datetime, UTC
from types import SimpleNamespace

from runtime import SamplingStrategy, stream_tokens  # first: the BLAS set-up before mlx.core (runtime.blas)
from runtime.blas import blas_in_use

import mlx.core as mx  # noqa: E402


def random_prompt(model, n: int, seed: int = 0) -> list[int]:
    """n token ids drawn uniformly from the non-special vocabulary (reproducible)."""
    rng = mx.random.key(seed)
    special = model.tokenizer.special_ids
    hi = len(model.tokenizer)
    ids = [int(t) for t in mx.random.randint(0, hi, (n * 2,), key=rng).tolist() if t not in special]
    return ids[:n]


def _clocked(deltas, prompt_tokens: int) -> dict:
    """TTFT, prefill and decode tok/s of one engine's stream, by this harness's clock for both engines:
    `deltas` yields (tokens in this piece, peak memory or None). decode tok/s: the tokens after the
    first piece over the time from the first piece to the last (mlx-lm's own `generation_tps` counts
    the first token too, over the same time: n / (n - 1) times higher, +3 % at 32 tokens)."""
    start = time.perf_counter()
    first = end = None
    tokens = first_tokens = 0
    peak = 0
    for n, memory in deltas:
        end = time.perf_counter()
        if first is None and n:
            first, first_tokens = end, n
        tokens += n
        peak = memory if memory is not None else peak
    assert first is not None and end is not None, "the engine produced no token"
    return dict(
        ttft=first - start,
        prefill_tps=prompt_tokens / (first - start),
        decode_tps=(tokens - first_tokens) / (end - first) if end > first else 0.0,
        peak_memory=peak,
        tokens=tokens,
    )


def _ours(model, prompt, gen_tokens):
    tokenizer = SimpleNamespace(eos_ids=set(), detokenizer=model.tokenizer.detokenizer)
    deltas = stream_tokens(model.network, tokenizer, prompt, SamplingStrategy(), max_tokens=gen_tokens)
    return _clocked(
        ((len(d.token_ids), d.result.timings.peak_memory if d.result else None) for d in deltas), len(prompt)
    )


def _mlx_lm(model, prompt, gen_tokens):
    from mlx_lm import stream_generate

    wrapper = model.tokenizer._wrapper
    saved = wrapper.eos_token_ids
    wrapper.eos_token_ids = set()
    try:
        # each response carries one new token, the last one too when max_tokens ended it ("length")
        responses = stream_generate(model.network, wrapper, prompt, max_tokens=gen_tokens)
        return _clocked(
            ((0 if r.finish_reason == "stop" else 1, int(r.peak_memory * 1e9)) for r in responses), len(prompt)
        )
    finally:
        wrapper.eos_token_ids = saved


def run_bench(model, prompt_tokens: int = 512, gen_tokens: int = 128, runs: int = 3) -> dict:
    """Returns a JSON-ready dict: machine, versions, and per-engine medians plus ours/mlx-lm ratios."""
    prompt = random_prompt(model, prompt_tokens)
    _ours(model, prompt[:16], 4)  # warm-up (kernels, BLAS threads)
    _mlx_lm(model, prompt[:16], 4)
    samples = {"coreai": [], "mlx_lm": []}
    for _ in range(runs):
        samples["coreai"].append(_ours(model, prompt, gen_tokens))
        samples["mlx_lm"].append(_mlx_lm(model, prompt, gen_tokens))
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in samples.items()}
    ratios = {
        k: medians["coreai"][k] / medians["mlx_lm"][k] for k in ("prefill_tps", "decode_tps") if medians["mlx_lm"][k]
    }
    return dict(
        **_header(model),
        prompt_tokens=len(prompt),
        gen_tokens=gen_tokens,
        runs=runs,
        median=medians,
        ratio_coreai_over_mlx_lm=ratios,
        samples=samples,
    )


def _header(model) -> dict:
    """Date, machine, versions, model name and compute dtype: the first fields of every report."""
    import llguidance
    import mlx_lm

    return dict(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=dict(
            platform=platform.platform(),
            processor=platform.processor() or platform.machine(),
            device=str(mx.default_device()),
            blas=blas_in_use(),
        ),
        versions=dict(mlx=mx.__version__, mlx_lm=mlx_lm.__version__, llguidance=llguidance.__version__),
        model=model.name,
        dtype=str(_leaves(model.network)[0][1]).removeprefix("mlx.core."),
    )


def _leaves(network):
    from mlx.utils import tree_flatten

    return [(k, v.dtype) for k, v in tree_flatten(network.parameters()) if k.endswith("norm.weight")][:1]


def format_table(report: dict) -> str:
    m = report["median"]
    lines = [
        f"{report['model']} ({report['dtype']}), prompt "
        f"{report['prompt_tokens']} tok, generate {report['gen_tokens']} tok, "
        f"median of {report['runs']}; {report['machine']['device']}, BLAS: {report['machine']['blas']}",
        f"{'engine':10s} {'TTFT s':>8s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'peak MiB':>9s}",
    ]
    for name in ("coreai", "mlx_lm"):
        r = m[name]
        lines.append(
            f"{name:10s} {r['ttft']:8.3f} {r['prefill_tps']:14.1f} "
            f"{r['decode_tps']:13.2f} {r['peak_memory'] / 2**20:9.0f}"
        )
    ratio = report["ratio_coreai_over_mlx_lm"]
    lines.append("coreai / mlx-lm: " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    return "\n".join(lines)


# -- guided generation, end to end ------------------------------------------------------------------


def mlx_lm_run(
    model, prompt_ids: list[int], max_tokens: int, logits_processors=None, start: float | None = None
) -> dict:
    """One greedy `mlx_lm.stream_generate` run on `model`'s network and tokenizer, stopping at EOS.

    logits_processors: mlx-lm processors, `(tokens mx.array [n] int32, logits mx.array [1, V]) -> logits`.
    start: the `time.perf_counter()` TTFT counts from (default: now), so a caller's compile is included.
    Returns tokens (EOS excluded), forward_passes, ttft (s), decode_tps (tokens after the first per
    second, as our `Timings.decode_tps`), text, finish.
    """
    from mlx_lm import stream_generate

    start = time.perf_counter() if start is None else start
    first, parts = None, []
    for response in stream_generate(
        model.network, model.tokenizer._wrapper, prompt_ids, max_tokens=max_tokens, logits_processors=logits_processors
    ):
        first = first or time.perf_counter()
        parts.append(response.text)
    end = time.perf_counter()
    tokens = response.generation_tokens - (response.finish_reason == "stop")  # the last one was EOS
    return dict(
        tokens=tokens,
        forward_passes=response.generation_tokens,
        ttft=first - start,
        decode_tps=(tokens - 1) / (end - first) if tokens > 1 else 0.0,
        text="".join(parts),
        finish=response.finish_reason,
    )


def _speculative_counts(r) -> dict:
    """The fields every run of ours reports beside its timings: token ids (to compare outputs) and the
    speculative counters (tokens; acceptance: accepted / drafted, 0 when nothing was drafted)."""
    return dict(
        token_ids=list(r.token_ids),
        drafted_tokens=r.drafted_tokens,
        accepted_tokens=r.accepted_tokens,
        acceptance=r.accepted_tokens / r.drafted_tokens if r.drafted_tokens else 0.0,
    )


def _unconstrained(model, prompt_ids, schema, max_tokens, speculative=None) -> dict:
    r = model.generate(prompt_ids, max_tokens=max_tokens, speculative=speculative)
    return dict(
        tokens=r.usage.completion_tokens,
        forward_passes=r.forward_passes,
        ttft=r.timings.ttft,
        decode_tps=r.timings.decode_tps,
        text=r.text,
        finish=r.finish_reason,
        **_speculative_counts(r),
    )


def _constrained(model, prompt_ids, schema, max_tokens, jump_forward: bool, speculative=None) -> dict:
    from coreai import ConstrainedSession
    from guided import GrammarCache
    from guided.spec import json_spec

    json_spec.cache_clear()  # make_spec memoizes schema -> spec; cold means both that and the grammar
    start = time.perf_counter()
    session = ConstrainedSession(model, schema=schema, jump_forward=jump_forward, cache=GrammarCache(capacity=1))
    compile_s = time.perf_counter() - start
    r = session.generate(prompt_ids, max_tokens=max_tokens, speculative=speculative)
    s = r.stats
    return dict(
        tokens=r.usage.completion_tokens,
        forward_passes=r.forward_passes,
        tokens_jumped=r.forced_tokens,
        ttft=compile_s + r.timings.ttft,
        compile_ms=1e3 * compile_s,
        decode_tps=r.timings.decode_tps,
        mask_ms_per_pass=1e3 * s.mask_seconds / max(1, s.masks),
        valid=r.valid,
        text=r.text,
        finish=r.finish_reason,
        **_speculative_counts(r),
    )


GUIDED_VARIANTS = {
    "unconstrained": _unconstrained,
    "mlx_lm": lambda model, ids, schema, max_tokens: mlx_lm_run(model, ids, max_tokens),
    "jump_forward": lambda model, ids, schema, max_tokens: _constrained(model, ids, schema, max_tokens, True),
    "no_jump_forward": lambda model, ids, schema, max_tokens: _constrained(model, ids, schema, max_tokens, False),
}
"""Built-in variants of `run_guided_bench`: ours unconstrained, mlx-lm unconstrained (the peers'
baseline), ours constrained with jump-forward (our constrained run) and without."""

UNCONSTRAINED = ("unconstrained", "mlx_lm", "unconstrained+spec")
"""Variants that take no schema: the only ones a case without a schema (free prose) runs."""

SPECULATIVE_PAIRS = {"jump_forward+spec": "jump_forward", "unconstrained+spec": "unconstrained"}
"""Speculative variant -> the variant that must produce the same greedy tokens without speculation."""


def speculative_variants(speculative) -> dict:
    """`run_guided_bench` variants for `speculative` ("prompt_lookup", "draft" or a draft `Model`):
    ours constrained with jump-forward and ours unconstrained, both speculative."""
    return {
        "jump_forward+spec": lambda model, ids, schema, n: _constrained(model, ids, schema, n, True, speculative),
        "unconstrained+spec": lambda model, ids, schema, n: _unconstrained(model, ids, schema, n, speculative),
    }


RATIO_REFERENCES = ("unconstrained", "mlx_lm", "jump_forward")


def run_guided_bench(
    model, cases, max_tokens: int = 32, repeats: int = 3, extra_variants: dict | None = None, speculative=None
) -> dict:
    """End-to-end guided generation, greedy, same prompt ids for every variant.

    cases: [(prompt, schema)] or [(prompt, schema, max_tokens)]: prompt as `Model.prompt_ids` takes it
        (text is wrapped in the chat template; chat messages), schema a JSON Schema dict, or None for
        a case that runs only the `UNCONSTRAINED` variants (free prose); max_tokens overrides the
        argument for that case.
    max_tokens: completion budget per run (tokens; forced tokens count).
    repeats: runs per variant and case; each repeat runs the variants in a rotated order so drift
        (thermal, other processes) hits all of them.
    extra_variants: {name: fn(model, prompt_ids, schema, max_tokens) -> dict} run beside
        `GUIDED_VARIANTS` (the peers); the dict has the keys `mlx_lm_run` returns, optionally
        compile_ms and mask_ms_per_pass. An exception makes the variant a finding (`errors`), not a crash.
    speculative: None, or "prompt_lookup" / "draft" / a draft `Model`: adds `speculative_variants` and
        leaves out no_jump_forward (the speculative comparison is at jump-forward on). Each case then
        has `identical`: {speculative variant: its token ids in every run equal those of every run of
        its `SPECULATIVE_PAIRS` partner} (greedy output must not change; False is a bug).

    Constrained variants compile from a cold cache inside the timed TTFT. For variants that do not
    report `valid`, it is finish "stop" and the text validating with `jsonschema` (`guided.check_json`).
    Returns a JSON-ready dict: per case the samples, their medians (valid: all runs valid), the errors,
    and ratios of decode tok/s and TTFT to each of `RATIO_REFERENCES`; `summary`: geometric means of
    the ratios over the cases (over the cases with a schema for the constrained variants).
    """
    from guided import check_json

    variants = {**GUIDED_VARIANTS, **(extra_variants or {})}
    if speculative is not None:
        del variants["no_jump_forward"]
        variants.update(speculative_variants(speculative))
    cases = [(c[0], c[1], model.prompt_ids(c[0]), c[2] if len(c) > 2 else max_tokens) for c in cases]
    failed: dict[str, str] = {}

    def attempt(name, ids, schema, n, errors):
        try:
            return variants[name](model, ids, schema, n)
        except Exception as exc:  # a peer that cannot run here is a finding, recorded with its message
            errors[name] = f"{type(exc).__name__}: {exc}"
        finally:
            mx.synchronize()  # mlx-lm leaves one step past EOS in flight: keep it out of the next timing

    for name in variants:  # warm-up (kernel compiles, lazy imports, draft shapes); a variant failing here is out
        prompt, schema, ids, _ = next(c for c in cases if c[1] is not None or name in UNCONSTRAINED)
        attempt(name, ids, schema, 16 if speculative is not None else 2, failed)
    out = []
    for prompt, schema, ids, n_max in cases:
        errors = dict(failed)
        names = [n for n in variants if n not in errors and (schema is not None or n in UNCONSTRAINED)]
        samples: dict[str, list] = {n: [] for n in names}
        for r in range(repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                sample = None if name in errors else attempt(name, ids, schema, n_max, errors)
                if sample is not None:
                    if schema is not None and name not in UNCONSTRAINED and "valid" not in sample:
                        # as ours: an output cut by max_tokens is not valid, even if its text validates
                        sample["valid"] = sample["finish"] == "stop" and not check_json(sample["text"], schema)[1]
                    samples[name].append(sample)
        median = {n: _median(s) for n, s in samples.items() if s and n not in errors}
        ratios = {
            n: {
                metric: {
                    ref: m[metric] / median[ref][metric]
                    for ref in RATIO_REFERENCES
                    if ref in median and median[ref][metric]
                }
                for metric in ("decode_tps", "ttft")
            }
            for n, m in median.items()
        }
        case = dict(
            prompt=prompt if isinstance(prompt, str) else _prompt_label(prompt),
            schema=schema,
            prompt_tokens=len(ids),
            max_tokens=n_max,
            median=median,
            ratios=ratios,
            errors=errors,
            samples=samples,
        )
        if speculative is not None:
            case["identical"] = {
                spec: all(s["token_ids"] == samples[base][0]["token_ids"] for s in samples[spec] + samples[base])
                for spec, base in SPECULATIVE_PAIRS.items()
                if samples.get(spec) and samples.get(base)
            }
        out.append(case)
    summary = {}
    for n in variants:
        per_case = [c["ratios"].get(n) for c in out if c["schema"] is not None or n in UNCONSTRAINED]
        if per_case and all(per_case):
            summary[n] = {
                metric: {
                    ref: _geomean([r[metric][ref] for r in per_case])
                    for ref in RATIO_REFERENCES
                    if all(ref in r[metric] for r in per_case)
                }
                for metric in ("decode_tps", "ttft")
            }
    report = dict(**_header(model), max_tokens=max_tokens, repeats=repeats, cases=out, summary=summary)
    if speculative is not None:
        report["speculative"] = speculative if isinstance(speculative, str) else f"draft model {speculative.name}"
    return report


def _prompt_label(prompt) -> str:
    """A one-line label for a prompt given as chat messages or token ids: the last message's content."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", "")).replace("\n", " ")
    return str(prompt)


def _median(samples: list[dict]) -> dict:
    """Medians of the numeric fields; valid: all runs valid; text and finish: the last run's."""
    out = {}
    for key, value in samples[0].items():
        values = [s[key] for s in samples]
        if isinstance(value, bool):
            out[key] = all(values)
        elif isinstance(value, (int, float)):
            out[key] = statistics.median(values)
        else:
            out[key] = values[-1]
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


GUIDED_HEADER = [
    "variant",
    "decode tok/s",
    "x base",
    "x ours",
    "TTFT s",
    "TTFT x base",
    "compile ms",
    "tokens / passes",
    "jumped",
    "mask ms/pass",
    "valid",
    "notes",
]


def ratio_base(name: str) -> str:
    """The unconstrained run of the same engine as variant `name`: ours, or mlx-lm for the others."""
    ours = name in GUIDED_VARIANTS or name in SPECULATIVE_PAIRS
    return "mlx_lm" if name == "mlx_lm" or not ours else "unconstrained"


def guided_rows(case: dict) -> list[list[str]]:
    """`GUIDED_HEADER` rows of a `run_guided_bench` case: one per variant, then one per error (the
    message in notes). "x base": ratio to the same engine unconstrained (ours, or mlx-lm for the
    variants driving mlx-lm); "x ours": ratio to ours constrained with jump-forward."""
    num = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    rows = []
    for name, m in case["median"].items():
        r = case["ratios"][name]
        base = ratio_base(name)
        rows.append(
            [
                name,
                f"{m['decode_tps']:.2f}",
                num(r["decode_tps"].get(base), ".3f"),
                num(r["decode_tps"].get("jump_forward"), ".3f"),
                f"{m['ttft']:.3f}",
                num(r["ttft"].get(base), ".3f"),
                num(m.get("compile_ms"), ".1f"),
                f"{m['tokens']:g} / {m['forward_passes']:g}",
                num(m.get("tokens_jumped"), "g"),
                num(m.get("mask_ms_per_pass"), ".3f"),
                str(m.get("valid", "-")),
                "" if m["finish"] == "stop" else f"finish {m['finish']}",
            ]
        )
    return rows + [[name] + ["-"] * 10 + [error] for name, error in case["errors"].items()]


SPECULATIVE_HEADER = [
    "variant",
    "decode tok/s",
    "x guided",
    "x unconstrained",
    "x mlx-lm",
    "tokens / passes",
    "tokens/pass",
    "jumped",
    "drafted",
    "accepted",
    "acceptance",
    "valid",
    "identical",
    "notes",
]


def speculative_rows(case: dict) -> list[list[str]]:
    """`SPECULATIVE_HEADER` rows of a case of a speculative `run_guided_bench` report: decode tok/s
    (medians, TTFT excluded) and its ratios to ours guided without speculation (jump_forward), ours
    unconstrained and mlx-lm unconstrained; the draft counters (tokens; acceptance = accepted / drafted)
    and whether the output equals the non-speculative variant's in every run."""
    num = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    rows = []
    for name, m in case["median"].items():
        r = case["ratios"][name]["decode_tps"]
        spec = name in SPECULATIVE_PAIRS
        rows.append(
            [
                name,
                f"{m['decode_tps']:.2f}",
                num(r.get("jump_forward"), ".2f"),
                num(r.get("unconstrained"), ".2f"),
                num(r.get("mlx_lm"), ".2f"),
                f"{m['tokens']:g} / {m['forward_passes']:g}",
                f"{m['tokens'] / max(1, m['forward_passes']):.2f}",
                num(m.get("tokens_jumped"), "g"),
                num(m.get("drafted_tokens") if spec else None, "g"),
                num(m.get("accepted_tokens") if spec else None, "g"),
                num(m.get("acceptance") if spec else None, ".0%"),
                str(m.get("valid", "-")),
                {True: "yes", False: "NO: MISMATCH"}.get(case.get("identical", {}).get(name), "-"),
                "" if m["finish"] == "stop" else f"finish {m['finish']}",
            ]
        )
    return rows + [[name] + ["-"] * 12 + [error] for name, error in case["errors"].items()]


def mismatches(report: dict) -> list[str]:
    """'case prompt: variant' for every speculative variant whose greedy output differed from its
    non-speculative partner's (must be empty)."""
    return [
        f"{c['prompt'][:60]!r}: {name}"
        for c in report["cases"]
        for name, same in c.get("identical", {}).items()
        if not same
    ]


def format_guided_table(report: dict) -> str:
    """The `run_guided_bench` report as text: one table per case (`guided_rows`, or `speculative_rows`
    for a speculative report, which ends with a loud line per output mismatch)."""
    spec = "speculative" in report
    header, rows_of = (SPECULATIVE_HEADER, speculative_rows) if spec else (GUIDED_HEADER, guided_rows)
    lines = [
        f"{report['model']} ({report['dtype']}), greedy, median of {report['repeats']} (variants interleaved); "
        f"{report['machine']['device']}, BLAS: {report['machine']['blas']}"
        + (
            f"; speculative: {report['speculative']}; decode tok/s excludes TTFT"
            if spec
            else "; TTFT includes a cold grammar compile"
        )
    ]
    for case in report["cases"]:
        rows = [header] + rows_of(case)
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += [
            "",
            f"{case['prompt'][:80]!r} ({case['prompt_tokens']} prompt tokens, max {case['max_tokens']} tokens"
            f"{'' if case['schema'] is not None else ', no schema'})",
        ]
        lines += [
            "  ".join(
                c.ljust(w) if i in (0, len(r) - 1) else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            ).rstrip()
            for r in rows
        ]
    if spec:
        lines += [
            "",
            "x guided: ratio to ours constrained with jump-forward, no speculation; x unconstrained: to ours "
            "unconstrained, no speculation; x mlx-lm: to mlx-lm's stream_generate unconstrained; identical: the "
            "greedy tokens equal the non-speculative variant's in every run",
        ]
        lines += [f"MISMATCH: speculative output differs from the non-speculative one: {m}" for m in mismatches(report)]
    else:
        lines += [
            "",
            "x base: ratio to the same engine unconstrained (ours, or mlx-lm for the variants driving mlx-lm); "
            "x ours: ratio to ours constrained with jump-forward",
        ]
    return "\n".join(lines)
