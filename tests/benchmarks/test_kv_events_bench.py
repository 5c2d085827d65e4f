"""The KV-event flood benchmark runs, and the floods that used to hang are now rejected."""

from __future__ import annotations

from benchmarks import kv_events


def test_the_cycle_floods_are_rejected_without_blocking() -> None:
    for flood in ("self-parent", "2-block cycle"):
        result = kv_events.run_flood(flood, timeout=60, memory_cap_mb=2500)
        assert "error" not in result, result
        # Rejected, and the index forgotten: at most the cycle's tagged child is left.
        assert result["rejected"] == 1 and result["blocks"] <= 1
    table = kv_events.render([("self-parent", result), ("20k chain", {"error": "hung"})])
    assert "max block ms" in table and "hung" in table
