"""The one reader of completion responses: streamed (SSE) or whole JSON, chat or completions.

The proxy's relay feeds a `ReplyCapture` the bytes it passes through, to learn what D now holds;
the replay client (profiler/replay) parses each `data:` event with `parse_data` and builds the
next turn's history with `assistant_message`. Both sides read a reply the same way, so the
history a client sends back is the history the proxy fingerprinted.

What a reply is: choice 0's text - chat `delta.content` / `message.content`, completions
`text` - and, apart, its reasoning: `reasoning` (vLLM since its late-2025 rename, OpenAI's
guidance for gpt-oss, OpenRouter) or `reasoning_content` (DeepSeek's name, older vLLM). A server
that sends both for compatibility sends the same text twice: it is taken once.

The history rule (docs/architecture.md, "Session tracking"): a later turn's history holds each
earlier reply as `assistant_message(reply)` = {"role": "assistant", "content": reply text};
the reasoning is not sent back (OpenAI's and vLLM's advice for reasoning models; their chat
templates drop earlier turns' reasoning anyway). For the completions API the prompt grows by
the reply text. The proxy's continuation check (proxy/sessions/session.py) compares a
message's role and text only, so a client that echoes extra fields (a `reasoning_content`,
`refusal: null`) still continues its session; a client that pastes the reasoning into
`content` starts a new branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.shared.json_codec import loads

REASONING_FIELDS = ("reasoning", "reasoning_content")
_REASONING, _REASONING_OLDER = REASONING_FIELDS
# What ends an SSE event: a blank line, in any of the three line endings the spec allows.
SSE_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")
# Unparsed streamed bytes a capture keeps before it parses them (`ReplyCapture`).
_PARSE_AT = 64 * 1024
_orjson_loads, _OrjsonError = orjson.loads, orjson.JSONDecodeError


@dataclass(frozen=True, slots=True)
class Delta:
    """What one payload (an SSE `data:` event, or a whole JSON answer) says about choice 0.

    done: the payload was `[DONE]`. error: a message when the payload is an error or malformed.
    """

    text: str = ""
    reasoning: str = ""
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False

    @property
    def has_tokens(self) -> bool:
        """The payload carries generated text (reply or reasoning): a token arrived."""
        return bool(self.text or self.reasoning)


DONE = Delta(done=True)


def _string(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_payload(payload: Any) -> Delta:
    """Choice 0's reply, reasoning and finish reason, and the usage, of one decoded payload."""
    if not isinstance(payload, dict):
        return Delta(error=f"malformed completion payload: {str(payload)[:80]!r}")
    if "error" in payload:  # vLLM reports failures that happen mid-stream this way
        error = payload["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return Delta(error=f"upstream error: {message}")
    usage = payload.get("usage")
    text = reasoning = ""
    finish_reason = None
    choices = payload.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        message = choice.get("delta", choice.get("message"))
        if isinstance(message, dict):  # chat: a streamed delta or a whole message
            text += _string(message.get("content"))
            # The first of REASONING_FIELDS that holds text (a server may send both).
            reasoning += (_string(message.get(_REASONING))
                          or _string(message.get(_REASONING_OLDER)))
        else:  # completions
            text += _string(choice.get("text"))
        if isinstance(choice.get("finish_reason"), str):
            finish_reason = choice["finish_reason"]
    return Delta(text, reasoning, usage if isinstance(usage, dict) else None, finish_reason)


def parse_data(data: str | bytes) -> Delta:
    """One SSE `data:` payload (the text after `data:`): `[DONE]`, or a JSON payload."""
    data = data.strip()
    if data in ("[DONE]", b"[DONE]"):
        return DONE
    try:
        payload = loads(data)
    except ValueError:
        shown = data if isinstance(data, str) else data.decode("utf-8", "replace")
        return Delta(error=f"malformed stream event: {shown[:80]!r}")
    return parse_payload(payload)


def assistant_message(reply_text: str) -> dict[str, str]:
    """The message a later turn's history holds for a reply (reasoning is not sent back)."""
    return {"role": "assistant", "content": reply_text}


@dataclass(frozen=True, slots=True)
class Captured:
    """A finished response: reply text, reasoning, usage, and whether it completed whole."""

    text: str
    reasoning: str
    usage: dict[str, Any] | None
    finish_reason: str | None
    complete: bool


def _event_end(buffer: bytearray, start: int, any_cr: bool) -> tuple[int, int]:
    """Where the first SSE event at or after start ends, and its separator's size (-1, 0:
    not complete yet)."""
    if not any_cr:
        return buffer.find(b"\n\n", start), 2
    ends = [(i, len(sep)) for sep in SSE_EVENT_ENDS if (i := buffer.find(sep, start)) >= 0]
    return min(ends) if ends else (-1, 0)


class ReplyCapture:
    """Reads a response body fed in arbitrary chunks: SSE events when streamed, else one JSON.

    A streamed body is parsed lazily, not chunk by chunk: feeding only keeps the bytes and
    counts line breaks, and the events are parsed when something asks - `stream_done` (the
    relay asks once a `[DONE]` has arrived, normally in the last chunk), `token_events` when
    the line breaks say
    there could be more events than a limit, `finish` at the end. The relay feeds every chunk
    of every stream, and parsing each as it came (with the relay's framing) cost ~108 us per
    16-token reply, a quarter of the proxy's CPU per request on the fast path; parsed in one
    pass, 44 us (`benchmarks/bench_decision.py`'s capture row, before and after)."""

    def __init__(self, stream: bool) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._usage: dict[str, Any] | None = None
        self._finish_reason: str | None = None
        self._done = False
        self._failed = False
        self._cr = False
        self._breaks = 0  # line breaks fed: at least one per event, so an upper bound
        self._token_events = 0

    def feed(self, chunk: bytes) -> None:
        """Take the next body bytes."""
        if self._stream:
            # vLLM ends events with "\n\n" only; the other two endings are looked for once a
            # CR has been seen.
            self._cr = self._cr or b"\r" in chunk
            self._breaks += chunk.count(b"\n") + (chunk.count(b"\r") if self._cr else 0)
        self._buffer += chunk
        if self._stream and len(self._buffer) > _PARSE_AT:
            self._parse()  # a long reply is parsed as it goes, so its bytes are not all kept

    @property
    def token_events(self) -> int:
        """Streamed events of choice 0 that carried generated text: each holds at least one
        token, so more of them than max_tokens is a reply past its limit
        (`proxy.upstream.relay`)."""
        self._parse()
        return self._token_events

    def could_exceed(self, limit: int) -> bool:
        """Whether the events so far may carry more than limit tokens (cheap; exact when it
        has to be: only a count of line breaks above limit parses the events)."""
        return self._breaks > limit and self.token_events > limit

    def _parse(self) -> None:
        """Parse the complete events not parsed yet."""
        if not self._stream:
            return
        buffer, start = self._buffer, 0  # a streamed buffer holds only unparsed bytes
        if not self._cr:
            end = buffer.rfind(b"\n\n", start)
            if end < 0:
                return
            # The complete events' lines at once: an event's blank lines hold no data.
            self._lines(bytes(buffer[start:end]).split(b"\n"))
            start = end + 2
        else:
            while (found := _event_end(buffer, start, True))[0] >= 0:
                end, size = found
                self._lines(bytes(buffer[start:end]).splitlines())
                start = end + size
        del buffer[:start]

    def _lines(self, lines: list[bytes]) -> None:
        # One loop over the events' lines, no call per event but the decode: this runs for
        # each of a reply's events (~17 per 16-token reply).
        for line in lines:
            # Every other line is an event's blank end: skipped before a method call.
            if not line or not line.startswith(b"data:"):
                continue
            data = line[5:]
            if data[-6:] == b"[DONE]" and data.strip() == b"[DONE]":
                # Every stream's last event: told apart before orjson, whose refusal of it
                # costs an exception (a Python-level JSONDecodeError) a reply.
                self._done = True
                continue
            try:
                # orjson skips JSON's own whitespace around a document itself.
                payload = _orjson_loads(data)
            except _OrjsonError:
                # `[DONE]`, or what only Python's json reads (NaN), or bytes that are no
                # JSON (the capture fails): as parse_data reads the stripped text.
                data = data.strip()
                if data == b"[DONE]":
                    self._done = True
                    continue
                try:
                    payload = loads(data)
                except ValueError:
                    self._failed = True
                    continue
            # parse_payload, without a Delta per event for the common shapes; the type
            # checks are `__class__ is`, and the reasoning fields are read only when the
            # delta has any of them (~1.5 us less per event, 16 per 16-token reply).
            if payload.__class__ is not dict or "error" in payload:
                self._take(parse_payload(payload))
                continue
            usage = payload.get("usage")
            if usage and usage.__class__ is dict:
                self._usage = usage
            choices = payload.get("choices")
            if choices.__class__ is not list:
                continue
            text = reasoning = ""
            for choice in choices:
                if choice.__class__ is not dict or choice.get("index", 0) != 0:
                    continue
                # choice.get("delta", choice.get("message")), one lookup for a delta
                message = choice["delta"] if "delta" in choice else choice.get("message")
                if message.__class__ is dict:
                    content = message.get("content")
                    if content.__class__ is str:
                        text += content
                    if _REASONING in message or _REASONING_OLDER in message:
                        reasoning += (_string(message.get(_REASONING))
                                      or _string(message.get(_REASONING_OLDER)))
                else:
                    content = choice.get("text")
                    if content.__class__ is str:
                        text += content
                finish_reason = choice.get("finish_reason")
                if finish_reason and finish_reason.__class__ is str:
                    self._finish_reason = finish_reason
            if text or reasoning:
                self._token_events += 1
                self._text.append(text)
                if reasoning:
                    self._reasoning.append(reasoning)

    def _take(self, delta: Delta) -> None:
        if delta.error is not None:
            self._failed = True
            return
        self._done = self._done or delta.done
        self._token_events += delta.has_tokens
        self._text.append(delta.text)
        self._reasoning.append(delta.reasoning)
        self._usage = delta.usage or self._usage
        self._finish_reason = delta.finish_reason or self._finish_reason

    @property
    def stream_done(self) -> bool:
        """A streamed reply has sent `[DONE]`: everything the session needs has arrived
        (parses what is pending: ask once the bytes hold a `[DONE]`)."""
        if not self._stream:
            return False
        self._parse()
        return self._done

    def finish(self) -> Captured:
        """The reply once the body ended (complete=False when it was cut or malformed)."""
        if not self._stream:
            self._take(parse_data(bytes(self._buffer)))
            # A whole answer is complete once it names why it stopped.
            self._done = self._finish_reason is not None
        else:
            self._parse()
        return Captured("".join(self._text), "".join(self._reasoning), self._usage,
                        self._finish_reason, self._done and not self._failed)
