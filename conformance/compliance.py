"""JSONSchemaBench compliance: compile every schema of every subset with our defaults, and drive a few
generations per compiled schema through the real `ConstrainedDecodingStrategy` with random logits of
the Qwen logit width (no model), checking each finished output with `jsonschema`.

Random logits: standard normal per step (seeded), plus a bias on a fixed set of "closing" tokens
(`"`, `}`, `]`, `,` and EOS ids) that grows with the step number, so that outputs finish before
`max_tokens` instead of wandering in a 100k-token string alphabet; the bias is only added to logits,
the mask, sampler and matcher are the production ones.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import mlx.core as mx
import numpy as np

from conformance.common import JSB, compile_status

SUBSETS = [
    "Glaiveai2K",
    "Github_trivial",
    "Github_easy",
    "Github_medium",
    "Github_hard",
    "Github_ultra",
    "Kubernetes",
    "Snowplow",
    "WashingtonPost",
    "JsonSchemaStore",
]
# JSONSchemaBench (arXiv:2501.10868) Table 4, Guidance column: declared / empirical / compliance.
PUBLISHED_GUIDANCE = {
    "Glaiveai2K": (0.98, 0.96, 0.98),
    "Github_easy": (0.90, 0.86, 0.96),
    "Snowplow": (0.87, 0.82, 0.94),
    "Github_medium": (0.79, 0.69, 0.87),
    "Kubernetes": (0.98, 0.91, 0.92),
    "WashingtonPost": (0.86, 0.86, 1.00),
    "Github_hard": (0.60, 0.41, 0.69),
    "JsonSchemaStore": (0.35, 0.30, 0.88),
}


def closing_bias(hf, info) -> mx.array:
    """[1, vocab] float32: 1 on single-character closing tokens and EOS ids, 0 elsewhere."""
    bias = np.zeros((1, info.vocab_size), np.float32)
    for ch in ['"', "}", "]", ",", '"}', '"]', "}}", "]}"]:
        ids = hf.encode(ch, add_special_tokens=False)
        if len(ids) == 1:
            bias[0, ids[0]] = 1.0
    for i in info.eos_ids:
        bias[0, i] = 1.0
    return mx.array(bias)


def random_generation(compiled, hf, bias: mx.array, seed: int, max_tokens: int = 160, bitmask=None) -> dict:
    """One generation through `ConstrainedDecodingStrategy` with random logits.

    Returns {"finish": "stop" / "error" / "length", "complete": bool, "text": str, "tokens": int,
    "forward_passes": int, "early_stop": bool (finished "stop" while the grammar was not complete),
    "retries": validate-and-rollback retries}.
    """
    from guided import ConstrainedDecodingStrategy
    from runtime.sampling import SamplingParams

    strategy = ConstrainedDecodingStrategy(compiled, SamplingParams(temperature=1.0, seed=seed), bitmask=bitmask)
    strategy.begin([])
    mx.random.seed(seed)
    eos = set(compiled.tokenizer.eos_ids)
    tokens: list[int] = []
    finish = "length"
    key = mx.random.key(seed)
    passes = 0
    for i in range(max_tokens):
        passes += 1
        strategy.prepare()
        key, sub = mx.random.split(key)
        logits = mx.random.normal((1, compiled.tokenizer.vocab_size), key=sub) + bias * (0.3 * max(0, i - 4))
        step = strategy.step(logits)
        del tokens[len(tokens) - step.rollback :]  # validate-and-rollback took tokens back
        tokens += [t for t in step.tokens if t not in eos]
        if step.finish:
            finish = step.finish
            break
    return {
        "finish": finish,
        "complete": strategy.complete,
        "text": hf.decode(tokens),
        "tokens": len(tokens),
        "forward_passes": passes,
        "early_stop": finish == "stop" and not strategy.complete,
        "retries": strategy.stats.retries,
    }


def subset_files(subset: str):
    return sorted((JSB / subset).glob("*.json"))


def _compile_one(path):
    from conformance.suite import _worker_state

    try:
        schema = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "error", "not JSON", 0.0
    status, detail, _, seconds = compile_status(schema, _worker_state["info"])
    if status == "unsatisfiable":  # a real-world schema no value satisfies is not covered: counted with errors
        status = "error"
    return status, detail, seconds


def run_compliance(
    info,
    hf,
    generations: int = 2,
    gen_sample: int | None = None,
    compile_sample: int | None = None,
    max_tokens: int = 160,
    progress=None,
    jobs: int = 1,
    validated_only: bool = False,
) -> dict:
    """Compile every schema (or the first `compile_sample` of each subset, by file name; in `jobs`
    processes) and run `generations` random generations (in this process) for the first `gen_sample`
    compiled schemas of each subset (all when None; with `validated_only`, of those with keywords
    enforced by validate-and-rollback). Returns per-subset counts and every failing output."""
    from conformance.suite import _worker_state, parallel_map
    from guided import TokenBitmask, check_json

    _worker_state.update(info=info, hf=hf)
    bias = closing_bias(hf, info)
    bitmask = TokenBitmask(info.vocab_size)
    subsets, failures = {}, []
    for subset in SUBSETS:
        files = subset_files(subset)
        if compile_sample:
            files = files[:compile_sample]
        c = Counter(total=len(files))
        t0 = time.perf_counter()
        statuses = parallel_map(_compile_one, files, jobs)
        compile_times = []
        for status, detail, seconds in statuses:
            c[status] += 1
            if status == "refused":
                c["refused:" + (detail if len(detail) < 40 else "other")] += 1
            if status == "compiled":
                compile_times.append(seconds)
        generated = 0
        for path, (status, _, _) in zip(files, statuses, strict=False):
            if status != "compiled" or (gen_sample is not None and generated >= gen_sample):
                continue
            schema = json.loads(path.read_text())
            compiled = compile_status(schema, info)[2]
            if compiled is None or (validated_only and not compiled.validated):  # None cannot happen
                continue
            generated += 1
            c["schemas_generated"] += 1
            for g in range(generations):
                r = random_generation(compiled, hf, bias, seed=g + 1, max_tokens=max_tokens, bitmask=bitmask)
                c["outputs"] += 1
                c["finish_" + r["finish"]] += 1
                c["tokens"] += r["tokens"]
                c["early_stop"] += r["early_stop"]
                c["retries"] += r["retries"]
                if r["finish"] == "stop" and r["complete"]:
                    _, errors = check_json(r["text"], schema)
                    if errors:
                        c["invalid"] += 1
                        failures.append(
                            {
                                "subset": subset,
                                "file": path.name,
                                "seed": g + 1,
                                "text": r["text"][:2000],
                                "errors": errors[:5],
                            }
                        )
                    else:
                        c["valid"] += 1
                elif r["early_stop"]:
                    failures.append(
                        {
                            "subset": subset,
                            "file": path.name,
                            "seed": g + 1,
                            "text": r["text"][:2000],
                            "errors": ["stopped while the grammar was incomplete"],
                        }
                    )
                elif r["finish"] == "error":
                    c["engine_error"] += 1
        c["seconds"] = round(time.perf_counter() - t0, 1)
        ct = np.array(compile_times or [0.0]) * 1e3
        subsets[subset] = {
            **c,
            "compile_ms_p50": float(np.percentile(ct, 50)),
            "compile_ms_p99": float(np.percentile(ct, 99)),
            "compile_ms_max": float(ct.max()),
        }
        if progress:
            progress(f"compliance {subset}: {dict(c)}")
    return {
        "subsets": subsets,
        "failures": failures,
        "settings": {
            "generations": generations,
            "gen_sample": gen_sample,
            "compile_sample": compile_sample,
            "max_tokens": max_tokens,
            "validated_only": validated_only,
        },
    }


COMPLIANCE_HEADER = [
    "subset",
    "schemas",
    "compiled",
    "coverage",
    "refused",
    "error",
    "Guidance (paper) declared / empirical",
    "schemas generated",
    "outputs",
    "finished",
    "valid",
    "invalid",
    "hit max_tokens",
    "compile p50 ms",
    "compile p99 ms",
]


def compliance_rows(results: dict) -> list[list]:
    rows, total = [], Counter()
    for subset, c in results["subsets"].items():
        pub = PUBLISHED_GUIDANCE.get(subset)
        for k in (
            "total",
            "compiled",
            "refused",
            "error",
            "schemas_generated",
            "outputs",
            "finish_stop",
            "valid",
            "invalid",
            "finish_length",
        ):
            total[k] += c.get(k, 0)
        rows.append(
            [
                subset,
                c["total"],
                c.get("compiled", 0),
                f"{c.get('compiled', 0) / max(1, c['total']):.2f}",
                c.get("refused", 0),
                c.get("error", 0),
                f"{pub[0]:.2f} / {pub[1]:.2f}" if pub else "-",
                c.get("schemas_generated", 0),
                c.get("outputs", 0),
                c.get("finish_stop", 0),
                c.get("valid", 0),
                c.get("invalid", 0),
                c.get("finish_length", 0),
                f"{c['compile_ms_p50']:.1f}",
                f"{c['compile_ms_p99']:.1f}",
            ]
        )
    rows.append(
        [
            "**total**",
            total["total"],
            total["compiled"],
            f"{total['compiled'] / max(1, total['total']):.2f}",
            total["refused"],
            total["error"],
            "-",
            total["schemas_generated"],
            total["outputs"],
            total["finish_stop"],
            total["valid"],
            total["invalid"],
            total["finish_length"],
            "",
            "",
        ]
    )
    return rows
