"""Numbers judged exactly, as the decimals JSON writes them.

JSON numbers are decimal text; `json.loads` turns them into binary doubles, and `jsonschema` then
judges `multipleOf` by float division (0.07 / 0.01 = 7.000000000000001, "not a multiple") and the
bounds by float comparison ("0.10000000000000001" == 0.1). Here an instance is read from its text
(`loads_exact`: floats that carry their `decimal.Decimal`), a schema's float from the shortest
decimal that round-trips (`repr`: what the schema's author wrote, unless they gave more than 17
significant digits), and the numeric keywords compare those decimals exactly (`EXACT_KEYWORDS`).
"""

from __future__ import annotations

import functools
import json
import math
from decimal import Context, Decimal
from typing import Any, cast

from guided.schema.walk import subschemas


class ExactFloat(float):
    """A float parsed from JSON text that keeps the text's exact value in `exact` (a finite
    `Decimal`, also where the float overflowed to inf or underflowed to 0)."""

    exact: Decimal

    def __new__(cls, text: str) -> ExactFloat:
        value = super().__new__(cls, text)
        value.exact = Decimal(text)
        return value


def loads_exact(text: str) -> Any:
    """`json.loads(text)` with every non-integer number an `ExactFloat` (integers are exact ints
    already). Raises json.JSONDecodeError as json.loads does."""
    return json.loads(text, parse_float=ExactFloat)


def decimal_of(number) -> Decimal:
    """The exact decimal value of a JSON number: an `ExactFloat`'s text, a float's shortest
    round-trip decimal (`repr`), an int or Decimal as it is. inf/nan give Decimal's own."""
    if isinstance(number, ExactFloat):
        return number.exact
    if isinstance(number, float):
        return Decimal(repr(number))
    return number if isinstance(number, Decimal) else Decimal(number)


def is_multiple(value: Decimal, divisor: Decimal) -> bool:
    """True if `value` is an integer multiple of `divisor` (> 0), exactly. Works on the coefficients
    and exponents, so it needs no precision context and no 10**exponent for huge exponents
    (`1e999999999` is 12 characters of JSON)."""
    if not value.is_finite() or not divisor.is_finite() or divisor == 0:
        return False
    if value == 0:
        return True
    va, vb = value.as_tuple(), divisor.as_tuple()
    ca, cb = int("".join(map(str, va.digits))), int("".join(map(str, vb.digits)))
    shift = cast(int, va.exponent) - cast(int, vb.exponent)  # value / divisor = (ca / cb) * 10**shift
    if shift < 0:  # need cb * 10**-shift | ca, impossible once 10**-shift exceeds ca
        return -shift < len(str(ca)) and ca % (cb * 10**-shift) == 0
    # cb | ca * 10**shift: the factors 2 and 5 of cb are covered by at most log2(cb) powers of 10
    return (ca * 10 ** min(shift, cb.bit_length())) % cb == 0


def is_exact_integer(number) -> bool:
    """A JSON number with no fractional part (`1.0`, `1e400` too), judged on its exact value."""
    if isinstance(number, bool) or not isinstance(number, (int, float, Decimal)):
        return False
    value = decimal_of(number)
    return value.is_finite() and value == value.to_integral_value()


def _multiple_of(validator, divisor, instance, schema):
    import jsonschema

    if validator.is_type(instance, "number") and not is_multiple(decimal_of(instance), decimal_of(divisor)):
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {divisor}")


def _bound(name: str, failed, relation: str):
    """A jsonschema keyword function for bound `name`: an error when `failed(value, bound)`."""

    def keyword(validator, bound, instance, schema):
        import jsonschema

        if validator.is_type(instance, "number") and failed(decimal_of(instance), decimal_of(bound)):
            yield jsonschema.ValidationError(f"{instance!r} is {relation} the {name} of {bound!r}")

    return keyword


def _legacy_bound(name: str, exclusive_key: str, lower: bool):
    """Draft 3/4 `minimum`/`maximum`, made exclusive by a boolean `exclusiveMinimum`/`exclusiveMaximum`."""

    def keyword(validator, bound, instance, schema):
        import jsonschema

        if not validator.is_type(instance, "number"):
            return
        value, limit = decimal_of(instance), decimal_of(bound)
        exclusive = schema.get(exclusive_key, False)
        past = (value < limit if lower else value > limit) or (exclusive and value == limit)
        if past:
            relation = ("less than" if lower else "greater than") + (" or equal to" if exclusive else "")
            yield jsonschema.ValidationError(f"{instance!r} is {relation} the {name} of {bound!r}")

    return keyword


# The numeric keywords of draft 6 and later, exact (`jsonschema._keywords` judges them on floats).
EXACT_KEYWORDS = {
    "multipleOf": _multiple_of,
    "minimum": _bound("minimum", lambda v, b: v < b, "less than"),
    "maximum": _bound("maximum", lambda v, b: v > b, "greater than"),
    "exclusiveMinimum": _bound("minimum", lambda v, b: v <= b, "less than or equal to"),
    "exclusiveMaximum": _bound("maximum", lambda v, b: v >= b, "greater than or equal to"),
}
# Draft 3 and 4, where exclusiveMinimum/exclusiveMaximum are booleans read by minimum/maximum.
EXACT_LEGACY_KEYWORDS = {
    "multipleOf": _multiple_of,
    "divisibleBy": _multiple_of,  # draft 3's name
    "minimum": _legacy_bound("minimum", "exclusiveMinimum", lower=True),
    "maximum": _legacy_bound("maximum", "exclusiveMaximum", lower=False),
}


# -- the engine's side ------------------------------------------------------------------------------
# llguidance reads a schema's numbers as doubles (measured on llguidance 1.9.1). It enforces
# `multipleOf` exactly when it can turn the double into a short decimal (0.01, 0.05, 0.3, 7) and
# refuses it otherwise ("too many digits": 0.07, 0.011); with bounds beside it, it rounds
# bound / multipleOf in floating point (minimum 0.07 with multipleOf 0.01 becomes 8 steps:
# "unsatisfiable"); bounds past 2**53 lose their last digits (exclusiveMinimum 9007199254740993
# admits 9007199254740993); extreme ones (1e20, 5e-324, 1.7976931348623157e308) are refused; and
# an integer between decimal bounds can be refused (1 in [0.5, 1.5]: the engine's range pattern
# refuses a number whose text is a proper prefix of a decimal bound's). `engine_numbers` gives it
# only what it judges exactly and leaves the rest to validate-and-rollback.

# Bounds the engine compares exactly: integers within a double's exact range, decimals of at most 15
# significant digits (a double round-trips those) between 1e-12 and 1e15 in magnitude.
_EXACT_INT = 2**53
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _engine_exact_bound(bound) -> bool:
    value = decimal_of(bound)
    if not value.is_finite():
        return False
    if isinstance(bound, int) or value == value.to_integral_value():
        return abs(value) <= _EXACT_INT
    return len(value.normalize().as_tuple().digits) <= 15 and Decimal("1e-12") <= abs(value) <= Decimal("1e15")


@functools.lru_cache(maxsize=1024)
def _engine_exact_divisor(divisor: Decimal) -> bool:
    """The engine compiles `multipleOf: divisor` (it is exact then; it refuses what it cannot turn
    into a short decimal). Probed once per divisor: microseconds."""
    from llguidance import LLMatcher

    if not 0 < divisor <= _EXACT_INT:
        return False
    grammar = LLMatcher.grammar_from_json_schema(json.dumps({"type": "number", "multipleOf": float(divisor)}))
    return not LLMatcher.validate_grammar(grammar)


_WIDE = Context(prec=80)  # bound / step stays exact for the bounds and divisors kept (<= 2**53, 15 digits)


def _steps(node: dict, step: Decimal) -> tuple[int | None, int | None]:
    """(least, greatest) k with k * step within `node`'s draft 6+ bounds (None: unbounded), exactly."""
    lower = upper = None
    for key in _BOUNDS:
        if not _is_number(node.get(key)):
            continue
        q = _WIDE.divide(decimal_of(node[key]), step)
        if key == "minimum":
            k = int(q.to_integral_value(rounding="ROUND_CEILING"))
        elif key == "exclusiveMinimum":
            k = int(q.to_integral_value(rounding="ROUND_FLOOR")) + 1
        elif key == "maximum":
            k = int(q.to_integral_value(rounding="ROUND_FLOOR"))
        else:
            k = int(q.to_integral_value(rounding="ROUND_CEILING")) - 1
        if key.endswith("inimum"):
            lower = k if lower is None else max(lower, k)
        else:
            upper = k if upper is None else min(upper, k)
    return lower, upper


def _empty_range(node: dict) -> bool:
    """No number (integer, multiple of `multipleOf`) lies within `node`'s bounds, judged exactly."""
    divisor = decimal_of(node["multipleOf"]) if _is_number(node.get("multipleOf")) else None
    step: Decimal | None
    if divisor is not None and divisor > 0 and node.get("type") == "integer":
        scale = -cast(int, divisor.as_tuple().exponent)
        coefficient = int(divisor.scaleb(scale))
        step = Decimal(coefficient // math.gcd(coefficient, 10 ** max(scale, 0))) if scale > 0 else divisor
    else:
        step = divisor if divisor is not None and divisor > 0 else Decimal(1) if node.get("type") == "integer" else None
    if step is not None:
        lower, upper = _steps(node, step)
        return lower is not None and upper is not None and lower > upper
    lows = [(decimal_of(node[k]), k) for k in ("minimum", "exclusiveMinimum") if _is_number(node.get(k))]
    highs = [(decimal_of(node[k]), k) for k in ("maximum", "exclusiveMaximum") if _is_number(node.get(k))]
    return any(lo > hi or (lo == hi and (a != "minimum" or b != "maximum")) for lo, a in lows for hi, b in highs)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Where the engine schema keeps the numeric keywords it was given widened or left out (see `engine_numbers`).
EXACT_KEY = "x-coreai-exact"


def _widened(key: str, value: Decimal, step: Decimal) -> int:
    """An integer bound beyond `value` (outward) by more than `step`: the engine's float rounding of
    bound / multipleOf cannot cross a multiple inside the exact bound."""
    if key.endswith("inimum"):
        return int((value - step).to_integral_value(rounding="ROUND_FLOOR")) - (1 if step else 0)
    return int((value + step).to_integral_value(rounding="ROUND_CEILING")) + (1 if step else 0)


def engine_numbers(schema) -> tuple[Any, tuple[tuple, ...]]:
    """(engine schema, paths): a copy of `schema` for the engine, where every numeric keyword it would
    judge inexactly is widened or left out, its schema path in `paths` for validate-and-rollback:

    - a `multipleOf` it cannot write as a short decimal, and bounds past 2**53 or of more than 15
      significant digits: left out;
    - a decimal bound (its range pattern refuses some numbers inside it), and any bound beside a
      decimal `multipleOf` (bound / multipleOf rounds): the next integer outward, one step further
      beside a `multipleOf`;
    - decimal bounds of an integer schema become its exact integer bounds (exclusiveMaximum 2.5 ->
      maximum 2): no rollback needed.

    The engine schema admits a superset, so no satisfiable schema is refused; under `not`/`if`,
    which the engine leaves out itself, a wider subschema changes nothing. A subschema whose bounds
    admit no number is left as written (the engine refuses it, with the schema's own numbers). Draft
    4 subschemas (boolean exclusiveMinimum/exclusiveMaximum) only lose what is left out, with its
    boolean. A changed subschema keeps its own numeric keywords under `EXACT_KEY` (the engine ignores
    it), so the grammar text, the compiled-grammar cache's key, differs from that of a schema asking
    for the widened bounds themselves. Paths are those of `schema` (the copy has the same keys)."""
    engine = json.loads(json.dumps(schema))
    dropped: list[tuple] = []
    for path, node in list(subschemas(engine)):
        if isinstance(node, dict):
            given = {k: node[k] for k in ("multipleOf", *_BOUNDS) if k in node}
            dropped += [path + (key,) for key in _engine_node(node)]
            if {k: node[k] for k in ("multipleOf", *_BOUNDS) if k in node} != given:
                node[EXACT_KEY] = given
    return engine, tuple(dropped)


def _engine_node(node: dict) -> list[str]:
    """Rewrite one subschema's numeric keywords for the engine, in place (see `engine_numbers`);
    the keywords left to validate-and-rollback."""
    if not any(_is_number(node.get(k)) for k in ("multipleOf", *_BOUNDS)):
        return []
    legacy = any(isinstance(node.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum"))
    if not legacy and node.get("type") in ("number", "integer") and _empty_range(node):
        return []
    dropped = []
    for key in [k for k in ("multipleOf", *_BOUNDS) if _is_number(node.get(k))]:
        value = decimal_of(node[key])
        if not (_engine_exact_divisor(value) if key == "multipleOf" else _engine_exact_bound(node[key])):
            del node[key]
            dropped.append(key)
            if legacy and key in ("minimum", "maximum"):  # its boolean goes with it
                node.pop("exclusive" + key[0].upper() + key[1:], None)
    bounds = [k for k in _BOUNDS if _is_number(node.get(k))]
    if legacy or not bounds:
        return dropped
    origins = {key: [key] for key in bounds}  # engine bound -> the schema's bounds it stands for
    if node.get("type") == "integer":
        lower, upper = _steps(node, Decimal(1))
        for key in bounds:
            del node[key]
        origins = {}
        for key, bound, suffix in (("minimum", lower, "inimum"), ("maximum", upper, "aximum")):
            if bound is not None:
                node[key] = bound
                origins[key] = [k for k in bounds if k.endswith(suffix)]
    divisor = node.get("multipleOf")
    step = Decimal(0) if divisor is None or is_exact_integer(divisor) else decimal_of(divisor)
    for key, keys in origins.items():
        if step or not is_exact_integer(node[key]):
            node[key] = _widened(key, decimal_of(node[key]), step)
            dropped += keys
    return dropped
