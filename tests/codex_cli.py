"""The real Codex CLI (node_modules/.bin/codex, pinned in package.json) as a test client of
`coreai serve`: `codex exec --json` non-interactively, in an empty workspace with its own HOME and
CODEX_HOME, its config.toml naming a custom model provider on the server's /v1 (`wire_api =
"responses"`, a dummy key, the WebSocket transport on unless told otherwise): the configuration
`coreai launch codex` writes (`coreai.commands.agent_config`), in one home."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from coreai.commands import agent_config

ROOT = Path(__file__).resolve().parents[1]
CODEX = ROOT / "node_modules" / ".bin" / "codex"
KEY_ENV = agent_config.KEY_ENV


def codex_missing() -> str | None:
    """Why the CLI cannot run (None: it can): the tests fail with this, never skip."""
    if not CODEX.exists():
        return f"{CODEX} is missing: run `make install` (npm ci installs the pinned Codex CLI)"
    return None


@dataclass
class CodexRun:
    """One `codex exec --json` run: its exit status, JSONL events and stderr."""

    returncode: int
    events: list[dict] = field(default_factory=list)
    stderr: str = ""

    def items(self, kind: str) -> list[dict]:
        """The completed items of `kind` ("agent_message", "command_execution", "error", ...)."""
        return [e["item"] for e in self.events if e.get("type") == "item.completed" and e["item"].get("type") == kind]

    @property
    def errors(self) -> list[str]:
        """Error events and error items (the turn's failures, reconnects and warnings)."""
        out = [e.get("message", "") for e in self.events if e.get("type") in ("error", "turn.failed")]
        out += [e.get("error", {}).get("message", "") for e in self.events if e.get("type") == "turn.failed"]
        return out + [i.get("message", "") for i in self.items("error")]

    @property
    def completed(self) -> bool:
        return any(e.get("type") == "turn.completed" for e in self.events)


def config_toml(base_url: str, model: str, websockets: bool = True, extra: str = "") -> str:
    """A Codex config naming the server as its model provider (`coreai launch`'s, from
    `coreai.commands.agent_config`, without a catalog unless `extra` names one), no retries, an
    hour's idle bound (a CPU prefill of Codex's prompt can outlast the default 5 minutes)."""
    config = agent_config.codex_config(agent_config.Target(base_url, model, timeout=3600), None, websockets, extra)
    return config + "request_max_retries = 0\nstream_max_retries = 0\n"


# What Qwen2.5 is trained with, then one line on the shell: the 0.5B model then calls exec_command.
INSTRUCTIONS = (
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant. You cannot see files: read them "
    "with exec_command (cmd: cat FILE) before answering."
)


def model_catalog(model: str, context_window: int = 32768) -> dict:
    """`agent_config.codex_catalog` with `INSTRUCTIONS`."""
    return agent_config.codex_catalog(model, context_window, INSTRUCTIONS)


def short_config(tmp: Path, model: str, instructions: str = INSTRUCTIONS) -> str:
    """Codex's own configuration for a short prompt (`agent_config.CODEX_SHORT`: `coreai launch
    --short`'s), its instructions and model catalog written in `tmp`: top-level config lines."""
    path, catalog = tmp / "instructions.md", tmp / "catalog.json"
    path.write_text(instructions)
    catalog.write_text(json.dumps(agent_config.codex_catalog(model, 32768, instructions)))
    return f"model_catalog_json = {json.dumps(str(catalog))}\n" + agent_config.CODEX_SHORT.format(instructions=path)


def codex_exec(
    base_url: str,
    model: str,
    prompt: str,
    tmp: Path,
    *,
    websockets: bool = True,
    extra_config: str = "",
    files: dict[str, str] | None = None,
    timeout: float = 600,
    key: str = "unused",
    resume: bool = False,
) -> CodexRun:
    """Run `codex exec --json --skip-git-repo-check -s read-only PROMPT` in `tmp/work` (holding
    `files`), HOME `tmp/home`. extra_config: more top-level config.toml lines. resume: continue
    the last session of this HOME (`exec resume --last`), as a next turn."""
    home, work = tmp / "home", tmp / "work"
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (work / name).write_text(text)
    (home / ".codex" / "config.toml").write_text(config_toml(base_url, model, websockets, extra_config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env |= {"HOME": str(home), "CODEX_HOME": str(home / ".codex"), KEY_ENV: key, "NO_COLOR": "1"}
    cmd = [str(CODEX), "exec", "--json", "--skip-git-repo-check", "-s", "read-only", "-C", str(work)]
    cmd += ["resume", "--last", prompt] if resume else [prompt]
    done = subprocess.run(
        cmd, env=env, cwd=work, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    events = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return CodexRun(done.returncode, events, done.stderr)


def codex_binary() -> Path | None:
    """The native Codex executable the npm package runs (node_modules/@openai/codex-<platform>)."""
    found = sorted((ROOT / "node_modules" / "@openai").glob("codex-*/vendor/*/bin/codex"))
    return found[0] if found else None


def apply_patch(patch: str, cwd: Path) -> subprocess.CompletedProcess:
    """Codex's own `apply_patch` (its binary run as `apply_patch`, as Codex runs it) on `patch` in `cwd`."""
    binary = codex_binary()
    assert binary is not None, codex_missing() or "the native Codex binary is missing: run `make install`"
    return subprocess.run(["apply_patch", patch], executable=binary, cwd=cwd, capture_output=True, text=True)


def recording_proxy(upstream: str, out: Path | None, measure: list | None = None):
    """An ASGI app forwarding `/v1/...` to `upstream` (the HTTP transport: run Codex with
    `websockets=False`), appending each request's path and JSON body to `out` (JSONL): the recorded
    traffic the replay test sends again (tests/data/codex/session.jsonl). measure: a list that gets,
    per request, {"tools": bool, "tool_output": whether it sends a tool's output back (a tool round
    trip), "seconds", "ttft_s" (to the first output item event), "usage"}."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def forward(request: Request):
        import time

        body = await request.body()
        data = json.loads(body or b"null")
        if out is not None:
            with out.open("a") as f:
                f.write(json.dumps({"path": request.url.path, "body": data}) + "\n")
        items = (data or {}).get("input")
        last = items[-1].get("type", "") if isinstance(items, list) and items and isinstance(items[-1], dict) else ""
        row = {"tools": bool((data or {}).get("tools")), "tool_output": last.endswith("call_output")}
        start, row = time.perf_counter(), row | {"ttft_s": None, "usage": None}
        client = httpx.AsyncClient(base_url=upstream, timeout=None)
        req = client.build_request(
            request.method, request.url.path, content=body, headers={"content-type": "application/json"}
        )
        resp = await client.send(req, stream=True)

        async def chunks():
            try:
                async for chunk in resp.aiter_raw():
                    text = chunk.decode(errors="replace")
                    if row["ttft_s"] is None and "response.output_item.added" in text:
                        row["ttft_s"] = round(time.perf_counter() - start, 3)
                    for line in text.splitlines():
                        if line.startswith("data: ") and '"usage"' in line and '"response.' in line:
                            try:
                                row["usage"] = json.loads(line[6:])["response"].get("usage")
                            except (ValueError, KeyError):
                                pass
                    yield chunk
            finally:  # also when Codex leaves the stream before its end: the request still counts
                await resp.aclose()
                await client.aclose()
                if measure is not None:
                    measure.append(row | {"seconds": round(time.perf_counter() - start, 3)})

        kind = resp.headers.get("content-type", "application/json")
        return StreamingResponse(chunks(), status_code=resp.status_code, media_type=kind)

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
