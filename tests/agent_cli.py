"""Driving a real agent CLI against a server on loopback, for the agent tests, the recorded-traffic
capture (tests/capture_claude_code.py) and the benchmark (`python -m benchmarks.claude_code`).

- `run_claude(base, workspace, prompt, *args)`: Claude Code (node_modules/.bin/claude, pinned in
  package.json and installed by `make install`) run once non-interactively (`-p ... --output-format
  stream-json`) in `workspace` with its own HOME, its model slots on Claude ids (the server needs
  `--alias 'claude-*'`), no telemetry, no updater; returns an `AgentRun` of its stream-json events.
- `Recorder`: an HTTP server on loopback between the CLI and a server (or a `script` of replies),
  keeping every exchange (method, path, headers, body, status, reply); `scrubbed` takes the keys and
  the machine's paths out of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from coreai.commands import agent_config

ROOT = Path(__file__).resolve().parents[1]
CLAUDE = ROOT / "node_modules" / ".bin" / "claude"
MAIN_MODEL = agent_config.CLAUDE_MODEL
SMALL_MODEL = agent_config.CLAUDE_SMALL_MODEL
MISSING = f"{CLAUDE} is missing: run `make install` (npm ci installs the agent CLIs pinned in package.json)"


def claude_env(base: str, home: Path, essential_only: bool = True) -> dict[str, str]:
    """The environment of a Claude Code run against `base`: `coreai launch claude`'s
    (`coreai.commands.agent_config.claude`) with both model slots on Claude ids, a context of 128k
    tokens (the tiny networks'), an hour's request timeout, its own HOME; `essential_only`: no other
    traffic either (False: the start-up probe `HEAD /api/hello` and side requests too)."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")}
    target = agent_config.Target(base, MAIN_MODEL, context_window=131072, timeout=3600)
    env = agent_config.claude(target, model=MAIN_MODEL, small_model=SMALL_MODEL).environ(keep) | {"HOME": str(home)}
    if not essential_only:
        del env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]
    return env


@dataclass
class AgentRun:
    """One CLI run: exit code, its stream-json events (one JSON object a line), stderr, seconds."""

    returncode: int
    events: list[dict]
    stderr: str
    seconds: float

    @property
    def result(self) -> dict:
        """The closing `result` event ({} if the run printed none)."""
        return next((e for e in reversed(self.events) if e.get("type") == "result"), {})

    def blocks(self, role: str, kind: str) -> list[dict]:
        """The content blocks of type `kind` in the `assistant` / `user` events (`tool_use`, `tool_result`, `text`)."""
        out = []
        for event in self.events:
            if event.get("type") == role and isinstance(content := event["message"].get("content"), list):
                out += [b for b in content if b.get("type") == kind]
        return out

    def describe(self) -> str:
        """The run in a few lines, for an assertion's message."""
        return f"exit {self.returncode}; result {json.dumps(self.result)[:1500]}; stderr {self.stderr[-1500:]}"


def run_claude(
    base: str,
    workspace: Path,
    prompt: str,
    *args: str,
    home: Path | None = None,
    timeout: float = 1800,
    essential_only: bool = True,
) -> AgentRun:
    """Claude Code run once on `prompt` in `workspace` against the server at `base` (see the module
    docstring); `args` are more CLI options (`--system-prompt`, `--tools Read`, `--max-turns 4`);
    `essential_only`: see `claude_env`. Raises FileNotFoundError (`MISSING`) when the CLI is not
    installed, subprocess.TimeoutExpired after `timeout` seconds."""
    if not CLAUDE.exists():
        raise FileNotFoundError(MISSING)
    home = home or workspace.parent / f"{workspace.name}-home"
    home.mkdir(parents=True, exist_ok=True)
    command = [str(CLAUDE), "-p", prompt, "--output-format", "stream-json", "--verbose", *args]
    start = time.monotonic()
    done = subprocess.run(
        command,
        cwd=workspace,
        env=claude_env(base, home, essential_only),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    events = []
    for line in done.stdout.splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return AgentRun(done.returncode, events, done.stderr, time.monotonic() - start)


# ---- recording ---------------------------------------------------------------------------------

DROPPED_HEADERS = {"x-api-key", "authorization", "host", "content-length", "connection", "accept-encoding"}


@dataclass
class Exchange:
    method: str
    path: str  # with its query ("/v1/messages?beta=true")
    headers: dict[str, str]
    body: dict | None
    status: int = 0
    reply: str = ""  # the reply's text (JSON, or the whole SSE stream)
    reply_headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0  # until the reply's end
    started: float = 0.0  # time.monotonic() when the request arrived
    ttft: float | None = None  # seconds until the first content block of a streamed reply (a call: once complete)

    def events(self) -> list[dict]:
        """The reply's server-sent events (data objects), in order."""
        return [json.loads(line[6:]) for line in self.reply.splitlines() if line.startswith("data: ")]

    def usage(self) -> dict:
        """The streamed reply's final usage and stop reason ({} if it has none)."""
        ends = [e for e in self.events() if e.get("type") == "message_delta"]
        return {**ends[-1]["usage"], "stop_reason": ends[-1]["delta"]["stop_reason"]} if ends else {}


Script = Callable[[dict], tuple[list[dict], str]]  # request body -> (content blocks, stop_reason)


@dataclass
class Recorder:
    """A loopback HTTP server keeping each exchange (`exchanges`): forwarded to `upstream` (a
    base URL), or, with `script`, answered by it (a Messages reply built from its blocks)."""

    upstream: str | None = None
    script: Script | None = None
    exchanges: list[Exchange] = field(default_factory=list)

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED_HEADERS}
        body = (
            json.loads(raw) if raw and request.headers.get("content-type", "").startswith("application/json") else None
        )
        exchange = Exchange(request.method, path, headers, body, started=time.monotonic())
        self.exchanges.append(exchange)
        start = time.monotonic()
        if self.script is not None:
            return self._scripted(exchange, start)
        assert self.upstream is not None
        client = httpx.AsyncClient(base_url=self.upstream, timeout=None)
        forwarded = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        upstream = await client.send(
            client.build_request(request.method, path, content=raw, headers=forwarded), stream=True
        )
        exchange.status, exchange.reply_headers = upstream.status_code, dict(upstream.headers)

        async def relay():
            try:
                async for chunk in upstream.aiter_text():
                    exchange.reply += chunk
                    if exchange.ttft is None and "content_block_start" in chunk:
                        exchange.ttft = time.monotonic() - start
                    yield chunk
            finally:
                exchange.seconds = time.monotonic() - start
                await upstream.aclose()
                await client.aclose()

        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)

    def _scripted(self, exchange: Exchange, start: float) -> Response:
        body = exchange.body or {}
        exchange.status = 200
        if not exchange.path.startswith("/v1/messages"):
            exchange.status = 200 if exchange.method == "HEAD" else 404
            return Response(status_code=exchange.status)
        if "count_tokens" in exchange.path:
            exchange.reply = json.dumps({"input_tokens": 1})
            return Response(exchange.reply, media_type="application/json")
        assert self.script is not None
        blocks, stop = self.script(body)
        message = {"id": f"msg_{len(self.exchanges)}", "type": "message", "role": "assistant", "model": body["model"]}
        message |= {"content": [], "stop_reason": None, "stop_sequence": None}
        message["usage"] = {"input_tokens": 1, "output_tokens": 1}
        events: list[dict] = [{"type": "message_start", "message": message}]
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                events.append(
                    {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}
                )
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                events.append({"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events += [
                {"type": "content_block_delta", "index": i, "delta": delta},
                {"type": "content_block_stop", "index": i},
            ]
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 1},
            }
        )
        events.append({"type": "message_stop"})
        exchange.reply = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
        exchange.seconds = time.monotonic() - start
        return Response(exchange.reply, media_type="text/event-stream")

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        """The recorder on a free loopback port; yields its base URL."""
        app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "HEAD", "POST"])])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            thread.join(30)
            sock.close()


def scrubbed(value, paths: dict[str, str]):
    """`value` (JSON data) with each of `paths` (a machine path -> its stand-in) replaced in every
    string, and the CLI's device id zeroed: what a recording keeps."""
    if isinstance(value, dict):
        return {k: scrubbed(v, paths) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v, paths) for v in value]
    if isinstance(value, str):
        for path, stand_in in sorted(paths.items(), key=lambda p: -len(p[0])):
            value = value.replace(path, stand_in)
        return re.sub(r'(device_id\\?":\\?")[0-9a-f]+', r"\g<1>" + "0" * 64, value)
    return value


def fresh_workspace(root: Path, files: dict[str, str]) -> Path:
    """An empty workspace folder under `root` holding `files` (name -> text)."""
    workspace = root / "workspace"
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    for name, text in files.items():
        (workspace / name).write_text(text)
    return workspace
