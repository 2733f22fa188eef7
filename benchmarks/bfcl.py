"""BFCL benchmark (Berkeley Function Calling Leaderboard, v4 AST categories; prints a table and writes
JSON; not a test): `coreai serve` and `mlx_lm.server` on the same float32 weights of the default
model, both subprocesses on loopback, asked the same questions with the official `openai` client
(`tool_choice` "auto", temperature 0), each question to one server then the other, and scored with
`benchmarks.bfcl_check` (BFCL's AST rules).

    python -m benchmarks.bfcl [--per-category 12] [--full] [--categories simple_python,multiple,parallel]
                              [--servers coreai,mlx_lm] [--reuse RESULTS.json] [--repetition-penalty P]

`--servers coreai` runs one server only (the default runs both); `--reuse` takes the answers of the
servers not run from an earlier results file (same model, max_tokens and questions): mlx_lm.server's
greedy answers are deterministic, so they need not be asked again while coreai changes.

Per category and server: accuracy (right answers / questions), no-call rate (no tool call where one
was due; `in text`: how many of those replies hold something that looks like a call in `content`;
`right`: how many hold JSON calls that would have been scored right, a right call lost as text),
invalid-argument rate (a call to a function not offered, or arguments that are not a JSON object or
break the tool's JSON Schema), wrong calls (well-formed, scored wrong), rejected requests (an HTTP
error) and the median seconds per question. The sample is fixed: `--per-category` questions evenly
spaced through each category's file (`--full`: all of them). Data: $COREAI_SHARED_DATA/bfcl, else
../shared/data/bfcl beside the checkout (see docs/reports/bfcl.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.bfcl_check import CATEGORIES, load_category, score_reply, to_openai_tools
from benchmarks.server import CODE_COREAI, CODE_MLX_LM, _float32_copy, _Server
from coreai import store

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("COREAI_SHARED_DATA") or ROOT.parent / "shared" / "data") / "bfcl"
DEFAULT_CATEGORIES = "simple_python,multiple,parallel"
OUTCOMES = ("right", "no_call", "invalid", "wrong", "rejected")
SERVERS = ("coreai", "mlx_lm")


def reused_answers(paths: list[Path], servers: list[str], entries: dict, settings: dict) -> dict:
    """{category: {server: [answers]}} of `servers` from earlier results files (the first file that
    holds an answer gives it), for the questions of `entries` ({category: [entry]}), in their order,
    scored again by today's checker (from the stored calls and content). Raises ValueError when a
    file was run with other `settings` (model, max_tokens) or no file holds an answer."""
    stored = []
    for path in paths:
        report = json.loads(path.read_text())
        for key, value in settings.items():
            if report.get(key) != value:
                raise ValueError(f"{path} was run with {key}={report.get(key)!r}, this run uses {value!r}")
        stored.append(report["results"])
    answers = {}
    for category, chosen in entries.items():
        for server in servers:
            by_id = {}
            for results in reversed(stored):  # the first file wins
                by_id.update({r["id"]: r for r in results.get(category, {}).get(server, [])})
            missing = [e["id"] for e in chosen if e["id"] not in by_id]
            if missing:
                raise ValueError(f"no {server} answer to {', '.join(missing[:3])} ({len(missing)} missing)")
            rescored = []
            for entry in chosen:
                r = by_id[entry["id"]]
                if r["outcome"] != "rejected":
                    calls = [(c["name"], c["arguments"]) for c in r.get("tool_calls", [])]
                    r = {**r, **score_reply(entry, calls, r.get("content") or None)}
                rescored.append(r)
            answers.setdefault(category, {})[server] = rescored
    return answers


def sample(entries: list, n: int | None) -> list:
    """`n` entries evenly spaced through `entries` (all of them when n is None or too large)."""
    if n is None or n >= len(entries):
        return entries
    return [entries[i * len(entries) // n] for i in range(n)]


def ask(client, model: str, entry: dict, max_tokens: int, tool_choice: str = "auto", parallel=None) -> dict:
    """One question to one server: the scored outcome (`score_reply`), seconds, finish_reason, the
    token counts, the calls and content as returned (content cut to 2000 characters), and how many
    calls repeat an earlier call of the reply exactly. tool_choice: "auto" or "required";
    parallel: `parallel_tool_calls` (None: not sent, OpenAI's default allows them)."""
    import openai

    tools, _ = to_openai_tools(entry["functions"])
    start = time.perf_counter()
    try:
        reply = client.chat.completions.create(
            model=model,
            messages=entry["messages"],
            tools=tools,
            tool_choice=tool_choice,
            temperature=0,
            max_tokens=max_tokens,
            **({} if parallel is None else {"parallel_tool_calls": parallel}),
        )
    except openai.APIError as e:  # a 400 for a schema the server will not take, a timeout, ...
        seconds = time.perf_counter() - start
        return {
            "outcome": "rejected",
            "error": str(e)[:400],
            "call_in_text": False,
            "text_call_right": False,
            "seconds": seconds,
        }
    seconds = time.perf_counter() - start
    choice = reply.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    result = score_reply(entry, calls, choice.message.content)
    result.update(
        seconds=seconds,
        finish_reason=choice.finish_reason,
        prompt_tokens=reply.usage.prompt_tokens if reply.usage else None,
        completion_tokens=reply.usage.completion_tokens if reply.usage else None,
        tool_calls=[{"name": n, "arguments": a} for n, a in calls],
        repeated_calls=len(calls) - len(set(calls)),
        content=(choice.message.content or "")[:2000],
    )
    return result


def summarize(results: list[dict]) -> dict:
    """Counts and rates of one category on one server. For irrelevance no call is the right answer,
    so its replies without a call count as right, not as no-call."""
    n = len(results)
    counts = {k: sum(r["outcome"] == k for r in results) for k in OUTCOMES}
    return {
        "questions": n,
        **counts,
        "accuracy": counts["right"] / n,
        "no_call_rate": counts["no_call"] / n,
        "call_in_text": sum(r["call_in_text"] for r in results),
        "right_in_text": sum(r["text_call_right"] for r in results),
        "invalid_rate": counts["invalid"] / n,
        "median_seconds": statistics.median(r["seconds"] for r in results),
        "replies_with_repeated_calls": sum(r.get("repeated_calls", 0) > 0 for r in results),
        "replies_cut_by_max_tokens": sum(r.get("finish_reason") == "length" for r in results),
    }


def table(summary: dict) -> str:
    """The markdown table of `summary` ({category: {server: summarize(...)}})."""
    lines = [
        "| category | server | n | accuracy | no call (in text, right) | invalid | wrong | rejected | s / question |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for category, servers in summary.items():
        for server, s in servers.items():
            lines.append(
                f"| {category} | {server} | {s['questions']} | {s['accuracy']:.0%} ({s['right']}) "
                f"| {s['no_call_rate']:.0%} ({s['no_call']}; {s['call_in_text']} in text, {s['right_in_text']} right) "
                f"| {s['invalid_rate']:.0%} ({s['invalid']}) | {s['wrong']} | {s['rejected']} "
                f"| {s['median_seconds']:.1f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=store.DEFAULT_MODEL)
    parser.add_argument("--categories", default=DEFAULT_CATEGORIES, help=f"comma-separated, of {', '.join(CATEGORIES)}")
    parser.add_argument(
        "--per-category", type=int, default=12, help="questions per category, evenly spaced (default 12: ~25 min here)"
    )
    parser.add_argument("--full", action="store_true", help="every question of each category")
    parser.add_argument("--max-tokens", type=int, default=400, help="per reply (BFCL's parallel calls need ~200)")
    parser.add_argument("--tool-choice", choices=("auto", "required"), default="auto")
    parser.add_argument(
        "--parallel",
        choices=("unset", "on", "off"),
        default="unset",
        help="parallel_tool_calls: unset (not sent: OpenAI's default allows them), on (true), off (false)",
    )
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        help="coreai serve's default repetition penalty (`--repetition-penalty`; unset: none)",
    )
    parser.add_argument("--data", type=Path, default=DATA, help="the BFCL data folder (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bfcl.json")
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help="comma-separated servers to run (default both; '' with --reuse)"
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        action="append",
        default=[],
        help="an earlier results file (repeatable): the answers of the servers not run are taken from it",
    )
    args = parser.parse_args(argv)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()]
    run = [s.strip() for s in args.servers.split(",") if s.strip()]
    if (not run and not args.reuse) or any(s not in SERVERS for s in run):
        parser.error(
            f"--servers: comma-separated, of {', '.join(SERVERS)} (none only with --reuse); got {args.servers!r}"
        )
    if missing := [str(f) for f in args.reuse if not f.is_file()]:
        parser.error(f"--reuse: no file {missing[0]}")
    if not args.data.is_dir():
        parser.error(f"no BFCL data at {args.data} (set $COREAI_SHARED_DATA or --data)")
    try:
        entries = {c: sample(load_category(args.data, c), None if args.full else args.per_category) for c in categories}
    except ValueError as e:
        parser.error(str(e))

    folder = store.ensure(args.model) if not Path(args.model).is_dir() else Path(args.model)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    settings = {"model": args.model, "max_tokens": args.max_tokens}
    parallel = {"unset": None, "on": True, "off": False}[args.parallel]
    results = {c: {s: [] for s in SERVERS if s in run} for c in categories}
    reused, reused_servers = {}, [s for s in SERVERS if s not in run]
    if args.reuse:
        try:
            reused = reused_answers(args.reuse, reused_servers, entries, settings)
        except ValueError as e:
            parser.error(f"--reuse: {e}")
        for category, answers in reused.items():
            results[category].update(answers)
    report = {
        **settings,
        "dtype": "float32",
        "tool_choice": args.tool_choice,
        "parallel_tool_calls": args.parallel,
        "repetition_penalty_coreai": args.repetition_penalty,
        "temperature": 0,
        "sample": "full" if args.full else f"{args.per_category} per category, evenly spaced",
        "commit": commit,
        "servers_run": run,
        "reused": {"from": [str(f) for f in args.reuse], "servers": reused_servers} if reused else None,
        "load_average_before": os.getloadavg(),
        "complete": False,
        "results": results,
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        import httpx
        import openai

        servers = {}
        if "coreai" in run:
            serve = ["serve", str(folder), "--port", "{port}", "--dtype", "float32"]
            if args.repetition_penalty is not None:
                serve += ["--repetition-penalty", str(args.repetition_penalty)]
            ours = stack.enter_context(_Server(CODE_COREAI, serve))
            name = httpx.get(ours.base + "/v1/models").json()["data"][0]["id"]
            client = openai.OpenAI(base_url=ours.base + "/v1", api_key="-", max_retries=0, timeout=900)
            servers["coreai"] = (client, name)
        if "mlx_lm" in run:
            f32 = _float32_copy(folder, Path(tmp) / "f32")
            mlx_args = ["--model", str(f32), "--port", "{port}", "--temp", "0", "--max-tokens", str(args.max_tokens)]
            theirs = stack.enter_context(_Server(CODE_MLX_LM, mlx_args))
            client = openai.OpenAI(base_url=theirs.base + "/v1", api_key="-", max_retries=0, timeout=900)
            servers["mlx_lm"] = (client, "default_model")
        for category, chosen in entries.items():
            for entry in chosen:
                # One server then the other per question, so a change of load hits both alike.
                for server, (client, model) in servers.items():
                    r = ask(client, model, entry, args.max_tokens, args.tool_choice, parallel)
                    results[category][server].append({"id": entry["id"], **r})
                    tokens = r.get("completion_tokens")
                    print(f"{entry['id']:24s} {server:7s} {r['outcome']:8s} {r['seconds']:6.1f} s {tokens} tokens")
                    # Written after every answer, so a stopped run leaves what it measured.
                    write(report, args.out, time.perf_counter() - started)
    report["complete"] = True
    write(report, args.out, time.perf_counter() - started)
    print()
    print(table(report["summary"]))
    load = report["load_average_before"][0], report["load_average_after"][0]
    print(f"\n{report['wall_seconds'] / 60:.1f} min; load average {load[0]:.1f} before, {load[1]:.1f} after")
    print(f"written {args.out}")
    return 0


def write(report: dict, out: Path, wall: float) -> None:
    """`report` with its summary (of the servers and categories answered so far) as JSON at `out`."""
    summary = {}
    for category, servers in report["results"].items():
        done = {server: summarize(rs) for server, rs in servers.items() if rs}
        if done:
            summary[category] = done
    report.update(summary=summary, wall_seconds=wall, load_average_after=os.getloadavg())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
