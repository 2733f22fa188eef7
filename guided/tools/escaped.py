"""A Lark grammar's language as it is written inside a JSON string: `escaped_lark(definition)` is the
grammar of the JSON-escaped texts of the strings `definition` accepts.

A custom tool's input rides in a JSON envelope in the hermes-style formats (`{"name": N,
"arguments": {"input": "S"}}`), where a model writes a newline as the two characters `\\n`, a
quote as `\\"` and a backslash as `\\\\`. The input's grammar holds real newlines, so it is applied
to the text those escapes stand for: every terminal of the grammar is mapped through JSON's escaping
(a string homomorphism, so the image of the context-free language is the language of the mapped
grammar), and the decoded string (`json.loads`) is the input, in the original language.

The escaping is the canonical one (`json.dumps`'s, minus `\\/` and `\\u` for printable text):
`"` -> `\\"`, `\\` -> `\\\\`, newline, carriage return, tab, backspace and form feed -> `\\n`,
`\\r`, `\\t`, `\\b`, `\\f`, other characters below U+0020 -> `\\u00xx`; every other character is
itself. Mapped are: string literals (`"..."`, `"..."i`), regex literals (`/.../flags`, read with
Python's regex parser: literals, classes, `.`, groups, alternations, repeats, `\\d \\w \\s`),
and `%import common.X` of the terminals that hold escaped characters (`LF`, `CR`, `NEWLINE`,
`WS`, `WS_INLINE`). Raises `InputError` ("tools") for a regex feature the mapping cannot carry
(backreferences, lookarounds, anchors inside a terminal).
"""

from __future__ import annotations

import re
import re._constants as sre_c  # Python's regex parser (3.11+)
import re._parser as sre_parse

from runtime.errors import InputError

SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
SPECIAL = [chr(c) for c in range(0x20)] + ['"', "\\"]  # the characters JSON writes escaped


def escape(text: str) -> str:
    """`text` as it stands between a JSON string's quotes (the canonical escaping above)."""
    return "".join(SHORT.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 else c) for c in text)


def _rx(c: str) -> str:
    """One character as a Rust-regex atom (llguidance's dialect)."""
    return c if c.isalnum() or c == "_" else f"\\x{{{ord(c):x}}}"


def _literal(text: str) -> str:
    return "".join(_rx(c) for c in text)


PLAIN_CLASS = "[^\\x{22}\\x{5c}\\x{0}-\\x{1f}]"  # the characters written as themselves


CATEGORIES = {"digit": "\\d", "space": "\\s", "word": "\\w"}


def _class(items, negated: bool = False) -> str:
    """The escaped-language regex of a character class (sre items), or of its complement."""
    rust, python = [], []
    for op, av in items:
        if op is sre_c.NEGATE:
            negated = not negated
        elif op is sre_c.LITERAL:
            rust.append(_rx(chr(av)))
            python.append(re.escape(chr(av)))
        elif op is sre_c.RANGE:
            rust.append(f"{_rx(chr(av[0]))}-{_rx(chr(av[1]))}")
            python.append(f"{re.escape(chr(av[0]))}-{re.escape(chr(av[1]))}")
        elif op is sre_c.CATEGORY and str(av).lower().removeprefix("category_") in CATEGORIES:
            rust.append(CATEGORIES[str(av).lower().removeprefix("category_")])
            python.append(rust[-1])
        else:
            raise InputError(
                f"a custom tool's Lark regex class holds {op} {av}, which cannot be JSON-escaped here", "tools"
            )
    hat = "^" if negated else ""
    if rust:
        probe = re.compile(f"[{hat}{''.join(python)}]")
        members = [c for c in SPECIAL if probe.fullmatch(c)]
        alts = [f"[[{hat}{''.join(rust)}]&&{PLAIN_CLASS}]"]
    else:  # `.` with the s flag: anything
        members, alts = (SPECIAL, [PLAIN_CLASS]) if negated else ([], [])
    alts += [_literal(escape(c)) for c in members]
    return "(?:" + "|".join(alts) + ")" if alts else "[^\\x{0}-\\x{10ffff}]"


def _regex(parsed, dotall: bool) -> str:
    out = []
    for op, av in parsed:
        if op is sre_c.LITERAL:
            out.append(_literal(escape(chr(av))))
        elif op is sre_c.NOT_LITERAL:
            out.append(_class([(sre_c.LITERAL, av)], negated=True))
        elif op is sre_c.ANY:
            out.append(_class([] if dotall else [(sre_c.LITERAL, ord("\n"))], negated=True))
        elif op is sre_c.IN:
            out.append(_class(av))
        elif op is sre_c.CATEGORY:
            out.append(_class([(op, av)]))
        elif op is sre_c.SUBPATTERN:  # (group, flags added, flags removed, pattern)
            inner = (dotall or bool(av[1] & re.S)) and not av[2] & re.S
            out.append("(?:" + _regex(av[-1], inner) + ")")
        elif op is sre_c.BRANCH:
            out.append("(?:" + "|".join(_regex(alt, dotall) for alt in av[1]) + ")")
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
            low, high, item = av
            bound = "" if high is sre_c.MAXREPEAT else str(high)
            out.append("(?:" + _regex(item, dotall) + "){" + f"{low},{bound}" + "}")
        else:
            raise InputError(f"a custom tool's Lark regex uses {op}, which cannot be JSON-escaped here", "tools")
    return "".join(out)


def _alternatives(items, negated: bool, many: bool) -> str:
    """A class as a Lark expression: its plain characters one regex terminal (`many`: a run of
    them), its escaped members string literals."""
    regex = _class(items, negated)
    if not regex.startswith("(?:[["):
        return "/" + regex + "/"  # nothing plain: the escapes alone, one terminal
    plain = regex[3:-1].split("|")[0]
    members = _members(items, negated)
    literals = [_as_lark_string(escape(c)) for c in members if c in SHORT]
    codes = [f"{ord(c):02x}" for c in members if c not in SHORT]  # written \u00xx: one terminal
    if codes:
        literals.append("/\\\\u00(?:" + "|".join(codes) + ")/")
    return "(" + " | ".join(["/" + plain + ("+" if many else "") + "/", *literals]) + ")"


def _members(items, negated: bool) -> list[str]:
    rust = _class(items, negated)
    return [c for c in SPECIAL if _literal(escape(c)) in rust.split("|")[1:] or _literal(escape(c)) + ")" in rust]


CLASSES = (sre_c.IN, sre_c.ANY, sre_c.NOT_LITERAL, sre_c.CATEGORY)


def _class_items(op, av, dotall: bool):
    """A class-like regex item as (items, negated)."""
    if op is sre_c.IN:
        return av, False
    if op is sre_c.ANY:
        return ([] if dotall else [(sre_c.LITERAL, ord("\n"))]), True
    if op is sre_c.NOT_LITERAL:
        return [(sre_c.LITERAL, av)], True
    return [(op, av)], False


def _rule(parsed, dotall: bool) -> str:
    """The Lark expression (rules, not one terminal) of the JSON-escaped texts `parsed` matches: the
    parser, not the greedy lexer, then splits plain text from escapes (a regex terminal holding `\\t`
    would swallow the backslash of a following `\\n`)."""
    out: list[str] = []
    run = ""
    for op, av in list(parsed) + [(None, None)]:
        if op is sre_c.LITERAL:
            run += chr(av)
            continue
        if run:
            out.append(_as_lark_string(escape(run)))
            run = ""
        if op is None:
            break
        if op in CLASSES:
            items, negated = _class_items(op, av, dotall)
            out.append(_alternatives(items, negated, many=False))
        elif op is sre_c.SUBPATTERN:
            inner = (dotall or bool(av[1] & re.S)) and not av[2] & re.S
            out.append("(" + _rule(av[-1], inner) + ")")
        elif op is sre_c.BRANCH:
            out.append("(" + " | ".join(_rule(alt, dotall) for alt in av[1]) + ")")
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
            low, high, item = av
            single = list(item)
            if len(single) == 1 and single[0][0] in CLASSES and high is sre_c.MAXREPEAT and low <= 1:
                items, negated = _class_items(single[0][0], single[0][1], dotall)
                body = _alternatives(items, negated, many=True)
            else:
                body = "(" + _rule(item, dotall) + ")"
            out.append(_repeat(body, low, high))
        else:
            raise InputError(f"a custom tool's Lark regex uses {op}, which cannot be JSON-escaped here", "tools")
    return " ".join(out) if out else '""'


def _repeat(body: str, low: int, high) -> str:
    unbounded = high is sre_c.MAXREPEAT
    if (low, unbounded) == (0, True):
        return f"{body}*"
    if (low, unbounded) == (1, True):
        return f"{body}+"
    if low > 16 or (not unbounded and high > 16):
        raise InputError(
            "a custom tool's Lark regex repeats more than 16 times, which is not JSON-escaped here", "tools"
        )
    tail = f"{body}*" if unbounded else " ".join([f"{body}?"] * (high - low))
    return " ".join([body] * low + ([tail] if tail else []))


def escaped_rule(pattern: str, flags: str = "") -> str:
    """The Lark expression of the JSON-escaped texts `pattern` (a Lark `/.../` regex, Python
    syntax) matches, for a regex inside a rule. The "i" flag is refused (an escape's letter would
    change case)."""
    if "i" in flags:
        raise InputError("a custom tool's Lark regex with the i flag cannot be JSON-escaped here", "tools")
    try:
        parsed = sre_parse.parse(pattern, re.S if "s" in flags else 0)
    except re.error as exc:
        raise InputError(f"a custom tool's Lark regex /{pattern}/ does not parse: {exc}", "tools") from None
    return "(" + _rule(parsed, "s" in flags) + ")"


def escaped_regex(pattern: str, flags: str = "") -> str:
    """The Rust regex (llguidance's dialect) of the JSON-escaped texts `pattern` (Python syntax, as
    a Lark `/.../` holds it) matches. flags: the Lark regex's flags ("s" makes `.` take newlines;
    "i" is kept on the result)."""
    try:
        parsed = sre_parse.parse(pattern, re.S if "s" in flags else 0)
    except re.error as exc:
        raise InputError(f"a custom tool's Lark regex /{pattern}/ does not parse: {exc}", "tools") from None
    body = _regex(parsed, "s" in flags)
    return f"(?i:{body})" if "i" in flags else body


_STRING_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", '"': '"', "\\": "\\", "/": "/"}


def _lark_string(body: str) -> str:
    """A Lark string literal's value (`body`: between its quotes)."""

    def one(m: re.Match) -> str:
        e = m.group(1)
        if e[0] in "xu":
            return chr(int(e[1:], 16))
        return _STRING_ESCAPES.get(e, "\\" + e)

    return re.sub(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)", one, body)


def _as_lark_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# Lark's `common` terminals that hold characters JSON escapes, as escaped-language definitions.
ESCAPED_COMMON = {
    "LF": '"\\\\n"',
    "CR": '"\\\\r"',
    "NEWLINE": "/(?:(?:\\\\r)?\\\\n)+/",
    "WS_INLINE": "/(?:[ ]|\\\\t)+/",
    "WS": "/(?:[ ]|\\\\[tnrf])+/",
}

HEAD = re.compile(r"^[ \t]*[?!]?([A-Za-z_]\w*)(?:\.-?\d+)?[ \t]*:", re.M)  # a rule's or terminal's definition
TOKEN = re.compile(
    r"(?P<comment>(?:#|//)[^\n]*)"
    r'|(?P<string>"(?:\\.|[^"\\\n])*")(?P<sflags>i?)'
    r"|(?P<regex>/(?:\\.|[^/\\\n])+/)(?P<rflags>[imslux]*)"
    r"|(?P<import>%import\s+common\.(?P<name>[A-Z_]+)[ \t]*(?:->[ \t]*(?P<alias>[A-Z_]+))?)"
    r"|(?P<other>.)",
    re.S,
)


def escaped_lark(definition: str) -> str:
    """`definition` (a Lark grammar, llguidance's dialect) mapped to the JSON-escaped form of its
    language (see the module docstring). Raises `InputError` ("tools") for what cannot be mapped."""
    out = []
    heads = [(h.start(), h.group(1)[:1].isupper()) for h in HEAD.finditer(definition)]
    for m in TOKEN.finditer(definition):
        if m.group("comment") is not None:
            continue
        if m.group("string") is not None:
            value = _lark_string(m.group("string")[1:-1])
            out.append(_as_lark_string(escape(value)) + m.group("sflags"))
        elif m.group("regex") is not None:
            pattern, flags = m.group("regex")[1:-1].replace("\\/", "/"), m.group("rflags")
            terminal = next((upper for start, upper in reversed(heads) if start <= m.start()), False)
            if terminal:  # a terminal's definition holds terminals only: one regex
                out.append("/" + escaped_regex(pattern, flags).replace("/", "\\/") + "/")
            else:
                out.append(escaped_rule(pattern, flags))
        elif m.group("import") is not None:
            name = m.group("name")
            if name in ESCAPED_COMMON:
                out.append(f"{m.group('alias') or name}: {ESCAPED_COMMON[name]}")
            else:
                out.append(m.group("import"))
        else:
            out.append(m.group("other"))
    return "".join(out)
