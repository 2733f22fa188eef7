"""Two revisions of the library side by side (issue #45's "must not change"): the greedy outputs of
the bench cases, byte for byte, and the speculation and batching figures, measured in alternating
rounds so that a change of load hits both alike.

    python -m benchmarks.revisions --base d00cf58 [--head .] [--rounds 3]

Each round runs `_probe` (this file, as a script with the revision's tree first on the path) once
per revision: on the embedded default model, each case of `benchmarks/cases` (fly_to, invoice,
order: guided; story: free) greedy with prompt lookup and without (`coreai.ConstrainedSession` /
`Model.generate`, the API both revisions have), then 4 concurrent constrained requests through a
real server in a thread (continuous batching). Prints a table (medians over rounds, head / base
ratios) and writes benchmarks/results/revisions.json. A base revision is checked out with
`git worktree add` into a temporary folder and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "benchmarks" / "cases"


def _probe() -> None:
    """Run in the revision under test (its tree first on sys.path); prints one JSON line."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    import coreai
    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    model = coreai.load()
    out: dict = {"cases": {}}
    for name in ("fly_to", "invoice", "order", "story"):
        messages = json.loads((CASES / f"{name}.messages.json").read_text())
        schema_file = CASES / f"{name}.schema.json"
        for spec in ("off", "prompt_lookup"):
            t0 = time.perf_counter()
            if schema_file.exists():
                session = coreai.ConstrainedSession(model, schema=json.loads(schema_file.read_text()))
                r = session.generate(messages, max_tokens=160, speculative=spec)
            else:
                r = model.generate(messages, max_tokens=96, speculative=None if spec == "off" else spec)
            out["cases"][f"{name}/{spec}"] = {
                "text": r.text,
                "tokens": r.usage.completion_tokens,
                "passes": r.forward_passes,
                "decode_tps": r.timings.decode_tps,
                "seconds": time.perf_counter() - t0,
            }
    schema = json.loads((CASES / "fly_to.schema.json").read_text())
    messages = json.loads((CASES / "fly_to.messages.json").read_text())
    body = {
        "model": "m",
        "messages": messages,
        "max_tokens": 64,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": schema}},
    }
    with serve_in_thread(model, ServerConfig(model_name="m", max_batch=4)) as base:
        httpx.post(base + "/v1/chat/completions", json=body, timeout=600)  # warm: compile, first pass
        t0 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            replies = list(
                pool.map(lambda _: httpx.post(base + "/v1/chat/completions", json=body, timeout=600), range(4))
            )
        seconds = time.perf_counter() - t0
    tokens = sum(r.json()["usage"]["completion_tokens"] for r in replies)
    out["batch"] = {"texts": [r.json()["choices"][0]["message"]["content"] for r in replies], "tok_s": tokens / seconds}
    print(json.dumps(out))


def run(tree: Path, env: dict) -> dict:
    # `-c` with the tree as the working directory: the tree's packages come first (a script's own
    # folder would come first, and benchmarks/guided.py would shadow the `guided` package).
    probe = f"import runpy, sys; sys.argv = ['probe', '--probe']; runpy.run_path({__file__!r}, run_name='__main__')"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the base revision (a commit)")
    p.add_argument("--head", default=str(ROOT), help="the tree of the head revision (default: this one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "revisions.json"))
    args = p.parse_args(argv)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True)
        try:
            rounds: dict[str, list[dict]] = {"base": [], "head": []}
            for i in range(args.rounds):  # alternate which goes first
                order = [("base", base), ("head", Path(args.head))][:: 1 if i % 2 == 0 else -1]
                for label, tree in order:
                    rounds[label].append(run(tree, dict(os.environ)))
                    print(f"round {i + 1} {label} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    load.append(os.getloadavg()[0])
    report = summarize(rounds, args.base, load)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print_table(report)
    return 0 if report["identical"] else 1


def summarize(rounds: dict, base: str, load: list[float]) -> dict:
    med = lambda xs: statistics.median(xs)  # noqa: E731
    cases = {}
    identical = True
    for key in rounds["head"][0]["cases"]:
        texts = {r["cases"][key]["text"] for side in rounds.values() for r in side}
        identical &= len(texts) == 1
        row = {"identical": len(texts) == 1}
        for side in ("base", "head"):
            runs = [r["cases"][key] for r in rounds[side]]
            row[side] = {
                "decode_tps": med([x["decode_tps"] for x in runs]),
                "tokens_per_pass": med([x["tokens"] / max(1, x["passes"]) for x in runs]),
            }
        cases[key] = row
    batch_texts = {t for side in rounds.values() for r in side for t in r["batch"]["texts"]}
    identical &= len(batch_texts) == 1
    batch = {side: med([r["batch"]["tok_s"] for r in rounds[side]]) for side in ("base", "head")}
    return {
        "base": base,
        "rounds": len(rounds["head"]),
        "load_average": load,
        "identical": identical,
        "cases": cases,
        "batch_tok_s": batch,
    }


def print_table(report: dict) -> None:
    print(f"base {report['base']} vs head, {report['rounds']} rounds, load average {report['load_average']}")
    heads = ("identical", "base tok/s", "head tok/s", "ratio", "tok/pass b", "tok/pass h")
    print(f"{'case':<24}" + "".join(f"{h:>12}" for h in heads))
    for key, row in report["cases"].items():
        b, h = row["base"], row["head"]
        print(
            f"{key:<24}{str(row['identical']):>12}{b['decode_tps']:>12.1f}{h['decode_tps']:>12.1f}"
            f"{h['decode_tps'] / b['decode_tps']:>12.2f}{b['tokens_per_pass']:>12.2f}{h['tokens_per_pass']:>12.2f}"
        )
    b, h = report["batch_tok_s"]["base"], report["batch_tok_s"]["head"]
    print(f"{'4 concurrent (server)':<24}{'':>12}{b:>12.1f}{h:>12.1f}{h / b:>12.2f}")
    print(f"all outputs identical: {report['identical']}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        _probe()
    else:
        sys.exit(main())
