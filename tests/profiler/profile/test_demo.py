"""`ppd demo` pieces that need no cluster: the built-in conversations, the table, the config."""

from __future__ import annotations

import pytest

from profiler.profile import demo
from profiler.profile.demo import DemoConfig


def test_conversations_have_the_configured_shape() -> None:
    config = DemoConfig(conversations=12, turns=3, max_tokens=20, doc_chars=3000)
    conversations = demo.demo_conversations(config, run_tag="r1")
    assert len(conversations) == 12 and len({c.id for c in conversations}) == 12
    for conversation in conversations:
        assert len(conversation.turns) == 3
        assert all(t.n_out_tokens == 20 and t.reference_answer is None for t in conversation.turns)
        first, *later = (t.user for t in conversation.turns)
        # Turn 1 pastes a long document, later turns are short questions about it.
        assert 2000 < len(first) <= 3000 + 200 and all(len(u) < 100 for u in later)
    # More conversations than documents: they cycle, with distinct ids.
    assert conversations[0].turns[0].user == conversations[10].turns[0].user


def test_run_tags_keep_runs_from_sharing_cached_kv() -> None:
    config = DemoConfig(conversations=2)
    a = demo.demo_conversations(config, run_tag="run-pd-0")
    b = demo.demo_conversations(config, run_tag="run-local-0")
    # The system prompt opens every prompt, so a different tag changes the first KV block.
    assert a[0].system is not None and a[0].system.startswith("[run-pd-0]")
    assert a[0].system != b[0].system
    assert [t.user for t in a[0].turns] == [t.user for t in b[0].turns]


def test_module_document_is_cut_at_a_line_boundary() -> None:
    text = demo.module_document("re", 1500)
    assert 1000 < len(text) <= 1500
    assert text.startswith("Support for regular expressions")


def test_comparison_table() -> None:
    pd = {"turn1_ttft_ms_mean": 4000.0, "turn2plus_ttft_ms_mean": 2000.0,
          "turn2plus_ttft_ms_p50": 1800.0, "tpot_ms_mean": 90.0, "success_rate": 1.0,
          "n_requests": 18}
    local = {**pd, "turn2plus_ttft_ms_mean": 500.0, "tpot_ms_mean": 99.0,
             "turn2plus_ttft_ms_p50": None, "success_rate": 0.5}
    lines = demo.comparison_table({"pd": pd, "local": local}).splitlines()
    assert lines[0].split() == ["pd", "local", "local", "vs", "pd"]
    rows = {line[:24].strip(): line[24:].split() for line in lines[2:]}
    assert rows["turn-2+ TTFT mean (ms)"] == ["2000", "500", "-75%"]
    assert rows["TPOT mean (ms)"] == ["90.0", "99.0", "+10%"]
    assert rows["turn-2+ TTFT p50 (ms)"] == ["1800", "n/a"]  # a missing value is not 0
    assert rows["success rate"] == ["100%", "50%"]
    assert rows["requests"] == ["18", "18"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"conversations": 0}, "conversations"), ({"turns": 1}, "turns"),
     ({"turns": 9}, "turns"), ({"qps": 0}, "conversation-rate")],
)
def test_config_validation(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DemoConfig(**kw)  # type: ignore[arg-type]
