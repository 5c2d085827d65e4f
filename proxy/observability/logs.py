"""Operator logs: one access line per completion request, text or JSON, and quiet libraries.

`configure(level, fmt)` sets up the root logger once at start-up (`ppd proxy --log-level
--log-format`). httpx and httpcore are held at WARNING: at INFO they write a line for every
health check and every upstream POST, which buried everything else (631 lines in 3 minutes).

`AccessEntry` collects what one request did as it happens (session, turn, route, reason,
fallback, costs weighed, cell, nodes, status, TTFT, duration: the reason, fallback and costs
are the reply's x-ppd-* headers, `proxy.shared.explain`); `emit()` writes it exactly once, when
the reply is done (for a stream: when the relay closes), on the `ppd.access` logger. In
JSON format the fields are top-level keys, so a log pipeline can filter on route or reason
without parsing text.

While the logging tree is still the one `configure` set up - the access record would reach
its handler alone, unfiltered, formatted by one of its two formatters - the access line is
written straight to that handler's stream, the same text the logging module would write.
The record, the handler chain and the formatter cost ~10 us a request, 7% of the proxy's CPU
per request at concurrency 64 and 12% at concurrency 1 (benchmarks/proxy_overhead, the P->D
path, access log on against off). Anything else attached (a test's caplog, an operator's
handler or filter) takes the logging module's path, as before.
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

from proxy.shared.explain import Fallback, costs_text
from proxy.shared.vocabulary import Decision

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
        document = _json_document(
            self.formatTime(record, JSON_TIME_FORMAT) + f".{int(record.msecs):03d}Z",
            record.levelname, record.name, record.getMessage(), getattr(record, "fields", None))
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def _json_document(time_text: str, level_name: str, logger: str, message: str,
                   fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"time": time_text, "level": level_name.lower(),
                                "logger": logger, "message": message}
    if isinstance(fields, dict):
        document.update(fields)
    return document


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"

# The handler `configure` installed (None: logging is someone else's).
_installed: logging.StreamHandler[Any] | None = None


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
    global _installed
    _installed = handler
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
    fallback: str | None = None  # why the decided or forced route did not serve it
    costs: str | None = None  # what the policy weighed (`proxy.shared.explain.costs_text`)
    cell: str | None = None  # context_class/workload/qps of a table decision
    prefill: str | None = None
    decode: str | None = None
    status: int | None = None
    ttft_ms: float | None = None
    duration_ms: float | None = None
    completion_tokens: int | None = None
    error: str | None = None
    _emitted: bool = False

    def decided(self, decision: Decision, fell_back: Fallback | None = None) -> None:
        """The policy's reason, the costs it weighed, the table cell of a `ppd` decision,
        and why the route decided did not serve the turn (when it did not)."""
        self.reason = decision.reason  # a StrEnum: its value, written as text
        if decision.costs:
            self.costs = costs_text(decision.costs)
        if fell_back is not None:
            self.fallback = fell_back.reason
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
        for key in ("session", "turn", "route", "reason", "fallback", "costs", "cell",
                    "prefill", "decode"):
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
            if not _write_direct(level, self):
                _access.log(level, "%s", self.line(), extra={"fields": self.fields()})


def _sole_handler() -> logging.StreamHandler[Any] | None:
    """`configure`'s handler, when an access record would reach it alone and unfiltered."""
    handler = _installed
    if handler is None or handler.filters:
        return None
    logger: logging.Logger = _access
    while logger.parent is not None:  # the loggers between ppd.access and the root
        if logger.handlers or logger.filters or not logger.propagate or logger.disabled:
            return None
        logger = logger.parent
    handlers = logger.handlers
    if logger.filters or len(handlers) != 1 or handlers[0] is not handler:
        return None
    return handler


class _SecondStamp:
    """strftime of the current second, computed once a second (the milliseconds vary)."""

    __slots__ = ("_converter", "_format", "_second", "_text")

    def __init__(self, converter: Any, fmt: str) -> None:
        self._converter, self._format = converter, fmt
        self._second, self._text = -1, ""

    def text(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second, self._text = second, time.strftime(self._format,
                                                             self._converter(now))
        return self._text


_text_stamp = _SecondStamp(time.localtime, logging.Formatter.default_time_format)
_json_stamp = _SecondStamp(time.gmtime, JSON_TIME_FORMAT)


def _write_direct(level: int, entry: AccessEntry) -> bool:
    """Write the entry's line as `configure`'s handler would format it; False: not possible
    here (the logging module's path writes it instead)."""
    handler = _sole_handler()
    if handler is None or level < handler.level:
        return False
    formatter = handler.formatter
    now = time.time()
    millis = int((now - int(now)) * 1000)
    level_name = logging.getLevelName(level)
    if type(formatter) is JsonFormatter and formatter.converter is time.gmtime:
        text = json.dumps(_json_document(f"{_json_stamp.text(now)}.{millis:03d}Z", level_name,
                                         ACCESS_LOGGER, entry.line(), entry.fields()),
                          default=str)
    elif (type(formatter) is logging.Formatter and formatter._fmt == TEXT_FORMAT
          and formatter.datefmt is None and formatter.converter is time.localtime):
        text = f"{_text_stamp.text(now)},{millis:03d} {level_name} {ACCESS_LOGGER}: {entry.line()}"
    else:
        return False
    try:
        with handler.lock:  # type: ignore[union-attr]
            handler.stream.write(text + handler.terminator)
            handler.flush()
    except Exception:  # a closed or broken stream: the logging module reports it its way
        return False
    return True


_ACCESS_FIELDS = tuple(f.name for f in dataclass_fields(AccessEntry) if not f.name.startswith("_"))
