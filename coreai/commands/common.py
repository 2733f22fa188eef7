"""Arguments and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.errors import InputError


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a clear usage error instead of a traceback later)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_model_args(p) -> None:
    p.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="compute dtype (default: float32 on CPU, stored on Metal)",
    )
    p.add_argument("--cache-dir", help="model cache root (default: $COREAI_HOME or ~/.cache/coreai)")
    p.add_argument("--draft-model", help="a smaller model with the same tokenizer, for --speculative draft")


def add_distributed_args(p) -> None:
    """`--pipeline` and `--rank-timeout`, for a model served across the ranks of `mlx.launch`."""
    from runtime.distributed import DEFAULT_TIMEOUT

    p.add_argument(
        "--pipeline",
        action="store_true",
        help="under mlx.launch: split the model by layers across the ranks (pipeline parallel: memory, not "
        "speed) instead of splitting every layer (tensor parallel, the default)",
    )
    p.add_argument(
        "--rank-timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="under mlx.launch: seconds one exchange between the ranks may take before the model counts as "
        "lost and the process exits (default: %(default)s)",
    )


def add_speculative_arg(p, default: str | None = "off") -> None:
    p.add_argument(
        "--speculative",
        choices=("off", "prompt_lookup", "draft"),
        default=default,
        help="speculative decoding: prompt_lookup (n-gram drafts from the prompt, no extra model) or "
        f"draft (--draft-model); the output is unchanged (default: {default})",
    )


def add_sampling_args(p) -> None:
    # Sampling flags left out take `runtime.SamplingParams`' defaults (greedy), which are declared there.
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")


def add_whitespace_arg(p, what: str = "") -> None:
    """`--whitespace pretty|compact|any` (`guided.spec.WHITESPACES`) and the older `--any-whitespace`,
    which means `--whitespace any`; both land in `args.whitespace` (None: the session's default)."""
    from guided import DEFAULT_WHITESPACE, WHITESPACES

    p.add_argument(
        "--whitespace",
        choices=WHITESPACES,
        help=what + "the JSON layout: pretty (nothing, one space, or one line break and up to 20 spaces of "
        'indentation between tokens), compact ({"a":1}) or any (up to 2 line breaks and 64 spaces) '
        f"(default: {DEFAULT_WHITESPACE}, docs/reports/quality.md)",
    )
    p.add_argument(
        "--any-whitespace", dest="whitespace", action="store_const", const="any", help="the same as --whitespace any"
    )


def add_grammar_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--schema", help="JSON Schema file, or inline JSON, the output must match")
    g.add_argument("--json-object", action="store_true", help="any JSON object")
    g.add_argument("--regex", help="regular expression the output must match")
    g.add_argument("--choice", action="append", help="one allowed output (repeatable)")
    g.add_argument("--grammar", type=Path, help="Lark (.lark) or GBNF (.gbnf) grammar file")
    add_whitespace_arg(p)
    p.add_argument("--no-strict", action="store_true", help="allow properties the schema does not declare")
    p.add_argument(
        "--lenient", action="store_true", help="compile what can be enforced; check the rest after generation"
    )
    p.add_argument(
        "--schema-in-prompt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="put the schema, said in words (keys, types, formats such as YYYY-MM-DD, enums), at the start of "
        "the system message (--schema/--json-object; default: the measured best, docs/reports/quality.md)",
    )
    add_hint_budget_arg(p)
    p.add_argument(
        "--max-reasoning-tokens",
        type=positive_int,
        default=1024,
        help="thinking models: reasoning tokens before the constrained answer is forced (default: %(default)s)",
    )


def cluster(args):
    """The ranks of `mlx.launch` this process belongs to (`runtime.distributed.Cluster`), or None
    without it; from `add_distributed_args`' flags. Raises InputError for --pipeline without ranks."""
    from runtime.distributed import join

    return join(args.pipeline, args.rank_timeout)


def load_model(args, cluster=None):
    """The model of the command's arguments; on a `cluster` this rank's shard of it (a rank other
    than 0 then serves rank 0 with `follow`)."""
    import coreai
    from coreai.store import DEFAULT_MODEL

    if getattr(args, "speculative", None) == "draft" and not args.draft_model:
        raise InputError("--speculative draft needs --draft-model")
    return coreai.load(
        args.model or DEFAULT_MODEL,
        dtype=args.dtype,
        cache_dir=getattr(args, "cache_dir", None),
        draft=args.draft_model,
        cluster=cluster,
    )


def follows(model) -> bool:
    """Whether this process is a rank other than 0 of a distributed model: it only replays rank 0's
    steps (`follow`), no output of its own."""
    return model.cluster is not None and model.cluster.rank != 0


def follow(model) -> int:
    """Replay rank 0's steps on this rank's shard until rank 0 is done; the exit code (0)."""
    from runtime.distributed import follow as follow_leader

    return follow_leader(model.network, model.cluster)


def read_messages(path: Path) -> list[dict]:
    try:
        messages = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read a JSON list of messages ({exc})") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise InputError(f"{path}: expected a JSON list of {{'role': ..., 'content': ...}} messages")
    return messages


def check_sampling(args) -> None:
    """Check the sampling flags (`add_sampling_args`) and `--max-tokens` as the service will, before
    the model load. Raises ParameterError naming the field."""
    from runtime import SamplingParams
    from runtime.sampling import check_max_tokens, given_sampling

    check_max_tokens(args.max_tokens)
    SamplingParams(**given_sampling(args))


def add_hint_budget_arg(p) -> None:
    p.add_argument(
        "--schema-hint-budget",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="the schema said in words takes at most this many prompt tokens: large enums are said by their "
        "size, the last keys left to the grammar (default: guided.schema_prompt.SCHEMA_HINT_BUDGET, 400)",
    )


def check_grammar_args(args) -> None:
    """Raise ValueError for grammar options that do not go together (before the slow model load)."""
    if args.schema_in_prompt and not (args.schema or args.json_object):
        raise InputError("--schema-in-prompt needs --schema or --json-object")


def constraint_options(args) -> dict:
    """The `guided.Constraint` options the grammar flags give every constraint (whitespace, strict,
    lenient, max_reasoning_tokens); checks the flags first."""
    check_grammar_args(args)
    return dict(
        whitespace=args.whitespace,
        strict=not args.no_strict,
        lenient=args.lenient,
        max_reasoning_tokens=args.max_reasoning_tokens,
    )


def answer_of(args) -> tuple[str, dict] | None:
    """(the flag, the `guided.Constraint` options) of the output format the grammar flags ask for
    (`coreai.service.GenerationRequest.answer`), or None for free text."""
    if args.schema:  # inline JSON or a file path: `guided.spec.load_schema` tells them apart
        return "--schema", {"schema": args.schema}
    if args.json_object:
        return "--json-object", {"json_object": True}
    if args.regex:
        return "--regex", {"regex": args.regex}
    if args.choice:
        return "--choice", {"choices": args.choice}
    if args.grammar:
        return "--grammar", {"grammar": Path(args.grammar).read_text()}
    return None


def print_enforcement(outcome, result) -> None:
    """On stderr: the keywords not enforced by the grammar alone (the outcome's enforcement report,
    the tool named for those in calls), and the violations found."""
    from guided import GRAMMAR, summary

    rows = summary(outcome.enforcement)
    by_grammar = sum(n for _, how, n, _ in rows if how == GRAMMAR)
    for keyword, how, _n, pointers in rows:
        if how != GRAMMAR:
            print(f"[{keyword}: {how} at {', '.join(pointers)}]", file=sys.stderr)
    if rows:
        print(f"[{by_grammar} keyword occurrences enforced by the grammar]", file=sys.stderr)
    for violation in result.stats.violations:
        print(f"[violation: {violation}]", file=sys.stderr)


def print_stats(result, finish: str, verbose: bool = False) -> None:
    """One line of figures on stderr, with the outcome's `finish` (`guided.outcome`: "tool_calls"
    for calls, as the server says); `verbose` adds forward passes and the speculative counters."""
    t = result.timings
    extra = f", {result.forced_tokens} jump-forward" if result.forced_tokens else ""
    if verbose:
        extra += (
            f", {result.forward_passes} forward passes ({result.tokens_per_pass:.2f} tokens each), "
            f"{result.accepted_tokens} of {result.drafted_tokens} draft tokens accepted"
        )
    print(
        f"[{result.usage.completion_tokens} tokens{extra}, finish={finish}, TTFT {t.ttft:.2f} s, "
        f"prefill {t.prefill_tps:.1f} tok/s, decode {t.decode_tps:.1f} tok/s, total {t.total:.2f} s, "
        f"peak {t.peak_memory / 2**20:.0f} MiB]",
        file=sys.stderr,
    )
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
