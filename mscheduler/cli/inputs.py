"""What the shell hands the command: durations (``90s``, ``1h30m``, ``1.5h``, ``PT30M``, or
``5``: seconds, as the API takes them), times with their timezone, JSON (extended JSON
included) from an argument, a file (``@FILE``) or stdin (``-``). Each refusal is one line
naming the flag, in the flag's own units (`common.fail`)."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import sys
from typing import Any

from .common import fail

# A compact duration is a run of number-unit pairs (``1h30m``, ``1.5h``, ``500ms``), which is
# ISO 8601's duration with its designators lower-cased and the ``P``/``T`` left out: it is
# rewritten as one (``PT1H30M``) and parsed by pydantic (speedate), like ``PT30M`` itself.
_PAIR = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|[wdhms])", re.IGNORECASE)
_COMPACT = re.compile(rf"(?:{_PAIR.pattern}\s*)+", re.IGNORECASE)
_DATE_UNITS = {"w": "W", "d": "D"}
_TIME_UNITS = {"h": "H", "m": "M", "s": "S"}
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_EXAMPLES = "such as 90s, 15m, 1h30m, 1.5h, 7d, PT30M or 5 (seconds)"


def _iso(text: str) -> str | None:
    """The ISO 8601 duration that ``text`` means, or None if it is no duration. A bare number
    is seconds, as every duration of the API (``delay=5``) is."""
    stripped = text.strip()
    if stripped[:1] in ("P", "p"):
        return stripped.upper()
    if _SECONDS.fullmatch(stripped):
        stripped += "s"
    if not _COMPACT.fullmatch(stripped):
        return None
    date, time, seconds = "", "", None
    for number, unit in _PAIR.findall(stripped):
        unit = unit.lower()
        if unit in _DATE_UNITS:
            date += number + _DATE_UNITS[unit]
        elif unit in ("s", "ms"):  # both are ISO's S, which may be fractional
            seconds = (seconds or 0.0) + float(number) / (1000 if unit == "ms" else 1)
        else:
            time += number + _TIME_UNITS[unit]
    if seconds is not None:
        time += f"{seconds:.3f}".rstrip("0").rstrip(".") + "S"
    return "P" + date + ("T" + time if time else "")


def show_duration(value: dt.timedelta) -> str:
    """A duration as a user would type it back (``1h30m``, ``10ms``, ``0s``)."""
    ms = round(value.total_seconds() * 1000)
    if ms == 0:
        return "0s"
    parts, rest = [], abs(ms)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    if rest:
        parts.append(f"{rest}ms")
    return ("-" if ms < 0 else "") + "".join(parts)


def parse_duration(
    text: str,
    field: str,
    *,
    minimum: dt.timedelta = dt.timedelta(milliseconds=1),
    maximum: dt.timedelta = dt.timedelta(days=3650),
) -> dt.timedelta:
    """A duration within ``[minimum, maximum]``; refused in the flag's units, not the field's
    (``--per 0s``: "per: 0s is shorter than 1ms", not ``per_ms`` or a ``timedelta(0)``).
    Every duration flag of every command goes through here: one grammar for all of them."""
    from pydantic import TypeAdapter, ValidationError

    iso = _iso(text)
    if iso is None:
        fail(f"{field}: {text!r} is not a duration {_EXAMPLES}")
    try:
        value = TypeAdapter(dt.timedelta).validate_python(iso)
    except ValidationError:
        fail(f"{field}: {text!r} is not a duration {_EXAMPLES}")
    if value < minimum:
        fail(f"{field}: {text} is shorter than the minimum, {show_duration(minimum)}")
    if value > maximum:
        fail(f"{field}: {text} is longer than the maximum, {show_duration(maximum)}")
    return value


def parse_time(text: str, field: str) -> dt.datetime:
    """An ISO 8601 time with its timezone (``Z`` or ``+09:00``): a naive one is ambiguous."""
    try:
        moment = dt.datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text.strip()))
    except ValueError:
        fail(f"{field}: {text!r} is not an ISO 8601 time such as 2030-01-01T09:00+09:00")
    if moment.tzinfo is None:
        fail(
            f"{field}: {text!r} has no timezone; add one (2030-01-01T09:00+09:00, or Z for "
            "UTC), or use --delay"
        )
    return moment


def read_text(text: str, field: str) -> str:
    """``@FILE``: the file's content; ``-``: stdin; anything else: itself (as curl does)."""
    if text == "-":
        return sys.stdin.read()
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as file:
                return file.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            fail(f"{field}: cannot read {path!r}: {reason}")
    return text


def parse_json(text: str, field: str) -> Any:
    """Strict JSON: NaN, Infinity and numbers too large for a double (1e999) are refused.
    MongoDB's extended JSON in it, canonical or relaxed, names the BSON values it stands for
    (`encoding.from_extended`): what ``show --json`` prints is published back as it was."""
    from ..encoding import from_extended
    from ..errors import PayloadError

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise ValueError(f"{literal} is out of range for a 64-bit float")
        return value

    try:
        value = json.loads(text, parse_constant=constant, parse_float=number)
    except json.JSONDecodeError as exc:
        fail(f"{field}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
    except ValueError as exc:
        fail(f"{field}: not valid JSON ({exc})")
    try:
        return from_extended(value, field)
    except PayloadError as exc:
        fail(str(exc))
