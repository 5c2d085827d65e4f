"""The readback route's wire protocol, as pure functions (docs/readback.md).

With `bidirectional_kv_xfer` on, vLLM's NixlConnector keeps a finished P->D request's blocks on
D for `decoder_kv_blocks_ttl` seconds and names them in D's whole (non-streamed) answer:
`kv_transfer_params` with `do_remote_decode: true`, `remote_block_ids`, `remote_engine_id`,
`remote_request_id`, `remote_host`/`remote_port` (D's NIXL side channel) and
`remote_num_tokens` (the tokens whose KV those blocks hold: the prompt and all but the last
generated token). A next-turn request to P that carries them makes P read the first
`remote_num_tokens` tokens' KV from D instead of computing them, compute only the rest, and
hand its blocks to D as on any P->D turn.

vLLM compares no token: P takes `min(remote_num_tokens, its prompt's length)` tokens from D
whatever they hold (nixl/pull_scheduler.py, `get_num_new_matched_tokens`). The proxy makes that
safe: the D leg asks for the token ids (`return_token_ids`), so the proxy knows exactly which
tokens D's blocks hold (`HeldKV.token_ids`); before the next turn's P leg it asks P to tokenize
the new request (vLLM's `/tokenize`, the same chat template and options) and tells P to read
only the longest common prefix (`matched_tokens`). A reply that re-tokenizes into other ids, a
chat template that renders the history differently, a reasoning part the next turn drops: P
reads only up to the first token that differs, and recomputes from there.
"""

from __future__ import annotations

import ipaddress
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from proxy.shared.json_codec import dumps, loads
from proxy.shared.validate import Endpoint

# vLLM's default decoder_kv_blocks_ttl (nixl/base_scheduler.py): how long D keeps a finished
# turn's blocks when bidirectional transfer is on.
VLLM_DECODER_BLOCKS_TTL_S = 480
# vLLM's default kv_recompute_threshold (nixl/base_scheduler.py): P recomputes a remote span
# shorter than this rather than read it, so a shorter match is not worth a readback.
MIN_READBACK_TOKENS = 64
# Seconds taken off D's TTL before the proxy stops offering its blocks: the proxy starts D's
# clock when D's answer arrives (later than D did), and vLLM's P declines a read within 5 s of
# the deadline (nixl/pull_worker.py, _KV_BLOCKS_EXPIRY_SAFETY_MARGIN), failing the request.
EXPIRY_MARGIN_S = 10.0
# What D's params must name for P to read from it (nixl/pull_scheduler.py).
_REQUIRED = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
             "remote_port")
# The fields `return_token_ids` adds to a whole answer, removed before the client gets it
# when the proxy asked for them (and the client did not).
TOKEN_IDS = "return_token_ids"
# Request fields of a chat request that change how vLLM renders and tokenizes the prompt
# (vLLM's TokenizeChatRequest); completions: the prompt and add_special_tokens.
_CHAT_RENDER_FIELDS = ("messages", "add_generation_prompt", "continue_final_message",
                       "add_special_tokens", "chat_template", "chat_template_kwargs", "tools",
                       "documents", "mm_processor_kwargs")
_COMPLETION_RENDER_FIELDS = ("prompt", "add_special_tokens")


@dataclass(frozen=True, slots=True)
class HeldKV:
    """A finished turn's blocks that D keeps for a readback: D's params as D sent them, the D
    that sent them, the ids of the tokens whose KV they hold, and when the proxy stops
    offering them (on its own clock)."""

    params: dict[str, Any]
    decode: str
    token_ids: array[int]
    expires: float

    @property
    def tokens(self) -> int:
        """Tokens whose KV D holds for this turn."""
        return len(self.token_ids)


# A local leg's kv_transfer_params when the proxy wants D to keep its blocks for a readback:
# params that ask for no transfer, so D serves the turn as a plain local request, yet a D with
# bidirectional transfer keeps and names its blocks when it finishes (vLLM's request_finished
# does so for any request with non-empty params and no do_remote_decode).
KEEP_BLOCKS: dict[str, Any] = {"do_remote_prefill": False, "do_remote_decode": False}


def wants_token_ids(body: dict[str, Any]) -> bool:
    """Whether a client asked for the token ids itself (then the answer keeps them)."""
    return bool(body.get(TOKEN_IDS))


def with_token_ids(body: dict[str, Any]) -> dict[str, Any]:
    """A D leg body that also asks for the prompt's and the reply's token ids."""
    return {**body, TOKEN_IDS: True}


def keeping_blocks(body: dict[str, Any]) -> dict[str, Any]:
    """A local leg body that makes D keep and name the turn's blocks (with their ids)."""
    return {**body, "kv_transfer_params": dict(KEEP_BLOCKS), TOKEN_IDS: True}


def held_kv(answer: Any, decode: str, now: float, ttl: float) -> HeldKV | None:
    """What D's whole answer says it keeps for a readback; None when it keeps nothing usable
    (bidirectional transfer off, an aborted request, no token ids to check against)."""
    if not isinstance(answer, dict):
        return None
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_decode"):
        return None
    if any(params.get(key) in (None, "", []) for key in _REQUIRED):
        return None
    n_tokens = params.get("remote_num_tokens")
    prompt_ids = answer.get("prompt_token_ids")
    choices = answer.get("choices")
    output_ids = (choices[0].get("token_ids") if isinstance(choices, list) and choices
                  and isinstance(choices[0], dict) else None)
    if (not isinstance(n_tokens, int) or n_tokens <= 0 or not _ids(prompt_ids)
            or not _ids(output_ids)):
        return None
    ids = [*prompt_ids, *output_ids][:n_tokens]
    if len(ids) < n_tokens:
        return None  # D claims KV for tokens it did not report: do not trust the blocks
    if not plausible_params(params, decode, n_tokens):
        return None  # they would go to P as they are: nothing P should be told
    return HeldKV(params, decode, array("q", ids), now + ttl - EXPIRY_MARGIN_S)


# D's params go to P as D sent them, so they are checked against what the proxy knows of D
# first (300k block ids, another host, a huge engine id once went through): scalars of
# bounded size, at most one block per token, the port a port, and - where D's URL names its
# host by address - D's NIXL host that same host (a host name is not resolved: that would
# block the loop; then any host is taken).
MAX_PARAM_KEYS = 32
MAX_PARAM_CHARS = 256
MAX_BLOCK_ID = 2**31
MAX_KV_GROUPS = 16


def plausible_params(params: dict[str, Any], decode: str, n_tokens: int) -> bool:
    """Whether D's kv_transfer_params are fit to hand to P (`held_kv`)."""
    if len(params) > MAX_PARAM_KEYS:
        return False
    for key, value in params.items():
        if not isinstance(key, str) or len(key) > MAX_PARAM_CHARS:
            return False
        if isinstance(value, str) and len(value) > MAX_PARAM_CHARS:
            return False
        if isinstance(value, list | dict) and key != "remote_block_ids":
            return False  # vLLM's other params are scalars
    blocks, port = params.get("remote_block_ids"), params.get("remote_port")
    # One list of block ids, or one per KV cache group (hybrid models).
    groups = blocks if isinstance(blocks, list) and blocks and all(
        isinstance(g, list) for g in blocks) else [blocks]
    if len(groups) > MAX_KV_GROUPS or not all(_block_ids(g, n_tokens) for g in groups) \
            or not any(groups):
        return False
    if type(port) is not int or not 0 < port < 65536:
        return False
    host = params.get("remote_host")
    return isinstance(host, str) and same_host(host, urlsplit(decode).hostname or "")


def _block_ids(value: Any, n_tokens: int) -> bool:
    return isinstance(value, list) and len(value) <= n_tokens and all(
        type(b) is int and 0 <= b < MAX_BLOCK_ID for b in value)


def same_host(nixl_host: str, url_host: str) -> bool:
    """Whether D's NIXL host can be the host of D's URL (True when the URL names a host name,
    which is not resolved here)."""
    try:
        url_ip = ipaddress.ip_address(url_host)
    except ValueError:
        if url_host != "localhost":
            return True
        url_ip = ipaddress.ip_address("127.0.0.1")
    try:
        ip = ipaddress.ip_address("127.0.0.1" if nixl_host == "localhost" else nixl_host)
    except ValueError:
        return False  # D's URL is an address: its NIXL host must be one too
    return ip == url_ip or (ip.is_loopback and url_ip.is_loopback) or url_ip.is_unspecified


def _ids(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(type(i) is int for i in value)


def client_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """The whole answer without what the proxy asked D for: the token ids, and D's
    kv_transfer_params (block ids and D's NIXL address are no client's business)."""
    out = {k: v for k, v in answer.items() if k not in ("prompt_token_ids", "kv_transfer_params")}
    choices = answer.get("choices")
    if isinstance(choices, list):
        out["choices"] = [{k: v for k, v in c.items() if k != "token_ids"}
                          if isinstance(c, dict) else c for c in choices]
    return out


def without_kv_params(body: bytes) -> bytes:
    """A whole answer without D's kv_transfer_params (its NIXL host, port and block ids are no
    client's business), whatever the client asked for (`return_token_ids` included); vLLM's
    own `"kv_transfer_params": null` is left as is, and the body is parsed only when the
    field is there at all."""
    if b'"kv_transfer_params"' not in body:
        return body
    if (b'"kv_transfer_params":null' in body or b'"kv_transfer_params": null' in body) \
            and body.count(b'"kv_transfer_params"') == 1:
        return body  # vLLM's own null, and nothing else of the name: no parse on the hot path
    try:
        answer = loads(body)
    except ValueError:
        return body  # not JSON: `forward.complete` already refused a 2xx that is not
    if not isinstance(answer, dict) or answer.get("kv_transfer_params") is None:
        return body
    del answer["kv_transfer_params"]
    return dumps(answer)


def tokenize_body(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    """The body of vLLM's POST /tokenize that renders the request as P will (same template,
    same options)."""
    fields = _CHAT_RENDER_FIELDS if endpoint is Endpoint.CHAT else _COMPLETION_RENDER_FIELDS
    out = {k: body[k] for k in fields if k in body}
    if "model" in body:
        out["model"] = body["model"]
    return out


def tokenized_ids(answer: Any) -> list[int] | None:
    """The ids of a /tokenize answer, None when it has none."""
    ids = answer.get("tokens") if isinstance(answer, dict) else None
    return ids if _ids(ids) else None


def matched_tokens(held: Sequence[int], new_ids: Sequence[int]) -> int:
    """How many leading tokens of the new prompt are the tokens D's blocks hold (their longest
    common prefix), never the whole new prompt: P computes at least its last token."""
    limit = min(len(held), len(new_ids) - 1)
    step, n = 256, 0
    while n < limit:  # compare in slices, then token by token in the first slice that differs
        end = min(n + step, limit)
        if list(held[n:end]) == list(new_ids[n:end]):
            n = end
            continue
        while held[n] == new_ids[n]:
            n += 1
        return n
    return max(n, 0)


def prefill_params(held: HeldKV, matched: int) -> dict[str, Any]:
    """The P leg's kv_transfer_params for a readback: D's own, reading `matched` tokens.
    D's params already say `do_remote_decode: true`, which also makes P keep its blocks for
    the D leg, as on any P->D turn."""
    return {**held.params, "remote_num_tokens": matched}
