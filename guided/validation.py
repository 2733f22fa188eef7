"""The final check of JSON output: parse it and validate it against the schema with `jsonschema`,
format assertions on, with each draft's own format functions and a stricter `hostname`, numbers
judged as exact decimals (`guided.schema.numbers`)."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import idna
import regex

from guided.schema.numbers import EXACT_KEYWORDS, EXACT_LEGACY_KEYWORDS, is_exact_integer, loads_exact
from guided.schema.pointer import pointer

if TYPE_CHECKING:
    import jsonschema

# jsonschema is imported on first use: its format checkers import rfc3987_syntax, which builds Lark
# parsers at import time (seconds), and most runs never validate anything.


def _hostname_labels_ok(instance) -> bool:
    """RFC 5890/5891 label rules that jsonschema's `hostname` check (the fqdn package) leaves out:
    "--" in positions 3-4 only in an A-label ("xn--"), and an A-label must decode (the idna package)."""
    if not isinstance(instance, str):
        return True
    for label in instance.split("."):
        if label[2:4] == "--":
            if not label.lower().startswith("xn--"):
                return False
            try:
                idna.decode(label)
            except idna.IDNAError:
                return False
    return True


@functools.cache
def _format_checker(cls) -> jsonschema.FormatChecker:
    """The draft's format checker with a stricter `hostname` (see `_hostname_labels_ok`) and
    `idn-hostname` (`_no_trailing_separator`)."""
    # FormatChecker(names) would look the names up in the registry shared by all drafts, where "time"
    # is draft 3's "%H:%M:%S"; copy this draft's own functions instead.
    import jsonschema

    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
    if "hostname" in checker.checkers:
        base, raises = checker.checkers["hostname"]
        checker.checks("hostname", raises)(lambda value: base(value) and _hostname_labels_ok(value))
    if "idn-hostname" in checker.checkers:
        idn, idn_raises = checker.checkers["idn-hostname"]
        checker.checks("idn-hostname", idn_raises)(lambda value: idn(value) and _no_trailing_separator(value))
    return checker


# Label separators of internationalized host names (RFC 3490 section 3.1): a host name does not end
# with one; jsonschema's idn-hostname check (the idna package) lets a trailing one through.
_SEPARATORS = (".", "\u3002", "\uff0e", "\uff61")


def _no_trailing_separator(instance) -> bool:
    return not isinstance(instance, str) or not instance.endswith(_SEPARATORS)


def check_json(text: str, schema) -> tuple[Any, list[str]]:
    """(parsed value or None, errors): `text` parsed as JSON and validated against `schema` with
    `jsonschema` (format assertions on; numbers as the exact decimals of the text). Errors are
    "<JSON pointer>: <message>"."""
    try:
        exact = loads_exact(text)
    except json.JSONDecodeError as exc:
        return None, [f"not JSON: {exc}"]
    errors = [f"{pointer(e.absolute_path) or '/'}: {e.message}" for e in validator_for(schema).iter_errors(exact)]
    return json.loads(text), errors  # plain floats for the caller


def validator_class(schema) -> Any:
    """The `jsonschema` validator class of `schema`'s draft (2020-12 when it names none), reading
    `pattern` as ECMA 262 does (`_pattern`) and numbers as exact decimals (`_exact_numbers`)."""
    import jsonschema

    return _extended(jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator))


@functools.cache
def _extended(cls) -> type:
    """`cls` with ECMA 262 patterns and exact numbers: `multipleOf` and the bounds compare decimals
    (`guided.schema.numbers`), and from draft 6 on (where 1.0 is an integer) "integer" means an
    exact value with no fractional part (the float 1.0 of "1.0000000000000001" is not one)."""
    import jsonschema

    legacy = "exclusiveMinimum" not in cls.VALIDATORS  # drafts 3 and 4: booleans read by minimum/maximum
    numbers = EXACT_LEGACY_KEYWORDS if legacy else EXACT_KEYWORDS
    keywords = {"pattern": _pattern} | {k: f for k, f in numbers.items() if k in cls.VALIDATORS}
    type_checker = cls.TYPE_CHECKER
    if type_checker.is_type(1.0, "integer"):
        type_checker = type_checker.redefine("integer", lambda checker, instance: is_exact_integer(instance))
    return jsonschema.validators.extend(cls, keywords, type_checker=type_checker)


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


def _pattern(validator, pattern, instance, schema):
    """jsonschema's `pattern` keyword with the `regex` module, which reads the ECMA 262 syntax that
    Python's `re` refuses (`\\p{L}`, `(?<name>...)`) and the grammar engine enforces."""
    import jsonschema

    if validator.is_type(instance, "string") and not _regex(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def validator_for(schema) -> jsonschema.protocols.Validator:
    """A `jsonschema` validator for `schema`: its draft's class, format assertions on (see
    `_format_checker`)."""
    cls = validator_class(schema)
    return cls(schema, format_checker=_format_checker(cls))


def can_validate(schema, keyword: str, value=None) -> bool:
    """True if `validator_for(schema)` checks `keyword` (for "format": the format named `value`)."""
    cls = validator_class(schema)
    if keyword == "format":
        return value in _format_checker(cls).checkers and value not in _NOT_CHECKED_FORMATS
    return _CHECKED_BY.get(keyword, keyword) in cls.VALIDATORS


# Formats jsonschema checks in another dialect: "regex" with Python's `re`, not ECMA 262.
_NOT_CHECKED_FORMATS = frozenset({"regex"})

# Keywords jsonschema checks inside another keyword's validator.
_CHECKED_BY = {"then": "if", "else": "if", "minContains": "contains", "maxContains": "contains"}
