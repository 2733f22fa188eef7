"""`coreai launch claude|codex|opencode [-- CLI ARGS]`: an agent CLI against `coreai serve`.

Uses the server answering on --host/--port (`GET /health`), or starts one (`coreai serve MODEL` with
the options given here, in its own process group so the CLI's Ctrl-C does not reach it; its log in
the configuration folder; stopped when the CLI exits), writes the CLI's configuration for it
(`coreai.commands.agent_config`: environment variables and files in a folder of coreai's own, never
the user's config files), then runs the CLI (the project's pinned copy in node_modules/.bin, else
the one on PATH) with the arguments after `--`, and returns its exit code. `--print` writes and
prints the configuration and starts nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from coreai import store
from coreai.commands import agent_config
from runtime.errors import InputError

ROOT = Path(__file__).resolve().parents[2]  # a source checkout: its node_modules holds the pinned CLIs
INSTALL = (
    "run `make install` in a coreai-mlx checkout (npm ci installs the CLIs pinned in package.json), "
    "or install it with npm: {package}"
)
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}


def register(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run Claude Code, Codex or opencode against coreai serve (started if none answers on the port)",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("cli", choices=agent_config.CLIS, help="the agent CLI to run")
    p.add_argument("cli_args", nargs="*", metavar="-- CLI ARGS", help="arguments for the CLI, after --")
    p.add_argument("--host", default="127.0.0.1", help="the server's address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="the server's port (default: %(default)s)")
    p.add_argument(
        "--model",
        help=f"the model a started server serves (default: {store.DEFAULT_MODEL}); with a server already "
        "running, the model it must serve",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=1024,
        help="the server's bound on reply tokens: given to a started server and to the CLI as its output "
        "limit (default: %(default)s, coreai serve's)",
    )
    p.add_argument("--temperature", type=float, help="a started server's default temperature")
    p.add_argument("--repetition-penalty", type=float, help="a started server's default repetition penalty")
    p.add_argument("--loop-guard", action="store_true", help="a started server excludes repeated tool calls")
    p.add_argument(
        "--prompt-cache-dir",
        default=str(store.cache_root() / "prefix"),
        help="a started server keeps its prefix cache here across restarts ('off': not kept; default: %(default)s)",
    )
    p.add_argument(
        "--serve-arg", action="append", default=[], metavar="ARG", help="one more argument for a started coreai serve"
    )
    p.add_argument("--context-window", type=int, help="the model's context in tokens (default: its config.json)")
    p.add_argument(
        "--timeout",
        type=int,
        help="seconds the CLI waits on one request (default: a full context's prefill on this machine, estimated)",
    )
    p.add_argument(
        "--short",
        action="store_true",
        help="the CLI's own options for a shorter prompt and fewer tools (a small model on a CPU)",
    )
    p.add_argument(
        "--config-dir",
        type=Path,
        help="where the CLI's configuration files are written (default: <coreai cache>/launch/CLI-PORT)",
    )
    p.add_argument(
        "--print", action="store_true", help="write and print the configuration (files, environment), start nothing"
    )
    p.set_defaults(func=run)


def find_cli(cli: str) -> str:
    """The CLI's executable: node_modules/.bin in the checkout, else PATH. Raises InputError saying
    how to install it."""
    pinned = ROOT / "node_modules" / ".bin" / cli
    if pinned.exists():
        return str(pinned)
    found = shutil.which(cli)
    if found:
        return found
    raise InputError(f"the {cli} CLI is not installed: " + INSTALL.format(package=f"npm install -g {PACKAGES[cli]}"))


# Seconds /health may take: a server busy preparing a long request answers late (seen: over 10 s
# while a 1.5B model began an agent's request), and a late answer is not "nothing listens".
HEALTH_TIMEOUTS = (5.0, 120.0)


def health(base_url: str, key: str | None) -> dict | None:
    """The server's /health body, or None when nothing listens. A server that takes the connection
    but answers late is asked again with a longer timeout (`HEALTH_TIMEOUTS`). Raises InputError
    when something that is not coreai serve answers, or nothing answers in time."""
    request = urllib.request.Request(f"{base_url}/health")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    for timeout in HEALTH_TIMEOUTS:
        try:
            return _health_body(base_url, request, timeout)
        except TimeoutError:  # connected, no reply yet (a refused or unreachable port is a URLError)
            continue
    raise InputError(
        f"{base_url} takes connections but /health did not answer within {sum(HEALTH_TIMEOUTS):.0f} s: "
        "a busy or stuck server; wait, or use another --port"
    )


def _health_body(base_url: str, request: urllib.request.Request, timeout: float) -> dict | None:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 503:  # a distributed model lost: coreai serve, but not serving
            raise InputError(f"the coreai serve at {base_url} is not serving: {exc.read()[:300]!r}") from None
        raise InputError(
            f"{base_url} answers /health with HTTP {exc.code}: not coreai serve; use another --port"
        ) from None
    except TimeoutError:
        raise
    except (urllib.error.URLError, ConnectionError, OSError):
        return None
    except ValueError:
        raise InputError(f"{base_url} answers /health without JSON: not coreai serve; use another --port") from None
    if not isinstance(body, dict) or "model" not in body:
        raise InputError(f"{base_url} answers /health, but not as coreai serve does; use another --port")
    return body


def serve_command(args) -> list[str]:
    """The `coreai serve` command a launch starts."""
    cmd = [sys.executable, "-m", "coreai", "serve", args.model or store.DEFAULT_MODEL]
    cmd += ["--host", args.host, "--port", str(args.port), "--max-tokens", str(args.max_tokens)]
    if args.cli == "claude":
        cmd += ["--alias", "claude-*"]  # `agent_config.CLAUDE_MODEL`'s note
    if args.temperature is not None:
        cmd += ["--temperature", str(args.temperature)]
    if args.repetition_penalty is not None:
        cmd += ["--repetition-penalty", str(args.repetition_penalty)]
    if args.loop_guard:
        cmd.append("--loop-guard")
    if args.prompt_cache_dir != "off":
        cmd += ["--prompt-cache-dir", args.prompt_cache_dir]
    return cmd + list(args.serve_arg)


def start_server(args, base_url: str, key: str | None, log: Path) -> tuple[subprocess.Popen, dict]:
    """`coreai serve` started (its output in `log`) and waited for until /health answers; the process
    and its /health. Raises InputError with the log's tail when it exits first."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = serve_command(args)
    print(f"coreai launch: starting {' '.join(cmd[2:])} (log: {log})", file=sys.stderr, flush=True)
    with log.open("w") as out:
        server = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        while (body := health(base_url, key)) is None:
            if server.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                raise InputError(f"coreai serve exited with code {server.returncode}: " + " | ".join(tail))
            time.sleep(0.5)
    except BaseException:
        stop_server(server)
        raise
    return server, body


def stop_server(server: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (the server drains), then SIGKILL after `grace` seconds."""
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(grace)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def target_of(args, body: dict, key: str | None) -> agent_config.Target:
    """The Target for the server whose /health is `body`: its reply bound when it says it (a server
    already running may have been started with another --max-tokens), else launch's own."""
    served = body["model"]
    context = args.context_window or agent_config.context_window(args.model, served)
    timeout = args.timeout or agent_config.request_timeout(context)
    bound = body.get("max_tokens") or args.max_tokens
    return agent_config.Target(f"http://{args.host}:{args.port}", served, context, bound, key, timeout)


def check_model(args, body: dict, base_url: str) -> None:
    """A running server must serve --model (by its served name, an alias or the folder's name)."""
    if not args.model:
        return
    names = {body["model"], *body.get("aliases", ())}
    if args.model not in names and Path(args.model).name not in names:
        raise InputError(
            f"the coreai serve at {base_url} serves {body['model']}, not {args.model}: stop it, or use another --port"
        )


def run(args) -> int:
    base_url = f"http://{args.host}:{args.port}"
    key = next((k.strip() for k in os.environ.get("COREAI_API_KEY", "").split(",") if k.strip()), None)
    folder = args.config_dir or store.cache_root() / "launch" / f"{args.cli}-{args.port}"
    cli_args = list(args.cli_args)
    if args.print:
        found = health(base_url, key) or {"model": Path(args.model or store.DEFAULT_MODEL).name}
        check_model(args, found, base_url)
        ids = agent_config.takes_claude_ids(found.get("aliases", ["claude-*"] if "status" not in found else []))
        setup = agent_config.setup(args.cli, target_of(args, found, key), folder, args.short, ids)
        setup.write()
        running = "answering" if "status" in found else "not running: `coreai launch` would start it"
        print(f"# coreai serve at {base_url}: {running}")
        print(setup.describe(args.cli), end="")
        return 0
    program = find_cli(args.cli)  # before a server starts: a missing CLI fails at once
    server, body = None, health(base_url, key)
    if body is None:
        server, body = start_server(args, base_url, key, folder / "serve.log")
    try:
        check_model(args, body, base_url)
        ids = agent_config.takes_claude_ids(body.get("aliases"))
        setup = agent_config.setup(args.cli, target_of(args, body, key), folder, args.short, ids)
        setup.write()
        env = setup.environ()
        if os.path.realpath(env.get("PWD", "")) != os.getcwd():  # opencode takes its project folder from $PWD
            env["PWD"] = os.getcwd()
        return run_cli([program, *setup.args, *cli_args], env)
    finally:
        if server is not None:
            stop_server(server)


def run_cli(command: list[str], env: dict[str, str]) -> int:
    """The CLI run in the foreground; its exit code. Ctrl-C is the CLI's to handle (it interrupts a
    turn): this process ignores it while the CLI runs."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise InputError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
