"""Speculative decoding, measured (issue 29): where a speculative step's time goes, and guided +
speculation side by side with guided alone and mlx-lm, idle or with CPU-bound load beside it.

- Step split (`step_split`): one guided generation with prompt lookup, run by a copy of the
  generation loop (`runtime.generate._generate`: the same `Sequence`, `PromptCache`, strategy and
  drafter) with a synchronizing timer around each part: the forward pass (evaluated), the mask fills
  (`prepare`, per draft position), the bitmask apply, the processors + log-softmax, verification
  (filters, draws), the matcher's advance (accept, jump-forward), the matcher rollback after the
  draft rows, the drafter (chained calls too), the grammar's draft cut, the cost model's decision, the loop's
  bookkeeping (apply, KV trim, feed) and the streamed text. Synchronizing serializes what the real
  loop overlaps (`prepare` runs while MLX computes the pass there), so the split is an upper bound of
  each part's cost. Per part: total seconds, ms per step, share of the step time.
- Side by side (`benchmarks.guided.bench_speculative`): guided + speculation, guided without,
  unconstrained ours with and without, mlx-lm's `stream_generate`, interleaved, greedy, medians, on
  the invoice (`benchmarks/cases/invoice.*`), the order extraction (`order.*`), the demo's fly_to and
  free prose (`story`); whether the outputs with and without speculation are identical.
- `--load N`: N CPU-bound processes (NumPy matrix products, one thread each) run beside it, as other
  apps on a laptop; the 1-minute load average is recorded before and after.

    python -m benchmarks.speculative                       # both parts, 3 repeats (idle machine!)
    python -m benchmarks.speculative --load 1              # the same with a CPU-bound process beside it
    python -m benchmarks.speculative --repeats 1 --scale 0.25 --cases invoice,order   # a quick check

Writes benchmarks/results/speculative_split.{json,md} and speculative.{json,md}, named
speculative[_split][_loaded][_quick] (a scaled or short run never overwrites a full run's figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from benchmarks.guided import RESULTS, SPECULATIVE_CASES, _qwen, bench_speculative, save_report, speculative_cases
from benchmarks.guided import speculative_markdown
from conformance.common import machine, md_table

PARTS = (
    "forward",
    "mask fills",
    "bitmask apply",
    "processors + log-softmax",
    "verify",
    "advance (accept, jump-forward)",
    "matcher rollback",
    "drafter",
    "draft cut (grammar)",
    "cost model",
    "loop bookkeeping",
    "stream text",
)

LOAD = (
    "import numpy as np\n"
    "a = np.random.rand(384, 384)\n"
    "while True:\n"
    "    a = np.tanh(a @ a)\n"  # CPU-bound, one BLAS thread (the environment below)
)


class PartTimer:
    """Seconds per part and per step. `part(name)`: a context manager adding its wall time."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps: list[dict] = []

    @contextmanager
    def part(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0

    def wrap(self, obj, method: str, name: str, sync: bool = False, inside: str | None = None) -> None:
        """Time `obj.method` as part `name` (evaluating its mx.array result when `sync`), less the
        time part `inside` accrued during it (a part timed within it, e.g. chained drafter calls)."""
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            nested = self.seconds[inside] if inside else 0.0
            with self.part(name):
                out = inner(*args, **kwargs)
                if sync:
                    mx.eval(out)
            if inside:
                self.seconds[name] -= self.seconds[inside] - nested
            return out

        setattr(obj, method, timed)


def step_split(model, messages, schema, max_tokens: int) -> dict:
    """One guided generation with prompt lookup under `PartTimer` (see the module docstring).
    Returns a JSON-ready dict: parts {name: {seconds, ms_per_step, share}}, median_ms_per_step
    {name: ms}, steps, the draft lengths and feed widths per step, mask fills per draft position
    (ms, mean), the output's counters and validity."""
    from coreai import ConstrainedSession
    from guided import check_json
    from runtime import PromptCache, make_drafter
    from runtime.sequence import Sequence

    session = ConstrainedSession(model, schema=schema)
    strategy = session.strategy()
    drafter = make_drafter("prompt_lookup", model)
    prompt_ids = model.prompt_ids(messages)
    t = PartTimer()
    # `logprobs` calls `mask`: its own time is logprobs minus mask (subtracted below).
    t.wrap(strategy, "mask", "bitmask apply", sync=True)
    t.wrap(strategy, "logprobs", "logprobs", sync=True)
    t.wrap(strategy.sampler, "verify", "verify")
    t.wrap(strategy, "advance", "advance (accept, jump-forward)")
    t.wrap(strategy.matcher, "rollback", "matcher rollback")
    t.wrap(drafter, "propose", "drafter")
    t.wrap(strategy.drafts, "filter", "draft cut (grammar)", inside="drafter")  # chains drafter calls
    t.wrap(strategy.drafts.costs, "choose", "cost model")
    t.wrap(strategy.drafts.costs, "keep", "cost model")

    cache = PromptCache(model.network)
    strategy.begin(list(prompt_ids), drafter, budget=max_tokens)
    seq = Sequence(model.tokenizer, prompt_ids, max_tokens=max_tokens)
    model.network(mx.array(prompt_ids[:-1])[None], cache=cache.cache)
    mx.eval([c.state for c in cache.cache])
    feed, rows, widths, drafts, per_step = prompt_ids[-1:], 1, [], [], []
    while True:
        before = dict(t.seconds)
        with t.part("forward"):
            logits = model.network(mx.array(feed)[None], cache=cache.cache)[0, -rows:, :]
            mx.eval(logits)
        widths.append(len(feed))
        drafts.append(rows - 1)
        with t.part("mask fills"):
            strategy.prepare()
        step = strategy.step(logits)
        with t.part("loop bookkeeping"):
            trim = seq.apply(step)
            if trim:
                trim_prompt_cache(cache.cache, trim)
            if seq.finish is None:
                feed, rows = seq.next_feed()
        with t.part("stream text"):
            seq.emit()
        per_step.append({k: v - before.get(k, 0.0) for k, v in t.seconds.items()})
        if seq.finish is not None:
            break
    result = seq.result()
    parts = dict(t.seconds)
    parts["processors + log-softmax"] = parts.pop("logprobs") - parts["bitmask apply"]
    parts["mask fills"] -= parts.get("matcher rollback", 0.0)
    steps = len(widths)
    total = sum(parts.values())
    for step in per_step:  # the same corrections, step by step
        step["processors + log-softmax"] = step.pop("logprobs", 0.0) - step.get("bitmask apply", 0.0)
        step["mask fills"] = step.get("mask fills", 0.0) - step.get("matcher rollback", 0.0)
    median_ms = {name: 1e3 * statistics.median(step.get(name, 0.0) for step in per_step) for name in PARTS}
    return dict(
        prompt_tokens=len(prompt_ids),
        tokens=len(result.token_ids),
        steps=steps,
        tokens_per_pass=len(result.token_ids) / steps,
        drafted_tokens=result.drafted_tokens,
        accepted_tokens=result.accepted_tokens,
        draft_lengths=drafts,
        feed_widths=widths,
        mask_fill_ms_per_row=1e3 * parts["mask fills"] / max(1, strategy.stats.masks),
        seconds=total,
        parts={
            name: dict(
                seconds=parts.get(name, 0.0),
                ms_per_step=1e3 * parts.get(name, 0.0) / steps,
                share=parts.get(name, 0.0) / total,
            )
            for name in PARTS
        },
        median_ms_per_step=median_ms,  # the first steps pay for the grammar's lazily built lexer states
        valid=result.finish_reason == "stop" and not check_json(result.text, schema)[1],
    )


def split_markdown(split: dict, host: dict) -> str:
    median = split["median_ms_per_step"]
    rows = [
        [name, f"{p['ms_per_step']:.2f}", f"{median[name]:.2f}", f"{p['share']:.1%}"]
        for name, p in split["parts"].items()
    ]
    return "\n\n".join(
        [
            f"Speculative step split {host['date']}, {host['processor']} ({host['cpus']} cores), load average "
            f"{split['loadavg'][0]:.2f} at the start: {split['case']} ({split['prompt_tokens']} prompt tokens), "
            f"{split['tokens']} tokens in {split['steps']} steps ({split['tokens_per_pass']:.2f} tokens per pass), "
            f"{split['accepted_tokens']} of {split['drafted_tokens']} draft tokens accepted; mask fill "
            f"{split['mask_fill_ms_per_row']:.3f} ms per draft position. Each part synchronized (the real loop "
            "overlaps the mask fills with the forward pass).",
            md_table(["part", "ms per step (mean)", "median", "share of the step time"], rows),
            f"Draft lengths fed per step: {split['draft_lengths']}",
        ]
    )


def start_load(n: int) -> list[subprocess.Popen]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, "-c", LOAD], env=env) for _ in range(n)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="side-by-side runs per variant and case (0 = skip)")
    ap.add_argument("--cases", default=",".join(SPECULATIVE_CASES), help="side-by-side cases (benchmarks/cases)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply each case's max_tokens (a quick check)")
    ap.add_argument("--split-case", default="invoice", help="the case of the step split ('' = skip)")
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside the benchmark")
    args = ap.parse_args(argv)
    host = machine()
    model = _qwen()
    quick = "_quick" if args.scale < 1 or args.repeats < 3 else ""  # never overwrites a full run's figures
    tag = ("_loaded" if args.load else "") + quick
    load = start_load(args.load)
    out = {}
    try:
        if args.split_case:
            messages, schema, n = speculative_cases([args.split_case])[0]
            loadavg = os.getloadavg()
            split = step_split(model, messages, schema, max(8, int(n * args.scale)))
            split.update(case=args.split_case, loadavg=loadavg, load_processes=args.load, host=host)
            text = split_markdown(split, host)
            print(text)
            save_report(RESULTS / f"speculative_split{tag}.json", split, text)
            out["split"] = split
        if args.repeats:
            cases = [(m, s, max(8, int(n * args.scale))) for m, s, n in speculative_cases(args.cases.split(","))]
            t0, before = time.perf_counter(), os.getloadavg()
            report = bench_speculative(args.repeats, model=model, cases=cases)
            report.update(host=host, seconds=time.perf_counter() - t0, load_processes=args.load)
            report["loadavg"] = dict(before=before, after=os.getloadavg())
            text = speculative_markdown(report, host, report["seconds"])
            text += f"\n\nLoad: {args.load} CPU-bound processes beside it; load average {before[0]:.2f} before, "
            text += f"{report['loadavg']['after'][0]:.2f} after."
            print(text)
            save_report(RESULTS / f"speculative{tag}.json", report, text)
            out["side_by_side"] = report
    finally:
        for p in load:
            p.kill()
            p.wait()
    return out


if __name__ == "__main__":
    main()
