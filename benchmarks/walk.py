"""The walk of a request through the code (issues 35, 58): the files of this project whose code
runs from a request's arrival to the first bitmask fill, in the order they first run (a second,
warm request: imports and grammar compiles done), traced with `threading.settrace` on the real
server app, for a chat `response_format` request, a chat `tools` request, a Messages request with a
tool and a Responses request with a namespace tool (as Codex sends its sub-agent tools).

A file's package is its folder under `coreai/` (`coreai/server` the shell, `coreai/server/openai` a
dialect, `coreai/service`), or `guided`, `runtime`, `recipes` whole. Crossings: the distinct
(caller's package, callee's package) pairs of the walk's calls, the caller being the nearest frame
of this project's code; returns: those whose callee's package was already on the call stack (a call
back into a package the walk had left), each printed with the first call that made it. (The order
in which files first run is printed too, but is no measure of crossings: the request's thread and
the generation worker's interleave in it.)

    python -m benchmarks.walk [--model qwen2.5-coder-0.5b-instruct] [--out benchmarks/results/walk.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1]) + "/"
PKGS = ("coreai/", "guided/", "runtime/", "recipes/")
seen: set[str] = set()
order: list[str] = []
edges: dict[tuple[str, str], bool] = {}  # (caller's package, callee's) -> whether the callee's was on the stack
examples: dict[tuple[str, str], str] = {}  # the same edges -> its first call, "caller file:function -> callee's"
done, armed = threading.Event(), threading.Event()


def tracer(frame, event, arg):
    """Records each project file the first time one of its functions is called."""
    if done.is_set() or not armed.is_set():
        return None
    rel = _project(frame)
    if rel is not None:
        if rel not in seen:
            seen.add(rel)
            order.append(rel)
        callee, stack, first = package(rel), [], None
        back = frame.f_back
        while back is not None:
            if (caller := _project(back)) is not None:
                stack.append(package(caller))
                first = first or f"{caller}:{back.f_code.co_name}"
            back = back.f_back
        if stack and stack[0] != callee:
            edge = (stack[0], callee)
            again = callee in stack
            if again and not edges.get(edge):
                examples[edge] = f"{first} -> {rel}:{frame.f_code.co_name}"
            examples.setdefault(edge, f"{first} -> {rel}:{frame.f_code.co_name}")
            edges[edge] = edges.get(edge, False) or again
        if rel == "guided/bitmask.py" and frame.f_code.co_name == "fill":
            done.set()
    return None


def _project(frame) -> str | None:
    """The path of `frame`'s file relative to the repository, when it is one of this project's."""
    f = frame.f_code.co_filename
    rel = f[len(ROOT) :] if f.startswith(ROOT) else ""
    return rel if rel.startswith(PKGS) else None


def package(path: str) -> str:
    """A file's package: its folder (`coreai/server/openai`), `guided`, `runtime` or `recipes` whole."""
    top = path.split("/", 1)[0]
    return top if top != "coreai" else path.rsplit("/", 1)[0]


def run(body: dict, path: str, model) -> tuple[list[str], dict[tuple[str, str], tuple[bool, str]]]:
    """The files of the walk of `body` posted to `path` (its second time), and its calls from one
    package into another: (caller's, callee's) -> (whether the callee's package was already on the
    stack: a return, a call back into a package the walk had left; a call that shows it)."""
    from fastapi.testclient import TestClient

    from coreai.server import ServerConfig, create_app

    app = create_app(model, ServerConfig(model_name="m", max_tokens=8, temperature=0.0))
    threading.settrace(tracer)
    # A loopback host, or the server's trust check (`coreai.server.trust`) refuses the request.
    with TestClient(app, base_url="http://127.0.0.1") as client:
        warm = client.post(path, json=body)  # warm: imports, grammar compile caches
        if warm.status_code != 200:
            raise SystemExit(f"{path}: {warm.status_code} {warm.text}")
        seen.clear()
        order.clear()
        edges.clear()
        examples.clear()
        done.clear()
        armed.set()
        client.post(path, json=body)
        armed.clear()
    threading.settrace(None)
    return list(order), {edge: (again, examples[edge]) for edge, again in edges.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--out", help="write the walks as JSON here")
    args = parser.parse_args(argv)
    from coreai.api import load

    model = load(args.model)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    user = [{"role": "user", "content": "x"}]
    answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    namespace = {
        "type": "namespace",
        "name": "ns",
        "description": "d",
        "tools": [{"type": "function", **tool["function"]}],
    }
    walks = {
        "chat response_format": ("/v1/chat/completions", {"model": "m", "messages": user, "response_format": answer}),
        "chat tools": (
            "/v1/chat/completions",
            {"model": "m", "messages": user, "tools": [tool], "tool_choice": "required"},
        ),
        "messages tool": (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 8,
                "messages": user,
                "tools": [{"name": "f", "input_schema": schema}],
                "tool_choice": {"type": "any"},
            },
        ),
        "responses namespace tool": (
            "/v1/responses",
            {"model": "m", "input": "x", "tools": [namespace], "tool_choice": "required"},
        ),
    }
    out = {}
    for name, (path, body) in walks.items():
        files, calls = run(body, path, model)
        back = sorted(f"{a} -> {b} ({example})" for (a, b), (again, example) in calls.items() if again)
        out[name] = {
            "files": files,
            "crossings": sorted(f"{a} -> {b}" for a, b in calls),
            "returns": back,
        }
        print(f"{name}: {len(files)} files, {len(calls)} crossings, {len(back)} returns")
        print("  crossings: " + ", ".join(out[name]["crossings"]))
        print("  returns:\n    " + "\n    ".join(back))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
