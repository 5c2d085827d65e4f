"""Which vLLM a GPU preset's host side stands for: `GPU:MODEL[:tpN][@vllm-X.Y]`.

The kernels are the same for every version (aiconfigurator's vLLM 0.24.0 kernel data); what
differs is the host side - the front end, the exposed per-step time, how steps are scheduled
- and each version's terms come from measurements of that version:

- `0.24` (the default): real vLLM 0.24.0 on one H100 (`measured.py`), async scheduling;
- `0.13`: vLLM 0.13.0rc2, the engine the PPD paper measured (its repository's README), fitted
  on the paper's micro-benchmark and inference-sim's front end (`public.py`), sync scheduling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from profiler.engine.cost import CostModel
from profiler.engine.host import HostModel

VERSION_MARK = "@vllm-"


@dataclass(frozen=True, slots=True)
class VllmVersion:
    version: str
    what: str  # one line: the release and how it schedules
    sources: str  # where the host terms come from
    fit: Callable[[CostModel], HostModel]  # host terms from the H100 + Llama-3.1-8B kernels


def _fit_024(kernel: CostModel) -> HostModel:
    from profiler.engine import measured

    return measured.fit_host(kernel)


def _fit_013(kernel: CostModel) -> HostModel:
    from profiler.engine import public

    return public.h100_host(kernel)


VERSIONS: dict[str, VllmVersion] = {
    "0.24": VllmVersion(
        "0.24", "vLLM 0.24.0, async scheduling (its default), token budget 8192",
        "real vLLM 0.24.0 on one H100 (profiler/engine/data/h100-vllm-0.24/measured.json: "
        "fresh-prompt TTFT and vLLM's prefill/queue histograms, decode TPOT by batch)",
        _fit_024),
    "0.13": VllmVersion(
        "0.13", "vLLM 0.13.0rc2 as the PPD paper ran it, synchronous scheduling",
        "PPD paper micro-benchmark (decode-only TPOT, batch 10-200), inference-sim sim-to-real "
        "TTFT (front end), vLLM #50913 (NIXL)", _fit_013),
}
DEFAULT_VERSION = "0.24"


def split_version(spec: str) -> tuple[str, VllmVersion | None]:
    """`h100:llama-3.1-8b:tp2@vllm-0.13` -> (`h100:llama-3.1-8b:tp2`, the 0.13 entry);
    no mark -> (spec, None)."""
    if VERSION_MARK not in spec:
        if "@" in spec:
            raise ValueError(f"cost preset {spec!r}: a version is written @vllm-X.Y, "
                             f"known: {known()}")
        return spec, None
    base, _, version = spec.partition(VERSION_MARK)
    if version not in VERSIONS:
        raise ValueError(f"cost preset {spec!r}: unknown vLLM version {version!r}; known: "
                         f"{known()}")
    return base, VERSIONS[version]


def known() -> str:
    return ", ".join(f"{VERSION_MARK}{v}" for v in VERSIONS)
