"""Operator logs: one access line per completion request, text or JSON, and quiet libraries.

`configure(level, fmt)` sets up the root logger once at start-up (`ppd proxy --log-level
--log-format`). httpx and httpcore are held at WARNING: at INFO they write a line for every
health check and every upstream POST, which buried everything else (631 lines in 3 minutes).

`AccessEntry` collects what one request did as it happens (session, turn, route, reason,
cell, nodes, status, TTFT, duration); `emit()` writes it exactly once, when the reply is done
(for a stream: when the relay closes), on the `ppd.access` logger. In JSON format the fields
are top-level keys, so a log pipeline can filter on route or reason without parsing text.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
import time
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

from proxy.vocabulary import Decision

ACCESS_LOGGER = "ppd.access"
# Libraries whose INFO lines are per request: kept at WARNING whatever --log-level says.
QUIET_LOGGERS = ("httpx", "httpcore", "hpack", "hypercorn.access")

_access = logging.getLogger(ACCESS_LOGGER)


class LogFormat(enum.StrEnum):
    """How log records are written."""

    TEXT = "text"
    JSON = "json"


class LogLevel(enum.StrEnum):
    """The --log-level choices (the logging module's names)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, plus a record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            document.update(fields)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: LogLevel | str = LogLevel.INFO, fmt: LogFormat | str = LogFormat.TEXT,
              stream: Any = None) -> logging.Handler:
    """Send every log record to stderr (or `stream`) at `level`; returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if LogFormat(fmt) is LogFormat.JSON:
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime  # the "Z" in its timestamps
    else:
        formatter = logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LogLevel(level).value.upper())
    # Neither format shows the caller's file and line, thread or process: not collecting them
    # (the logging docs' "Optimization" list) took the access line per request from 5% to ~3%
    # of the proxy's CPU (benchmarks/proxy_overhead, py-spy).
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    return handler


@dataclass(slots=True)
class AccessEntry:
    """What one completion request did; filled in as the request proceeds."""

    endpoint: str
    stream: bool = False
    session: str | None = None
    turn: int | None = None
    route: str | None = None
    reason: str | None = None
    cell: str | None = None  # context_class/workload/qps of a table decision
    prefill: str | None = None
    decode: str | None = None
    status: int | None = None
    ttft_ms: float | None = None
    duration_ms: float | None = None
    completion_tokens: int | None = None
    error: str | None = None
    _emitted: bool = False

    def decided(self, decision: Decision) -> None:
        """The policy's reason, and the table cell of a `ppd` decision."""
        self.reason = decision.reason.value
        if decision.cell is not None:
            cell = decision.cell
            self.cell = f"{cell.context_class.value}/{cell.workload}/{cell.qps:g}"

    def finish(self, status: int, elapsed_s: float, error: str | None = None) -> None:
        """Emit with this status; `elapsed_s` is the duration unless a complete reply already
        set it, `error` the error unless one was already said."""
        self.status = status
        if self.duration_ms is None:
            self.duration_ms = elapsed_s * 1000.0
        self.error = self.error or error
        self.emit()

    def fields(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict (None values left out)."""
        return {name: value for name in _ACCESS_FIELDS
                if (value := getattr(self, name)) is not None}

    def line(self) -> str:
        """The text form: `POST /v1/chat/completions 200 session=... route=local ...`."""
        parts = [f"POST {self.endpoint} {self.status if self.status is not None else '-'}"]
        for key in ("session", "turn", "route", "reason", "cell", "prefill", "decode"):
            value = getattr(self, key)
            if value is not None:
                parts.append(f"{key}={value}")
        for key in ("ttft_ms", "duration_ms"):
            value = getattr(self, key)
            if value is not None:
                parts.append(f"{key}={value:.1f}")
        if self.completion_tokens is not None:
            parts.append(f"tokens={self.completion_tokens}")
        if self.stream:
            parts.append("stream")
        if self.error is not None:
            parts.append(f"error={json.dumps(self.error)}")
        return " ".join(parts)

    def emit(self) -> None:
        """Write the access line (once; later calls do nothing)."""
        if self._emitted:
            return
        self._emitted = True
        if _access.isEnabledFor(logging.INFO):
            level = logging.INFO if (self.status or 500) < 500 else logging.WARNING
            _access.log(level, "%s", self.line(), extra={"fields": self.fields()})


_ACCESS_FIELDS = tuple(f.name for f in dataclass_fields(AccessEntry) if not f.name.startswith("_"))
