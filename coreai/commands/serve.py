"""`coreai serve [MODEL]`: the OpenAI-compatible server on http://HOST:PORT/v1 (OpenAPI at /docs)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

from coreai import store
from coreai.commands import common
from coreai.server.config import ServerConfig  # no FastAPI: `coreai --help` stays quick
from runtime.blas import blas_in_use
from runtime.errors import InputError

log = logging.getLogger("coreai.server")

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def register(sub) -> None:
    defaults = ServerConfig()  # the one source of the server's defaults
    p = sub.add_parser("serve", help="run the OpenAI-compatible server (guided response_format and tools)")
    p.add_argument(
        "model",
        nargs="?",
        default=store.DEFAULT_MODEL,
        help="registry name, MLX folder or Hugging Face repo id (default: %(default)s)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="port (default: %(default)s)")
    p.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` on every route but /health, the page and the docs (visible "
        "in `ps`: prefer $COREAI_API_KEY or --api-key-file)",
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        help="a file of API keys, one a line (# comments); any of them is accepted. $COREAI_API_KEY "
        "(keys separated by commas) adds more",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the server answers to beside its loopback names and addresses and the address "
        "it is reached at (repeatable; '*' allows any: unsafe, opens DNS rebinding)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (http://host:port) whose pages may call the server (repeatable; none by default)",
    )
    p.add_argument(
        "--max-kv-bytes",
        type=int,
        help="bound of the KV cache the running requests may take together, in bytes; a request that does "
        "not fit waits (default: from the machine's memory)",
    )
    p.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="NAME[=MODEL]",
        help="another model name clients may send for the served model (repeatable; a glob such as 'claude-*' "
        "lets Claude Code's model ids through); replies name the model asked for",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=defaults.max_tokens,
        help="default and upper bound of completion tokens per request (default: %(default)s)",
    )
    p.add_argument(
        "--temperature", type=float, default=defaults.temperature, help="default temperature (default: %(default)s)"
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        help="default repetition penalty over the last 64 tokens (> 0; 1 or unset: none), as llama.cpp's "
        "--repeat-penalty; a request's own value wins",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=defaults.max_queue,
        help="requests that may wait while --max-batch generate; more get 429 (default: %(default)s)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=defaults.max_batch,
        help="requests decoding together (continuous batching: one forward pass for all; constrained "
        "and free requests mix); 1 runs them one at a time (default: %(default)s, measured: "
        "see docs/reports/performance.md, continuous batching)",
    )
    p.add_argument(
        "--prompt-cache-bytes",
        type=int,
        default=defaults.prompt_cache_bytes,
        help="bound of the prefix cache in bytes (KV caches of earlier prompts and replies, least "
        "recently used dropped first; a request reuses its longest cached prefix); 0 turns it off "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--prompt-cache-dir",
        default=None,
        metavar="DIR",
        help="keep the prefix cache in DIR across restarts: its newest entries are written there "
        "when the server stops and read back when it starts, so an agent's long prompt is not "
        "prefilled again (default: not kept)",
    )
    p.add_argument(
        "--loop-guard",
        action="store_true",
        help="exclude, by the grammar, a tool call identical (name and arguments) to one the "
        "conversation already answered: a small model that loops must answer or call something new; "
        "and end a reply at its first call repeating an earlier one of it (not sent)",
    )
    p.add_argument(
        "--keep-prompt-markers",
        action="store_true",
        help="leave agent clients' volatile prompt markers (Claude Code's billing line, its total_tokens "
        "countdown) in the prompt; by default they are removed so sessions share one cached prefix",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=defaults.max_body_bytes,
        help="larger request bodies get 413 (default: %(default)s)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=defaults.shutdown_timeout,
        help="seconds running requests get to finish on Ctrl-C before they are cancelled (default: %(default)s)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="compute dtype (default: float32 on the CPU, stored dtype on Metal)",
    )
    p.add_argument(
        "--grammar-journal",
        # The command keeps a journal where the library's default keeps none: a restart of a
        # long-running server is when the compiles it saves add up.
        default=str(store.cache_root() / "grammars"),
        help="folder where compiled grammars are recorded and, at start-up, compiled again in the "
        "background, so a restart does not pay their compile; 'off' disables (default: %(default)s)",
    )
    p.add_argument("--draft-model", help="a smaller model with the same tokenizer, for --speculative draft")
    common.add_speculative_arg(p, default=defaults.speculative)
    common.add_distributed_args(p)
    p.add_argument(
        "--schema-in-prompt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="for response_format json_schema/json_object and structured_outputs json: put the schema, said "
        "in words, at the start of the system message; a request's schema_in_prompt overrides it "
        "(default: the measured best, docs/reports/quality.md)",
    )
    common.add_hint_budget_arg(p)
    common.add_whitespace_arg(p, "for response_format json_schema/json_object and structured_outputs json: ")
    p.set_defaults(func=run)


def api_keys(args) -> tuple[str, ...]:
    """The keys of --api-key, --api-key-file (one a line; blank lines and # comments skipped) and
    $COREAI_API_KEY (comma-separated). Raises InputError for a file that cannot be read or holds none."""
    keys = [args.api_key] if args.api_key else []
    keys += [k.strip() for k in os.environ.get("COREAI_API_KEY", "").split(",") if k.strip()]
    if args.api_key_file is not None:
        try:
            lines = args.api_key_file.read_text().splitlines()
        except OSError as exc:
            raise InputError(f"--api-key-file {args.api_key_file}: {exc.strerror or exc}") from None
        found = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not found:
            raise InputError(f"--api-key-file {args.api_key_file}: no key in it")
        keys += found
    return tuple(keys)


def run(args) -> int:
    keys = api_keys(args)
    if args.host not in LOOPBACK and not keys:
        log.warning("serving on %s without an API key: anyone who can reach this port can use the model", args.host)
    if args.speculative == "draft" and not args.draft_model:
        raise InputError("--speculative draft needs --draft-model")
    config = ServerConfig(  # checks every setting (ParameterError: the CLI names the flag), before the slow load
        api_keys=keys,
        allowed_hosts=tuple(args.allowed_host),
        cors_origins=tuple(args.cors_origin),
        max_kv_bytes=args.max_kv_bytes,
        aliases=tuple(args.alias),
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        repetition_penalty=args.repetition_penalty,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        prompt_cache_bytes=args.prompt_cache_bytes,
        prompt_cache_dir=args.prompt_cache_dir,
        loop_guard=args.loop_guard,
        strip_markers=not args.keep_prompt_markers,
        max_body_bytes=args.max_body_bytes,
        speculative=None if args.speculative == "off" else args.speculative,
        grammar_journal=None if args.grammar_journal == "off" else args.grammar_journal,
        shutdown_timeout=args.shutdown_timeout,
        schema_in_prompt=args.schema_in_prompt,
        schema_hint_budget=args.schema_hint_budget,
        whitespace=args.whitespace,
    )
    # Under mlx.launch only rank 0 serves HTTP; the other ranks replay its steps.
    cluster = common.cluster(args)
    if cluster is not None and cluster.rank != 0:
        return common.follow(common.load_model(args, cluster))
    # Bind before the (slow) model load, so a taken port fails at once and the URL line below means "up".
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    try:
        sock = socket.create_server((args.host, args.port), family=family)
    except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0-65535
        raise InputError(f"cannot listen on {args.host}:{args.port}: {getattr(exc, 'strerror', None) or exc}") from None
    model = common.load_model(args, cluster)
    try:
        return serve(model, config, sock, args)
    finally:
        if model.leader is not None:  # the other ranks wait for rank 0's word that it is done
            model.leader.close()


def serve(model, config: ServerConfig, sock: socket.socket, args) -> int:
    """Serve `model` on `sock` until Ctrl-C / SIGTERM; the exit code."""
    from coreai.server import create_app
    from coreai.server.background import Server

    app = create_app(model, config)
    port = sock.getsockname()[1]  # the port bound (--port 0 picks a free one)
    print(f"coreai serve: {model.name} on http://{args.host}:{port}/v1 (docs at /docs)", flush=True)
    print(f"coreai serve: BLAS {blas_in_use()}", flush=True)  # the compute behind prefill (runtime/blas.py)
    server = Server(app, log_level="info" if args.verbose else "warning")
    try:
        server.run(sockets=[sock])
    finally:
        # Normally done by the lifespan's shutdown, which a second Ctrl-C skips: the threads must be
        # joined before the interpreter exits, or MLX and llguidance are torn down under them.
        app.state.server.stop()
    return 0
