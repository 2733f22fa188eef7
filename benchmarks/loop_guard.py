"""The loop guard on a tool agent (issue 46): an agent loop as agent frameworks run it (call the
model with the tools, run each call, send the results back, until the model answers or `--rounds`
run out) with the official `anthropic` SDK against a real server on loopback, on the default model at
temperature 0, with and without `--loop-guard`. Per setting: tool calls per task, repeated calls
(identical to one answered before), tasks answered (the final text holds the tool's answer).

    python -m benchmarks.loop_guard [--model qwen2.5-coder-0.5b-instruct] [--rounds 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city: temperature and sky.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
FORECASTS = {
    "oslo": "4 degrees, rain",
    "rome": "19 degrees, sun",
    "paris": "11 degrees, clouds",
    "lima": "22 degrees, fog",
}
TASKS = [
    "What is the weather in Oslo?",
    "Is it sunny in Rome?",
    "How warm is it in Paris?",
    "Tell me the weather in Lima.",
]
SYSTEM = "You answer questions about the weather. Call get_weather, then answer in one sentence."


def run_task(client, question: str, rounds: int) -> dict:
    """One task's agent loop: calls made, repeated calls, whether it answered with the forecast."""
    messages: list[dict] = [{"role": "user", "content": question}]
    calls, seen, repeats = 0, set(), 0
    for _ in range(rounds):
        reply = client.messages.create(model="m", max_tokens=96, system=SYSTEM, messages=messages, tools=[WEATHER])
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            text = "".join(b.text for b in reply.content if b.type == "text")
            answered = any(f.split(",")[0] in text for f in FORECASTS.values())
            return {"calls": calls, "repeats": repeats, "answered": answered, "text": text[:200]}
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        results = []
        for use in uses:
            calls += 1
            key = json.dumps([use.name, use.input], sort_keys=True)
            repeats += key in seen
            seen.add(key)
            city = str(use.input.get("city", "")).strip().lower()
            results.append(
                {"type": "tool_result", "tool_use_id": use.id, "content": FORECASTS.get(city, "unknown city")}
            )
        messages.append({"role": "user", "content": results})
    return {"calls": calls, "repeats": repeats, "answered": False, "text": None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "loop_guard.json")
    args = parser.parse_args(argv)

    import anthropic

    from coreai.api import load
    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    model = load(args.model)
    results: dict = {"model": args.model, "rounds": args.rounds, "settings": {}}
    for guard in (False, True):
        config = ServerConfig(model_name="m", max_tokens=96, temperature=0.0, loop_guard=guard)
        start = time.monotonic()
        with serve_in_thread(model, config) as base:
            client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
            tasks = [run_task(client, q, args.rounds) for q in TASKS]
        name = "loop_guard" if guard else "plain"
        results["settings"][name] = {
            "tasks": tasks,
            "calls_per_task": sum(t["calls"] for t in tasks) / len(tasks),
            "repeats": sum(t["repeats"] for t in tasks),
            "answered": sum(t["answered"] for t in tasks),
            "seconds": round(time.monotonic() - start, 1),
        }
        s = results["settings"][name]
        print(
            f"{name:>10}: {s['calls_per_task']:.2f} calls per task, {s['repeats']} repeated, "
            f"{s['answered']}/{len(TASKS)} answered"
        )
    results["load_average"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
