"""Generation benchmark: our loop against mlx-lm's `stream_generate`, same model, same prompt, same
run (interleaved), medians of n runs after a warm-up. EOS is ignored on both sides so every run
decodes exactly `gen_tokens` tokens."""

from __future__ import annotations

import platform
import statistics
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import mlx.core as mx

from coreai.platform import blas_in_use
from runtime import SamplingStrategy, stream_tokens


def random_prompt(model, n: int, seed: int = 0) -> list[int]:
    """n token ids drawn uniformly from the non-special vocabulary (reproducible)."""
    rng = mx.random.key(seed)
    special = model.tokenizer.special_ids
    hi = len(model.tokenizer)
    ids = [int(t) for t in mx.random.randint(0, hi, (n * 2,), key=rng).tolist() if t not in special]
    return ids[:n]


def _ours(model, prompt, gen_tokens):
    tokenizer = SimpleNamespace(eos_ids=set(), detokenizer=model.tokenizer.detokenizer)
    for delta in stream_tokens(model.network, tokenizer, prompt, SamplingStrategy(), max_tokens=gen_tokens):
        result = delta.result
    t = result.timings
    return dict(ttft=t.ttft, prefill_tps=t.prefill_tps, decode_tps=t.decode_tps, peak_memory=t.peak_memory,
                tokens=len(result.token_ids))


def _mlx_lm(model, prompt, gen_tokens):
    from mlx_lm import stream_generate

    wrapper = model.tokenizer._wrapper
    saved = wrapper.eos_token_ids
    wrapper.eos_token_ids = set()
    try:
        start = time.perf_counter()
        ttft = None
        for response in stream_generate(model.network, wrapper, prompt, max_tokens=gen_tokens):
            if ttft is None:
                ttft = time.perf_counter() - start
    finally:
        wrapper.eos_token_ids = saved
    return dict(ttft=ttft, prefill_tps=response.prompt_tps, decode_tps=response.generation_tps,
                peak_memory=int(response.peak_memory * 1e9), tokens=response.generation_tokens)


def run_bench(model, prompt_tokens: int = 512, gen_tokens: int = 128, runs: int = 3) -> dict:
    """Returns a JSON-ready dict: machine, versions, and per-engine medians plus ours/mlx-lm ratios."""
    import mlx_lm

    prompt = random_prompt(model, prompt_tokens)
    _ours(model, prompt[:16], 4)  # warm-up (kernels, BLAS threads)
    _mlx_lm(model, prompt[:16], 4)
    samples = {"coreai": [], "mlx_lm": []}
    for _ in range(runs):
        samples["coreai"].append(_ours(model, prompt, gen_tokens))
        samples["mlx_lm"].append(_mlx_lm(model, prompt, gen_tokens))
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in samples.items()
    }
    ratios = {k: medians["coreai"][k] / medians["mlx_lm"][k] for k in ("prefill_tps", "decode_tps") if medians["mlx_lm"][k]}
    return dict(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        machine=dict(platform=platform.platform(), processor=platform.processor() or platform.machine(),
                     device=str(mx.default_device()), blas=blas_in_use()),
        versions=dict(mlx=mx.__version__, mlx_lm=mlx_lm.__version__),
        model=model.name, dtype=str(_leaves(model.network)[0][1]).removeprefix("mlx.core."), prompt_tokens=len(prompt),
        gen_tokens=gen_tokens, runs=runs, median=medians, ratio_coreai_over_mlx_lm=ratios, samples=samples,
    )


def _leaves(network):
    from mlx.utils import tree_flatten

    return [(k, v.dtype) for k, v in tree_flatten(network.parameters()) if k.endswith("norm.weight")][:1]


def format_table(report: dict) -> str:
    m = report["median"]
    lines = [
        f"{report['model']} ({report['dtype']}), prompt {report['prompt_tokens']} tok, generate {report['gen_tokens']} tok, "
        f"median of {report['runs']}; {report['machine']['device']}, BLAS: {report['machine']['blas']}",
        f"{'engine':10s} {'TTFT s':>8s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'peak MiB':>9s}",
    ]
    for name in ("coreai", "mlx_lm"):
        r = m[name]
        lines.append(f"{name:10s} {r['ttft']:8.3f} {r['prefill_tps']:14.1f} {r['decode_tps']:13.2f} {r['peak_memory'] / 2**20:9.0f}")
    ratio = report["ratio_coreai_over_mlx_lm"]
    lines.append("coreai / mlx-lm: " + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))
    return "\n".join(lines)
