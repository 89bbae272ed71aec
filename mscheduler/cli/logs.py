"""The command's logging: a text line with the record's ``extra`` fields, or one JSON object a
line (``--log-format json``, python-json-logger) for a log shipper."""

from __future__ import annotations

import logging
from typing import Any

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")

# What every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class TextFormatter(logging.Formatter):
    """The usual line, then ``field=value`` for each ``extra`` field (``key=email:42``), which
    the default formatter drops: they are how a failure names its task."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if not extras:
            return line
        fields = " ".join(f"{k}={_short(v)}" for k, v in extras.items())
        head, newline, rest = line.partition("\n")  # the traceback, if any, stays below
        return f"{head} [{fields}]{newline}{rest}"


def _short(value: Any) -> str:
    text = str(value)
    return text if " " not in text else repr(text)


def configure(level: str, fmt: str) -> None:
    """Both were checked by the caller (`LEVELS`, `FORMATS`)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "{asctime}{levelname}{name}{message}",
                style="{",
                rename_fields={"levelname": "level", "name": "logger", "asctime": "time"},
            )
        )
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
