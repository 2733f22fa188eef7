"""The walk of a request through the code (issue 35): the files of this project whose code runs
from a chat request's arrival to the first bitmask fill, in the order they first run, for a
`response_format` request and a `tools` request (a second, warm request: imports and grammar
compiles done), traced with `threading.settrace` on the real server app.

    python -m benchmarks.walk [--model qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1]) + "/"
PKGS = ("coreai/", "guided/", "runtime/", "recipes/")
seen: set[str] = set()
order: list[str] = []
done, armed = threading.Event(), threading.Event()


def tracer(frame, event, arg):
    """Records each project file the first time one of its functions is called."""
    if done.is_set() or not armed.is_set():
        return None
    f = frame.f_code.co_filename
    if f.startswith(ROOT) and f[len(ROOT) :].startswith(PKGS):
        rel = f[len(ROOT) :]
        if rel not in seen:
            seen.add(rel)
            order.append(rel)
        if rel == "guided/bitmask.py" and frame.f_code.co_name == "fill":
            done.set()
    return None


def run(body: dict, path: str, model) -> list[str]:
    """The files of the walk of `body` posted to `path` (its second time)."""
    from fastapi.testclient import TestClient

    from coreai.server import ServerConfig, create_app

    app = create_app(model, ServerConfig(model_name="m", max_tokens=8, temperature=0.0))
    threading.settrace(tracer)
    with TestClient(app) as client:
        client.post(path, json=body)  # warm: imports, grammar compile caches
        seen.clear()
        order.clear()
        done.clear()
        armed.set()
        client.post(path, json=body)
        armed.clear()
    threading.settrace(None)
    return list(order)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    args = parser.parse_args(argv)
    from coreai.api import load

    model = load(args.model)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    user = [{"role": "user", "content": "x"}]
    answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    bodies = {
        "response_format": {"model": "m", "messages": user, "response_format": answer},
        "tools": {"model": "m", "messages": user, "tools": [tool], "tool_choice": "required"},
    }
    for name, body in bodies.items():
        files = run(body, "/v1/chat/completions", model)
        print(f"{name}: {len(files)} files")
        print("  " + " ".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
