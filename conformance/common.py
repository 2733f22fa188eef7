"""Shared pieces of the conformance harness: data locations, the real tokenizers, instance
serialization in the form our grammar produces, remote `$ref` bundling, and one case's verdict.

Nothing here touches the network: `remotes/` of the JSON Schema Test Suite is read from disk.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import coreai  # noqa: F401 - loads the system BLAS before mlx.core

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("COREAI_SHARED_DATA", REPO.parent / "shared" / "data"))
SUITE = SHARED_DATA / "json-schema-test-suite"
JSB = SHARED_DATA / "jsonschemabench"
MASKBENCH = JSB / "maskbench"
BASELINES = SHARED_DATA / "llguidance-baselines"
REMOTE_PREFIX = "http://localhost:1234/"
DRAFT_URI = {
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
    "draft7": "http://json-schema.org/draft-07/schema#",
}


def require_data() -> None:
    """Exit with a clear message if the shared data folder is absent."""
    if not SHARED_DATA.is_dir():
        raise SystemExit(f"conformance data not found at {SHARED_DATA} (set COREAI_SHARED_DATA)")


_qwen = {}


def qwen():
    """(hf tokenizer, TokenizerInfo) of the real Qwen2.5-Coder tokenizer (151,936 logits), cached."""
    if "info" not in _qwen:
        from coreai import store
        from guided import get_tokenizer_info
        from runtime import Tokenizer

        folder = store.ensure("qwen2.5-coder-0.5b-instruct")
        config = json.loads((folder / "config.json").read_text())
        tok = Tokenizer(folder, config)
        _qwen.update(tok=tok, info=get_tokenizer_info(tok.hf, config["vocab_size"], tok.eos_ids))
    return _qwen["tok"].hf, _qwen["info"]


def serialize(value, any_whitespace: bool = False) -> str:
    """`value` as our grammar writes it: compact separators (unless any_whitespace), the instance's key
    order, non-ASCII characters as UTF-8 (escaped only when a lone surrogate makes UTF-8 impossible)."""
    seps = (", ", ": ") if any_whitespace else (",", ":")
    text = json.dumps(value, ensure_ascii=False, separators=seps)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, separators=seps)
    return text


def _remote_refs(node, out: set, base: str = "") -> set:
    """Absolute `http://localhost:1234/...` document URLs referenced under `node`, resolving relative
    refs against the enclosing `$id`s (RFC 3986 reference resolution, as `urljoin`)."""
    from urllib.parse import urljoin

    if isinstance(node, dict):
        if isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])
        for k, v in node.items():
            if k in ("$ref", "$dynamicRef") and isinstance(v, str):
                url = urljoin(base, v).split("#")[0]
                if url.startswith(REMOTE_PREFIX):
                    out.add(url)
            else:
                _remote_refs(v, out, base)
    elif isinstance(node, list):
        for v in node:
            _remote_refs(v, out, base)
    return out


def bundle_remotes(schema, draft: str):
    """`schema` with every `http://localhost:1234/...` document it references (transitively) embedded
    under `$defs` (`definitions` for draft 7) with its `$id`, so no resolver ever goes to the network.
    Returns (schema, number of embedded documents). Relative refs inside a remote resolve against its `$id`."""
    if not isinstance(schema, dict):
        return schema, 0
    todo, seen, docs = sorted(_remote_refs(schema, set())), set(), {}
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        path = SUITE / "remotes" / url[len(REMOTE_PREFIX) :]
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        if isinstance(doc, dict):
            doc = dict(doc)
            doc.setdefault("$id", url)
            todo += sorted(_remote_refs(doc, set(), url) - seen)
        docs[url] = doc
    if not docs:
        return schema, 0
    schema = dict(schema)
    key = "definitions" if draft == "draft7" else "$defs"
    defs = dict(schema.get(key, {}))
    for i, (_url, doc) in enumerate(sorted(docs.items())):
        defs[f"__remote{i}"] = doc
    schema[key] = defs
    return schema, len(docs)


def compile_status(schema, info, **options):
    """(status, detail, compiled or None, seconds): status is "compiled", "refused" (an unenforceable
    keyword: detail names it), "unsatisfiable" (a schema no value satisfies, refused at compile time
    with `UnsatisfiableSchema`: right when every instance is invalid) or "error" (invalid schema,
    limits: detail is the message)."""
    from guided import SchemaError, UnsatisfiableSchema, UnsupportedSchemaFeature, compile_grammar, make_spec

    t0 = time.perf_counter()
    try:
        compiled = compile_grammar(make_spec(schema=schema, **options), info)
    except UnsupportedSchemaFeature as exc:
        return "refused", exc.keyword or str(exc)[:120], None, time.perf_counter() - t0
    except UnsatisfiableSchema as exc:
        return "unsatisfiable", str(exc)[:160], None, time.perf_counter() - t0
    except (SchemaError, ValueError) as exc:
        return "error", str(exc)[:160], None, time.perf_counter() - t0
    except Exception as exc:  # an engine panic or anything unexpected: recorded, never hidden
        return "error", f"{type(exc).__name__}: {str(exc)[:150]}", None, time.perf_counter() - t0
    return "compiled", ",".join(sorted({n.keyword for n in compiled.not_enforced})), compiled, time.perf_counter() - t0


def tokenize(hf, info, text: str) -> tuple[list[int], bool]:
    """(token ids, exact): `text` tokenized with the real tokenizer; when the tokenizer's normalizer
    changes the text (Qwen's NFC turns "e" + U+0301 into "é"), the text's own bytes tokenized by the
    engine's copy of the same vocabulary instead (exact=False), so the matcher sees exactly `text`."""
    ids = hf.encode(text, add_special_tokens=False)
    if hf.decode(ids) == text:
        return ids, True
    return list(info.ll_tokenizer.greedy_tokenize(text)), False


def accepts(compiled, tokens: list[int]) -> bool:
    """True if the matcher accepts every token and can end there (EOS allowed), and no value fails
    the checks of validate-and-rollback.

    llguidance 1.9.1 can reject, in a copy of a matcher that has computed a mask (as every template of
    ours has), a valid string it accepts from a matcher that never did (a pattern with bounded
    repetition under maxLength; `tests/test_conformance.py::test_tokens_fed_without_masks`).
    Generation computes a mask before every sampled token and is not affected, so a rejection is
    judged again with a matcher built from the grammar text.
    """
    if not _checks_pass(compiled, tokens):
        return False
    m = compiled.matcher()
    if m.accept_tokens(tokens) and m.is_accepting():
        return True
    from llguidance import LLMatcher

    fresh = LLMatcher(compiled.tokenizer.ll_tokenizer, compiled.spec.grammar, log_level=0)
    return fresh.try_consume_tokens(tokens) == len(tokens) and fresh.is_accepting()


def _checks_pass(compiled, tokens: list[int]) -> bool:
    """False if validate-and-rollback (`compiled.checks`) rejects a value of the output: what
    decoding would have rolled back."""
    if compiled.checks is None:
        return True
    checker = compiled.checks.checker()
    data = b"".join(compiled.tokenizer.ll_tokenizer.decode_bytes([t]) for t in tokens)
    return checker.feed(data) is None and checker.end() is None


def validates(value, schema) -> bool:
    """`jsonschema` verdict (format assertions on, as `guided.check_json`)."""
    from guided import check_json

    try:
        return not check_json(json.dumps(value), schema)[1]
    except Exception:
        return False


def machine() -> dict:
    import importlib.metadata as md

    versions = {}
    for name in (
        "coreai-mlx",
        "llguidance",
        "mlx",
        "mlx-lm",
        "jsonschema",
        "transformers",
        "xgrammar",
        "outlines-core",
        "outlines",
        "torch",
    ):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": platform.machine(),
        "system": platform.system(),
        "processor": platform.processor() or _cpu_name(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.platform()


def md_table(header: list[str], rows: list[list]) -> str:
    """A markdown table; numbers right-aligned."""

    def cell(x):
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---:" if i else "---" for i in range(len(header))) + " |",
    ]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)
