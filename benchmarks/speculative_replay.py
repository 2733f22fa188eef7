"""Offline replay of speculative decoding (issue 29): a drafter scored on stored greedy outputs, no model.

The real guided strategy (`coreai.ConstrainedSession.strategy`: the grammar, its draft cut and
jump-forward tokens, verification) and the real loop bookkeeping (`runtime.sequence.Sequence`) run
as in `runtime.generate._generate`, but the forward pass is replaced by logits that put the stored
output's next token on top at every position (one-hot rows: row j says what the target would emit
after the first j draft tokens, which is right as long as those draft tokens match the output; past
the first mismatch verification reads no further rows). Greedy verification then accepts exactly
the draft prefix that matches the output, so the passes and accepted tokens are those of a real
greedy run with the same drafts, and they depend on neither the machine nor its load.

Two draft-length policies:
- `oracle`: every step asks the drafter for `max_draft` tokens and feeds exactly the prefix that will
  be accepted (the best any length policy can do with these drafts; a wrong draft costs nothing).
- `cost`: the strategy's own `runtime.draft_cost.DraftCostModel`, fed the cost of each pass from a
  fixed table instead of the wall clock (`IDLE_CPU_MS`, the issue's idle measurement of one forward
  pass of the 0.5B model on this 2-core CPU) through a simulated clock.

The stored outputs are the `jump_forward+spec` token ids of benchmarks/results/speculative.json
(the same as without speculation: that run checked it); the prompts are those of benchmarks/cases.

    python -m benchmarks.speculative_replay                          # every drafter, both policies
    python -m benchmarks.speculative_replay --drafters prompt_lookup --cases invoice
    python -m benchmarks.speculative_replay --unconstrained --cases invoice,order,fly_to,story
    python -m benchmarks.speculative_replay --real      # real guided generations (the weights)

Loads only the Qwen tokenizer and config (no weights) unless --real: then each case is generated
without speculation and with each drafter (greedy; tokens per pass, acceptance, identical output).
Prints a table and writes benchmarks/results/speculative_replay[_real][_unconstrained].{json,md}.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager

import coreai  # noqa: F401 - loads the system BLAS before mlx.core
import mlx.core as mx
import numpy as np

from benchmarks.guided import CASES, RESULTS, save_report
from conformance.common import md_table

IDLE_CPU_MS = {1: 266.0, 2: 266.0, 4: 288.0, 8: 320.0, 16: 389.0, 32: 556.0}
"""Cycle time (ms) of a forward pass of w tokens after a 300-token prompt, idle 2-core CPU (issue 29;
the measured 247 ms at w = 2 is raised to w = 1's: a wider pass is not cheaper)."""

REPLAY_CASES = ("invoice", "order", "fly_to")


def pass_counts(result) -> dict:
    """A `GenerationResult`'s tokens, forward passes, tokens per pass, drafted and accepted tokens."""
    return dict(
        tokens=len(result.token_ids),
        passes=result.forward_passes,
        tokens_per_pass=result.tokens_per_pass,
        drafted=result.drafted_tokens,
        accepted=result.accepted_tokens,
    )


def pass_ms(width: int, table: dict = IDLE_CPU_MS) -> float:
    """Linear interpolation of `table` ({width: ms}) at `width` tokens; past the widest, its slope."""
    points = sorted(table.items())
    for (w0, s0), (w1, s1) in zip(points, points[1:], strict=False):
        if width <= w1:
            return s0 + (s1 - s0) * (max(width, w0) - w0) / (w1 - w0)
    (w0, s0), (w1, s1) = points[-2:]
    return s1 + (s1 - s0) * (width - w1) / (w1 - w0)


class SimulatedClock:
    """Stands in for the `time` module of `runtime.draft_policy`: `perf_counter()` returns the simulated
    seconds, advanced by `advance(seconds)` once per replayed forward pass."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def simulated_clock():
    """The strategy's cost model measures the simulated clock while this is active."""
    import runtime.draft_policy as draft_policy

    real, clock = draft_policy.time, SimulatedClock()
    draft_policy.time = clock
    try:
        yield clock
    finally:
        draft_policy.time = real


class Oracle:
    """Wraps a drafter: proposes its longest draft (`n` ignored: the costs below always ask for
    max_draft) cut at the first token that differs from the stored output."""

    def __init__(self, drafter, prompt_len: int, target: list[int]):
        self.drafter, self.prompt_len, self.target = drafter, prompt_len, target

    def propose(self, context: list[int], n: int) -> list[int]:
        draft, at = self.drafter.propose(context, n), len(context) - self.prompt_len
        good = 0
        while good < len(draft) and at + good < len(self.target) and draft[good] == self.target[at + good]:
            good += 1
        return draft[:good]


class AlwaysMax:
    """The oracle policy's cost model: every decision asks for max_draft and keeps what was proposed."""

    def __init__(self, max_draft: int):
        self.max_draft = max_draft

    def choose(self, base: int) -> int:
        return self.max_draft

    def keep(self, k: int, base: int) -> int:
        return k

    def observe_pass(self, width: int, seconds: float) -> None:
        pass

    def observe_draft(self, drafted: int, accepted: int) -> None:
        pass


def load_case(name: str, guided: bool = True) -> tuple[list[dict], dict | None, list[int]]:
    """(messages, schema or None, stored greedy output token ids) of a case of
    benchmarks/results/speculative.json: the guided output (`jump_forward+spec`), or with
    guided=False the unconstrained one (`unconstrained+spec`; the schema is then None).
    Raises ValueError if the case has no stored output of that kind."""
    messages = json.loads((CASES / f"{name}.messages.json").read_text())
    path = CASES / f"{name}.schema.json"
    schema = json.loads(path.read_text()) if path.exists() else None
    report = json.loads((RESULTS / "speculative.json").read_text())
    variant = "jump_forward+spec" if guided else "unconstrained+spec"
    for case in report["cases"]:
        if case["schema"] == schema and variant in case["median"]:
            return messages, schema if guided else None, case["median"][variant]["token_ids"]
    raise ValueError(f"no stored {variant} output of case {name!r} in {RESULTS / 'speculative.json'}")


def replay(model, messages, schema, target: list[int], drafter, policy: str = "cost", max_draft: int = 32) -> dict:
    """Replay the greedy generation of `target` (output token ids) with `drafter` under `policy`
    ("oracle" or "cost"), guided by `schema` (None: the unconstrained `SamplingStrategy`).
    `model`: a `runtime.Model` (its network is not used: None will do).
    Returns {tokens, passes, tokens_per_pass, drafted, accepted, identical, draft_lengths}.
    Raises ValueError for an unknown policy."""
    from coreai import ConstrainedSession
    from runtime.sampling import SamplingStrategy
    from runtime.sequence import Sequence

    if policy not in ("oracle", "cost"):
        raise ValueError(f"policy must be 'oracle' or 'cost', got {policy!r}")
    prompt_ids = model.prompt_ids(messages)
    eos = min(model.tokenizer.eos_ids)
    if schema is None:
        strategy = SamplingStrategy(max_draft=max_draft, padding_mask=model.padding_mask)
    else:
        strategy = ConstrainedSession(model, schema=schema, max_draft=max_draft).strategy()
    if policy == "oracle":
        drafter, strategy.drafts.costs = Oracle(drafter, len(prompt_ids), target), AlwaysMax(strategy.max_draft)
    lengths, max_tokens = [], len(target) + 8
    with simulated_clock() as clock:
        strategy.begin(list(prompt_ids), drafter, budget=max_tokens)
        seq = Sequence(model.tokenizer, prompt_ids, max_tokens=max_tokens)
        width, rows = 1, 1  # the pass of the prompt's last token
        while True:
            clock.advance(pass_ms(width) / 1e3)
            at = len(strategy.context) - len(prompt_ids)
            ids = [target[i] if i < len(target) else eos for i in range(at, at + rows)]
            logits = np.zeros((rows, model.vocab_size), np.float32)
            logits[np.arange(rows), ids] = 10.0
            lengths.append(rows - 1)
            strategy.prepare()
            seq.apply(strategy.step(mx.array(logits)))
            if seq.finish is None:
                feed, rows = seq.next_feed()
                width = len(feed)
            delta = seq.emit()  # as `runtime.generate`: the result counts the tokens emitted
            if seq.finish is not None:
                break
    result = delta.result if delta is not None else None
    assert result is not None  # the finishing step's delta carries the result
    return dict(
        **pass_counts(result),
        identical=result.token_ids == target,
        draft_lengths=lengths,
    )


def qwen_without_weights():
    """The Qwen model's tokenizer and config as a `runtime.Model` whose network is None."""
    from coreai import store
    from runtime import Tokenizer
    from runtime.model import Model

    path = store.ensure("qwen2.5-coder-0.5b-instruct")
    config = json.loads((path / "config.json").read_text())
    return Model(None, Tokenizer(path, config), config, path, "qwen2.5-coder-0.5b-instruct")


def drafters(model) -> dict:
    """Drafter name -> a factory of a fresh drafter (one per generation) for `model`."""
    from runtime.speculative import PromptLookup
    from runtime.value_lookup import ValueLookup

    return {"prompt_lookup": PromptLookup, "value_lookup": lambda: ValueLookup(model.tokenizer)}


def real_run(model, messages, schema, max_tokens: int, drafter) -> dict:
    """One real greedy guided generation (`model` with its weights) with `drafter` (None: no
    speculation), through `runtime.stream_tokens` and the session's strategy. Returns the counters
    (no timing: tokens per pass and acceptance do not depend on the machine's load but through the
    cost model's choices) and the output token ids."""
    from coreai import ConstrainedSession
    from runtime import stream_tokens

    session = ConstrainedSession(model, schema=schema)
    ids = model.prompt_ids(messages)
    stream = stream_tokens(
        model.network, model.tokenizer, ids, session.strategy(), max_tokens=max_tokens, drafter=drafter
    )
    result = [d for d in stream][-1].result
    return dict(**pass_counts(result), token_ids=result.token_ids)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(REPLAY_CASES))
    ap.add_argument("--drafters", default="prompt_lookup,value_lookup")
    ap.add_argument("--unconstrained", action="store_true", help="replay the unconstrained outputs (story too)")
    ap.add_argument("--real", action="store_true", help="real guided generations instead (loads the weights)")
    args = ap.parse_args(argv)
    if args.real:
        from benchmarks.guided import SPECULATIVE_CASES, _qwen

        model = _qwen()
    else:
        model = qwen_without_weights()
    factories = drafters(model)
    out, rows = {}, []
    for name in args.cases.split(","):
        messages, schema, target = load_case(name, guided=not args.unconstrained)
        if args.real:
            target = real_run(model, messages, schema, SPECULATIVE_CASES[name], None)["token_ids"]
        for drafter in args.drafters.split(","):
            for policy in ("real",) if args.real else ("oracle", "cost"):
                if args.real:
                    r = real_run(model, messages, schema, SPECULATIVE_CASES[name], factories[drafter]())
                    r["identical"] = r.pop("token_ids") == target
                else:
                    r = replay(model, messages, schema, target, factories[drafter](), policy)
                out[f"{name}/{drafter}/{policy}"] = r
                rows.append(
                    [
                        name,
                        drafter,
                        policy,
                        f"{r['tokens']} / {r['passes']}",
                        f"{r['tokens_per_pass']:.2f}",
                        f"{r['accepted']} / {r['drafted']}",
                        "yes" if r["identical"] else "**NO**",
                    ]
                )
    header = ["case", "drafter", "policy", "tokens / passes", "tokens/pass", "accepted / drafted", "identical"]
    text = md_table(header, rows)
    print(text)
    tag = ("_real" if args.real else "") + ("_unconstrained" if args.unconstrained else "")
    save_report(RESULTS / f"speculative_replay{tag}.json", out, text)
    return out


if __name__ == "__main__":
    main()
