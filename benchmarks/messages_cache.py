"""An agent loop on the Messages API (issue 36): does each turn start from the previous turn's
prefix in the prefix cache? A real server on loopback, the official `anthropic` SDK, a Claude
Code-shaped request (system blocks, a dozen tools), `turns` turns of tool_use -> tool_result; per
turn the prompt tokens, those read from the cache (`cache_read_input_tokens`), those prefilled
(`input_tokens`) and the time to the first streamed event of content.

    python -m benchmarks.messages_cache [--model qwen2.5-coder-0.5b-instruct] [--turns 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = [
    {"type": "text", "text": "You are a coding agent working in a repository.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Read files before you change them. Be concise."},
]


def tools() -> list[dict]:
    """A dozen tools, as a coding agent declares them."""
    names = ["Read", "Write", "Edit", "Glob", "Grep", "Bash", "Ls", "Move", "Delete", "Test", "Lint", "Diff"]
    return [
        {
            "name": name,
            "description": f"{name} a path in the repository.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        }
        for name in names
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "messages_cache.json")
    args = parser.parse_args(argv)

    import anthropic

    from coreai.api import load
    from coreai.server import ServerConfig
    from coreai.server.background import serve_in_thread

    model = load(args.model)
    messages: list[dict] = [{"role": "user", "content": "Find where the version is defined, then read that file."}]
    rows = []
    with serve_in_thread(model, ServerConfig(model_name="m", max_tokens=64, temperature=0.0)) as base:
        client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        for turn in range(args.turns):
            start = time.perf_counter()
            first = None
            with client.messages.stream(
                model="m", max_tokens=64, system=SYSTEM, tools=tools(), tool_choice={"type": "any"}, messages=messages
            ) as stream:
                for event in stream:
                    if first is None and event.type == "content_block_start":
                        first = time.perf_counter() - start
                final = stream.get_final_message()
            u = final.usage
            prompt = u.input_tokens + u.cache_read_input_tokens
            rows.append(
                {
                    "turn": turn + 1,
                    "prompt_tokens": prompt,
                    "cache_read_input_tokens": u.cache_read_input_tokens,
                    "prefilled_tokens": u.input_tokens,
                    "ttft_s": round(first or 0.0, 3),
                }
            )
            print(
                f"turn {turn + 1}: {prompt} prompt tokens, {u.cache_read_input_tokens} from the cache, "
                f"{u.input_tokens} prefilled, first block after {first or 0:.2f} s"
            )
            calls = [b for b in final.content if b.type == "tool_use"]
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
            results = [
                {"type": "tool_result", "tool_use_id": c.id, "content": f"(contents of {c.input})"} for c in calls
            ]
            messages.append({"role": "user", "content": results or "Go on."})
    later = rows[1:]
    saved = sum(r["cache_read_input_tokens"] for r in later) / max(sum(r["prompt_tokens"] for r in later), 1)
    summary = {
        "model": args.model,
        "turns": rows,
        "later_turns_prompt_share_from_cache": round(saved, 3),
        "median_ttft_s_later_turns": statistics.median(r["ttft_s"] for r in later) if later else None,
        "load_average": os.getloadavg()[0],
    }
    print(f"turns 2-{args.turns}: {saved:.1%} of the prompt tokens read from the prefix cache")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
