"""Which rules of a Lark grammar (llguidance's dialect) can end: a rule is *productive* when some
alternative of it derives a finite text, i.e. every item the alternative requires is a literal, a
regex, a token, an embedded `%json` / `%regex` grammar or a productive rule. A grammar whose `start`
is not productive (`start: "a" start`) admits no finite output, and a reachable rule that is not
(`start: "a" | b` with `b: "c" b`) is a branch the output can enter and never leave: both would
generate until max_tokens instead of failing. llguidance 1.9.1 compiles such grammars without a
word (its matcher just never accepts), so `guided.compiler` asks this module.

The classic productive-symbols fixpoint (Hopcroft & Ullman, *Introduction to Automata Theory*,
"eliminating useless symbols"), over a small reader of the Lark expression syntax: `|`, `( )`,
`[ ]` and the `?` `*` `+` `~ n..m` `{m,n}` suffixes, llguidance's `&` (both sides) and prefix `~`
(a negation, which needs nothing). The check is conservative: text it cannot read (a template rule,
a construct it does not know) counts as productive, so it never refuses a grammar that can end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from guided.errors import GrammarError

_TOKEN = re.compile(
    r"""(?P<space>[ \t\r]+)|(?P<newline>\n)|(?P<comment>//[^\n]*)
    |(?P<string>"(?:[^"\\\n]|\\.)*"i?)|(?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
    |(?P<directive>%[a-z_]+)|(?P<tokenref><\[[^\]\n]*\]>|<[^>\s]+>)
    |(?P<name>[?!]?[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d+)
    |(?P<punct>\.\.|->|[:|()\[\]?*+~&.,{}=])""",
    re.X,
)
_TERMINALS = ("string", "regex", "tokenref", "body")


class _Unreadable(Exception):
    """Text this reader does not know: the check is skipped (conservative)."""


@dataclass
class _Tok:
    kind: str
    text: str
    line_start: bool


def _skip_json(text: str, i: int) -> int:
    """The index after the balanced `{...}` (JSON, strings skipped) starting at text[i]."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    raise _Unreadable("an unclosed { in a directive")


def _tokens(text: str) -> list[_Tok]:
    out, i, line_start = [], 0, True
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            raise _Unreadable(f"unexpected {text[i]!r}")
        kind, value, i = m.lastgroup or "", m.group(), m.end()  # every alternative of _TOKEN is a named group
        if kind == "newline":
            line_start = True
            continue
        if kind in ("space", "comment"):
            continue
        if kind == "directive":  # `%json {...}`, `%regex {...}`, `%llguidance {}`: the body goes with it
            rest = len(text[i:]) - len(text[i:].lstrip(" \t"))
            if text[i + rest : i + rest + 1] == "{":
                end = _skip_json(text, i + rest)
                value, i = text[m.start() : end], end
                out.append(_Tok("body" if not line_start else "statement", value, line_start))
                line_start = False
                continue
            kind = "statement" if line_start else "directive"
        out.append(_Tok(kind, value, line_start))
        line_start = False
    return out


# An expression: ("t",) needs nothing, ("opt", expr) may be left out, ("sym", name), ("seq", [expr]),
# ("alt", [expr]).
_NOTHING = ("t",)


class _Reader:
    def __init__(self, toks: list[_Tok]):
        self.toks, self.i = toks, 0

    def peek(self, k: int = 0) -> _Tok | None:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def take(self, text: str | None = None) -> _Tok:
        tok = self.peek()
        if tok is None or (text is not None and tok.text != text):
            raise _Unreadable(f"expected {text!r}")
        self.i += 1
        return tok

    def at(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "punct" and tok.text in texts

    def alts(self) -> tuple:
        options = [self.seq()]
        while self.at("|"):
            self.take()
            options.append(self.seq())
        return ("alt", options)

    def seq(self) -> tuple:
        items = []
        while self.peek() is not None and not self.at("|", ")", "]") and not self._rule_ends():
            if self.at("->"):  # an alias names the tree node; it derives nothing
                self.take(), self.take()
            elif self.at("&"):  # llguidance's and of lexemes: both sides must match
                self.take()
            else:
                items.append(self.item())
        return ("seq", items)

    def item(self) -> tuple:
        if self.at("~"):  # llguidance's negation of a lexeme: needs nothing of what it negates
            self.take()
            self.atom()
            return _NOTHING
        expr = self.atom()
        while True:
            if self.at("?", "*"):
                self.take()
                expr = ("opt", expr)
            elif self.at("+"):
                self.take()
            elif self.at("~") and (after := self.peek(1)) is not None and after.kind == "number":
                self.take()
                if int(self.take().text) == 0:
                    expr = ("opt", expr)
                if self.at(".."):
                    self.take(), self.take()
            elif self.at("{") and (after := self.peek(1)) is not None and after.kind == "number":
                self.take()
                if int(self.take().text) == 0:
                    expr = ("opt", expr)
                while not self.at("}"):
                    self.take()
                self.take()
            else:
                return expr

    def atom(self) -> tuple:
        tok = self.take()
        if tok.kind == "punct" and tok.text in "([":
            inner = self.alts()
            self.take(")" if tok.text == "(" else "]")
            return inner if tok.text == "(" else ("opt", inner)
        if tok.kind in _TERMINALS:
            if self.at(".."):  # a range "a".."z"
                self.take(), self.take()
            return _NOTHING
        if tok.kind == "name":
            if self.at("{") and ((after := self.peek(1)) is None or after.kind != "number"):  # a template's use
                raise _Unreadable("a template")
            return ("sym", tok.text.lstrip("?!"))
        raise _Unreadable(f"unexpected {tok.text!r}")

    def _rule_ends(self) -> bool:
        """Whether the next rule or a statement (`%ignore ...` at a line's start) begins here."""
        tok = self.peek()
        return tok is not None and (tok.kind == "statement" or self._definition_here())

    def _definition_here(self) -> bool:
        """Whether a rule definition (`name[attrs].prio: ...` at a line's start) begins here."""
        tok = self.peek()
        if tok is None or not tok.line_start or tok.kind != "name":
            return False
        k = 1
        if (t := self.peek(k)) is not None and t.text == "[":
            while (t := self.peek(k)) is not None and t.text != "]":
                k += 1
            k += 1
        if (t := self.peek(k)) is not None and t.text == ".":
            k += 2
        t = self.peek(k)
        return t is not None and t.text in (":", "{")

    def rules(self) -> dict[str, tuple]:
        rules: dict[str, tuple] = {}
        while (tok := self.peek()) is not None:
            if tok.kind == "statement":  # `%ignore X`, `%import ...`, `%llguidance {}`: to the line's end
                self.take()
                while (t := self.peek()) is not None and not t.line_start:
                    self.take()
                continue
            if not self._definition_here():
                raise _Unreadable(f"expected a rule at {tok.text!r}")
            name = self.take().text.lstrip("?!")
            if self.at("["):
                while not self.at("]"):
                    self.take()
                self.take()
            if self.at("."):
                self.take(), self.take()
            if self.at("{"):
                raise _Unreadable("a template rule")
            self.take(":")
            rules[name] = self.alts()
        return rules


def _derives(expr: tuple, productive: set[str], defined: dict) -> bool:
    kind = expr[0]
    if kind in ("t", "opt"):
        return True
    if kind == "sym":  # an undefined name is the engine's to report (or imported): not this check's
        return expr[1] in productive or expr[1] not in defined
    test = all if kind == "seq" else any
    return test(_derives(e, productive, defined) for e in expr[1])


def _names(expr: tuple) -> set[str]:
    if expr[0] == "sym":
        return {expr[1]}
    if expr[0] == "opt":
        return _names(expr[1])
    return set().union(*(_names(e) for e in expr[1])) if expr[0] in ("seq", "alt") else set()


def never_ending_rules(grammar: str) -> list[str]:
    """The rules reachable from `start` that derive no finite text, `start` first if it is one
    ([] when every reachable rule can end, or when the text is not one this reader follows)."""
    try:
        rules = _Reader(_tokens(grammar)).rules()
    except _Unreadable:
        return []
    if "start" not in rules:
        return []
    # A worklist: a rule is evaluated again only when a rule it refers to has become productive.
    users: dict[str, set[str]] = {}
    for name, expr in rules.items():
        for used in _names(expr):
            users.setdefault(used, set()).add(name)
    productive: set[str] = set()
    todo = list(rules)
    while todo:
        name = todo.pop()
        if name not in productive and _derives(rules[name], productive, rules):
            productive.add(name)
            todo.extend(users.get(name, ()))
    reachable, seen, todo = [], set(), ["start"]
    while todo:
        name = todo.pop()
        if name in seen or name not in rules:
            continue
        seen.add(name)
        reachable.append(name)
        todo.extend(sorted(_names(rules[name]) - seen))
    return [name for name in reachable if name not in productive]


def check_ends(grammar: str) -> None:
    """Raise GrammarError when `grammar` (Lark text) admits no finite text, or a rule reachable from
    `start` never ends (`never_ending_rules`), naming the rules."""
    never = never_ending_rules(grammar)
    if not never:
        return
    names = ", ".join(repr(n) for n in never)
    if never[0] == "start":
        raise GrammarError(
            "the grammar admits no finite text: rule 'start' never ends (every alternative needs a rule that "
            f'never ends: {names}); give the recursion a way out, e.g. `start: "a" start | "a"`'
        )
    raise GrammarError(
        f"rule {never[0]!r} never ends (every alternative of it needs a rule that never ends: {names}), so an "
        "output that enters it could never finish; give the recursion a way out"
    )
