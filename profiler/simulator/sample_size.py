"""When a simulated run holds too few conversations for its percentiles to mean much.

A run of 10 s at 3 conversations/s holds about 30 conversations: its turn-2+ TTFT p90 is a
handful of turns, and moves from one --seed to the next by more than the differences between
layouts or policies. `ppd sim run` warns below MIN_CONVERSATIONS; `ppd sim plan` aims above it.
"""

from __future__ import annotations

MIN_CONVERSATIONS = 100


def small_run_warning(conversations: int, rate: float) -> str | None:
    """Why a run's percentiles may not hold (None when it holds enough conversations)."""
    if conversations >= MIN_CONVERSATIONS:
        return None
    return (f"the run holds {conversations} conversations (fewer than {MIN_CONVERSATIONS}): "
            "its percentiles move from one --seed to the next; for about "
            f"{MIN_CONVERSATIONS}, run --duration {MIN_CONVERSATIONS / rate:.0f} at "
            f"{rate:g} conversations/s")
