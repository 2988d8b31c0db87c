"""Integer, number and text helpers every layer shares; a leaf module (no third-party imports, no kvsim ones but
`kvsim.model.errors`, itself stdlib alone, taken only to say a bad argument)."""

import math
from typing import Any, TypeGuard, TypeVar

Number = TypeVar("Number", int, float)


def ceil_div(a: int, b: int) -> int:
    """`cdiv` as vLLM spells it (vllm/utils: cdiv): the number of size-`b` pieces that hold `a`."""
    return -(-a // b)


def underscore_problem(value: object) -> str | None:
    """Why kvsim does not read `value` as a number when it is text Python would read as one although it holds an
    underscore; None for anything else. Python's int() and float() (pydantic's lax mode, YAML 1.1's numbers too)
    skip an underscore between digits: `1_0` is 10, where a slip for 1.0 or 10 is as likely as a digit grouping,
    and JSON (vLLM's config files) and YAML 1.2 read no such number. kvsim reads the digits alone."""
    if not isinstance(value, str) or "_" not in value:
        return None
    for kind in (int, float):
        try:
            number = kind(value)
        except ValueError:
            continue
        return f"a number written with an underscore (Python would read {number!r}); write the digits without it"
    return None


def read_number(text: Any, kind: type[Number]) -> Number:
    """`kind(text)` for a number read from a file or a flag, except that text with an underscore is a `ValueError`
    (`underscore_problem`), and so is text of any character other than ASCII: int() and float() read other
    scripts' digits (`３` is 3.0, `١` 1) and spaces, which no file kvsim reads writes in a number (`ascii_int`).
    An int past a float's range read as a float is ±inf, as the same number as text is (`float('1e400')`), not an
    OverflowError that no caller's `except ValueError` caught (a profile's `alpha_default`, its skew bins)."""
    problem = underscore_problem(text)
    if problem is not None:
        raise ValueError(problem)
    if isinstance(text, str) and not text.isascii():
        raise ValueError(f"{text!r} is no number in ASCII digits")
    if kind is float and isinstance(text, int):  # float() of an int past its range raises OverflowError, where
        return kind(float_or_inf(text))  # float('1e400') of the same number as text is inf: inf here too
    return kind(text)


def float_or_inf(number: int | float) -> float:
    """`float(number)`, or ±inf for an int past a float's range (a YAML or JSON integer of 400 digits)."""
    try:
        return float(number)
    except OverflowError:
        return math.inf if number > 0 else -math.inf


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether a value read from a file (JSON, YAML) is a finite number: an int or a float, not a bool (JSON's
    true), NaN, Infinity or an int past a float's range (`math.isfinite` of one raised OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(float_or_inf(value) if isinstance(value, int) else value)


def ascii_int(text: object) -> int | None:
    """`text` as an integer when it is ASCII digits alone (no sign, space or underscore), else None. `str.isdigit`
    holds more than such a number: a superscript two, which `int()` refuses (a bare ValueError), and other
    scripts' digits (`１`, `١`), which `int()` reads as 1; no file kvsim reads writes those. Digits beyond what
    `int()` converts (`sys.get_int_max_str_digits()`, 4,300 by default) are None too: no count or index has them."""
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # the digit limit: the only text of ASCII digits int() refuses
        return None


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` and `noun`, the noun plural unless the count is 1: `counted(1, "replica")` is '1 replica',
    `counted(4, "replica")` '4 replicas' (`plural` for a noun whose plural is not noun + 's'). A count that is no
    integer of at least 0 (a NumPy one will do), or a noun or plural that is no text, is a `KvsimError` naming it:
    `counted(2, None)` was a TypeError and `counted(None, "replica")` said 'None replicas'."""
    if type(count) is not int or count < 0 or not isinstance(noun, str) or not isinstance(plural, str | None):
        count = _counted_arguments(count, noun, plural)
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _counted_arguments(count: object, noun: object, plural: object) -> int:
    """`count` as an `int` when `counted`'s arguments are what it takes, else the `KvsimError` naming the first
    that is not (the import is here: a leaf module reaches for kvsim's error only to say one)."""
    from kvsim.model.errors import KvsimError, expect_count, shown

    number = expect_count(count, "count", 0, "an integer of at least 0")
    if not isinstance(noun, str):
        raise KvsimError(f"noun={shown(noun)}: expected text")
    if not isinstance(plural, str | None):
        raise KvsimError(f"plural={shown(plural)}: expected text or None")
    return number


def control_character(text: str) -> str | None:
    """The first control character in `text` (a newline, a tab, an escape: Unicode category Cc), or None: a
    name or path kvsim prints is one line of printable text."""
    import unicodedata

    return next((char for char in text if unicodedata.category(char) == "Cc"), None)


DOLLARS_FIXED_POINT = (1e-4, 1e15)  # USD: outside it, a price prints with an exponent


def dollars(usd: float, decimals: int, widen: bool = True) -> str:
    """`usd` as `$1,234.57` with `decimals` decimals, or (`widen`) more where those would show fewer than 3
    significant digits: 3 GPUs at $0.001 an hour read `$0.00/hour` (and $0.0009 per million tokens `$0.001`) under
    a table that says 0.003 (and 0.0009262). A positive amount outside `DOLLARS_FIXED_POINT` prints to 3
    significant digits with an exponent, `$2.73e-322` or `$2.73e+303`, as `{:.4g}` prints it in a table: in fixed
    point a `gpu_hourly_cost` of 1e-320 printed about 300 zeros (or `$0.00`) and one of 1e305 a 300-digit figure."""
    low, high = DOLLARS_FIXED_POINT
    if usd > 0 and not low <= usd < high:
        return f"${usd:.3g}"
    shown = decimals if usd <= 0 or not widen else max(decimals, 2 - math.floor(math.log10(usd)))
    return f"${usd:,.{shown}f}"


def share(fraction: float) -> str:
    """A fraction as a percentage with one decimal (`f"{x:.1%}"`), except a nonzero one that would round to 0.0 %:
    that one keeps two significant digits (5.2e-05 -> "0.0052%"), so a few refused requests of many never read as
    none."""
    if 0 < fraction < 0.0005:
        return f"{fraction * 100:.2g}%"
    return f"{fraction:.1%}"
