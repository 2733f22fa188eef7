"""`ValueLookup`: drafts for JSON string values copied from the prompt (issue 29).

Token-level prompt lookup (`runtime.speculative.PromptLookup`) drafts badly where a JSON string
value starts: after `"key":"` the longest suffix match is that punctuation, and what followed it
last time is the previous value (a sure miss); and a value copied from prose is tokenized
differently from its source (`"Margarethe` has no leading space, ` Margarethe` in the text has), so
no token-level match forms until two or three tokens into the value. This drafter looks at the text:

- right after a key (`"customer_name`, the grammar's jump-forward tokens end there) or at an empty
  value (`"customer_name":"`): the key's words as a label in the prompt (case-insensitive; `_`, `-`
  and camelCase as spaces; not a quoted JSON key): "Customer name: Adaeze Okonkwo". A label with a
  colon beats one without, then the last wins; without a colon the value must not start in lower
  case ("IBAN DE89 ..." is a label, "location is ..." a mention). The draft is the separator, the
  rest of the label's line and the closing `","` (the output's own separators once it wrote them);
- right after a key with no label: the separator tokens the output wrote after its last key (the
  model's own split, `":` `"` or `":"`, learnt at the last empty value);
- inside a value (`"customer":"Marg`): the value so far at a word start in the prompt, the first
  occurrence after the previous value's (extraction copies fields in the order of the text), else
  the last one; the draft is the rest of that line (closed as above where the line ends);
- otherwise, or where the text gives nothing: `PromptLookup`, except at a key or an empty value
  where its match does not reach back past the key (it would draft the previous value: nothing is
  drafted, which saves the verify width and keeps the acceptance estimate honest).

Drafts are text, encoded with the tokens of the context back to the key (so BPE merges across the
boundary come out as the model would write them); when those tokens do not come back unchanged the
continuation is encoded on its own. A draft is only a guess: verification keeps the output exact.
"""

from __future__ import annotations

import json
import re

from runtime.speculative import PromptLookup

# A string value being written: "key" : "partial  (no closing quote yet)
_VALUE = re.compile(r'"((?:[^"\\\n]|\\.)*)"[ \t\n]*:[ \t\n]*"((?:[^"\\\n]|\\.)*)$')
# A key being written after `{` or `,`: {"customer_name
_KEY = re.compile(r'[{,][ \t\n]*"([A-Za-z_][\w\- ]{0,63})$')
_SEPARATOR = re.compile(r'"([ \t\n]*:[ \t\n]*)"')  # between a key and a string value
_CLOSING = re.compile(r'"([ \t\n]*,[ \t\n]*)"')  # between a value and the next key
_PAIR = re.compile(r'"((?:[^"\\\n]|\\.)*)"[ \t\n]*:[ \t\n]*"((?:[^"\\\n]|\\.)+)"')
_WORD_SPLIT = re.compile(r"[_\W]+|(?<=[a-z])(?=[A-Z])")
# A value starts with a letter, a digit or one of these (a label followed by ", ..." is a mention)
_VALUE_START = "+-$€£#(\"'"
# An escape the output is in the middle of, at the end of a value written so far: `\` or `\u00`
_OPEN_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*(\\(?:u[0-9a-fA-F]{0,3})?)$")


def _unescape(partial: str) -> tuple[str | None, str]:
    """(the text of a JSON string body written so far, the escape it ends in the middle of, or "").
    The text is None if the body is not valid JSON string content."""
    escape = _OPEN_ESCAPE.search(partial)
    body = partial[: escape.start(1)] if escape else partial
    try:
        return json.loads('"' + body + '"'), escape.group(1) if escape else ""
    except ValueError:
        return None, ""


class ValueLookup:
    """`PromptLookup` with text-level drafts at JSON string values (see the module docstring).

    tokenizer: the model's `runtime.tokenizer.Tokenizer` (encode / decode). lookup: the token-level
    drafter used elsewhere (a fresh `PromptLookup` if None). Not thread-safe; one per generation.
    """

    TAIL = 64  # context tokens decoded to see where in the JSON the text is
    CHARS_PER_TOKEN = 8  # characters taken from the prompt per draft token of a multi-line copy

    def __init__(self, tokenizer, lookup: PromptLookup | None = None):
        self.tokenizer = tokenizer
        self.lookup = lookup or PromptLookup()
        self.source_ids: list[int] = []  # the context at the first proposal: the prompt, in effect
        self.source = ""  # its text, where values are looked up
        self._labels: dict[str, str | None] = {}  # key -> the value after its label in `source`
        self.separator: list[int] = []  # the tokens the output wrote between its last key and value

    def propose(self, context: list[int], n: int) -> list[int]:
        if n < 1 or len(context) < 2:
            return []
        m = len(self.source_ids)
        if not m or len(context) < m or context[:m] != self.source_ids:
            self.source_ids, self.source, self._labels = list(context), self._decode(context), {}
        tail = self._decode(context[-self.TAIL :])
        draft = None
        if "{" in tail or '":' in tail:  # looks like JSON
            if value := _VALUE.search(tail):
                draft = self._in_value(context, tail, value, n)
            elif key := _KEY.search(tail):
                draft = self._after_key(context, tail, key, n)
        return self.lookup.propose(context, n) if draft is None else draft

    # -- the two JSON positions ---------------------------------------------------------------------

    def _in_value(self, context: list[int], tail: str, value: re.Match, n: int) -> list[int] | None:
        key, partial = value.group(1), value.group(2)
        if not partial:
            m, head = self._covering(context, len(tail) - value.end(1))
            if head == tail[value.end(1) :]:  # the separator's own tokens, e.g. ['":', '"'] or ['":"']
                self.separator = context[-m:]
            found = self._label(key)
            if found is None:
                return self._past_key(context, tail, value.start(), n)
            return self._encode(context, tail, value.start(), found + self._closing(tail), n)
        written, escape = _unescape(partial)
        if written is None:
            return None
        continuation = self._copy(written, self._cursor(tail[: value.start()]), n)
        if continuation is None:
            return None
        text, line_end = continuation
        escaped = json.dumps(text, ensure_ascii=False)[1:-1]  # as the value holds it: \n, \", \\
        if not escaped.startswith(escape):  # the escape the output is in the middle of
            return None
        draft = escaped[len(escape) :] + (self._closing(tail) if line_end else "")
        return self._encode(context, tail, value.start(), draft, n)

    def _after_key(self, context: list[int], tail: str, key: re.Match, n: int) -> list[int] | None:
        found = self._label(key.group(1))
        if found is None:  # the value is unknown, the separator the output writes is not
            return self._past_key(context, tail, key.start(), n) or self.separator[:n]
        separators = _SEPARATOR.findall(tail)
        text = '"' + (separators[-1] if separators else ":") + '"' + found + self._closing(tail)
        return self._encode(context, tail, key.start(), text, n)

    def _past_key(self, context: list[int], tail: str, anchor: int, n: int) -> list[int]:
        """PromptLookup's draft if its match reaches back past `anchor` (a repeated structure, whose
        values repeat too), else none."""
        match, end = self.lookup.match(context)
        if match and match > self._covering(context, len(tail) - anchor)[0]:
            return context[end + 1 : end + 1 + n]
        return []

    # -- looking up the prompt text ---------------------------------------------------------------

    def _label(self, key: str) -> str | None:
        """The rest of the line after the key's words used as a label in `source` (None if none)."""
        if key not in self._labels:
            words = [w for w in _WORD_SPLIT.split(key) if w]
            best = None  # (followed by a colon, value): a colon beats none, then the last wins
            if words:
                # not inside a word, nor a quoted JSON key (the output's, a schema's in the prompt)
                label = r'(?<![\w"])' + r"[ _\-]?".join(map(re.escape, words)) + r'(?![\w"])'
                for m in re.finditer(label + r"[ \t]*(:?)[ \t]*([^\n]*)", self.source, re.IGNORECASE):
                    found = m.group(2).rstrip()
                    if found and (found[0].isalnum() or found[0] in _VALUE_START):
                        if not m.group(1) and found[0].islower():  # "location is ...": a mention
                            continue
                        if best is None or m.group(1) or not best[0]:
                            best = (bool(m.group(1)), found)
            self._labels[key] = best[1] if best else None
        return self._labels[key]

    def _copy(self, written: str, cursor: int, n: int) -> tuple[str, bool] | None:
        """`_continuation` of the value written so far (its text, unescaped), else of its part from
        a line start on (a copy whose first line the prompt does not hold: a Write that opens with a
        code fence), longest first; a value holding a newline is a multi-line copy (a file's lines)."""
        starts = [0] + [i + 1 for i, c in enumerate(written) if c == "\n"]
        for start in starts:
            if written[start:].strip():
                found = self._continuation(written[start:], cursor, "\n" in written, n)
                if found is not None:
                    return found
        return None

    def _continuation(self, partial: str, cursor: int, lines: bool, n: int) -> tuple[str, bool] | None:
        """(what follows `partial` at a word start in `source`, whether a line ends there) for its
        first occurrence from `cursor` on, else its last; None if it does not occur. What follows is
        the rest of the line, or with `lines` (a multi-line copy) the next `CHARS_PER_TOKEN * n`
        characters, across line ends."""
        pos = self._word_find(partial, cursor, len(self.source), forward=True)
        if pos < 0:
            pos = self._word_find(partial, 0, cursor + len(partial), forward=False)
        if pos < 0:
            return None
        rest = self.source[pos + len(partial) :]
        if lines:
            return rest[: self.CHARS_PER_TOKEN * n], False
        line = rest.split("\n", 1)[0]
        return line.rstrip(), len(line) < len(rest) or not rest

    def _word_find(self, text: str, start: int, end: int, forward: bool) -> int:
        """The first (last) index in source[start:end] where `text` starts a word, or -1."""
        source, word = self.source, text[0].isalnum()
        while True:
            pos = source.find(text, start, end) if forward else source.rfind(text, start, end)
            if pos < 0 or not word or not self._inside_word(pos):
                return pos
            start, end = (pos + 1, end) if forward else (start, pos + len(text) - 1)

    def _inside_word(self, pos: int) -> bool:
        """Whether source[pos] continues a word or a number (the 2 of "1,249.00" does)."""
        before = self.source[max(0, pos - 2) : pos]
        if not before:
            return False
        if before[-1].isalnum():
            return True
        return before[-1] in ",." and len(before) == 2 and before[0].isdigit() and self.source[pos].isdigit()

    def _cursor(self, before: str) -> int:
        """Where in `source` the last complete string value in `before` ends (0: none found)."""
        pairs = _PAIR.findall(before)
        if not pairs:
            return 0
        pos = self.source.find(pairs[-1][1])
        return pos + len(pairs[-1][1]) if pos >= 0 else 0

    @staticmethod
    def _closing(tail: str) -> str:
        """What the output writes after a string value and before the next key ('","' if unseen)."""
        closings = _CLOSING.findall(tail)
        return '"' + (closings[-1] if closings else ",") + '"'

    # -- text to tokens ---------------------------------------------------------------------------

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def _covering(self, context: list[int], chars: int) -> tuple[int, str]:
        """(m, text): the fewest last tokens of `context` whose text has at least `chars` characters."""
        for m in range(1, min(self.TAIL, len(context)) + 1):
            text = self._decode(context[-m:])
            if len(text) >= chars:
                return m, text
        return m, text

    def _encode(self, context: list[int], tail: str, anchor: int, text: str, n: int) -> list[int]:
        """Tokens of `text` continuing `context`, whose last tokens are tail[anchor:]'s."""
        m, head = self._covering(context, len(tail) - anchor)
        ids = self.tokenizer.encode(head + text, add_special_tokens=False)
        if ids[:m] == context[-m:]:
            return ids[m : m + n]
        return self.tokenizer.encode(text, add_special_tokens=False)[:n]
