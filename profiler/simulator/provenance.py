"""What a simulation simulated: cost preset (and the vLLM version its data comes from), link,
model, layouts and decision tables - recorded with every output and printed, so a table is
never read as another setup's.

`ppd sim run` puts the record in summary.json (`simulated_setup`); `ppd sim grid` in the
Parquet file's schema metadata (key `ppd_sim_setup`) and in a sidecar `OUT.meta.json` (a CSV
has nowhere else); `ppd sim paper` reads it back and says how the setup differs from the
paper's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

METADATA_KEY = b"ppd_sim_setup"
VERSION_MARK = "@vllm-"  # profiler.engine.vllm_versions' mark in a preset name
_VLLM_IN_SOURCE = re.compile(r"\bvllm[ @-]?v?(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SimulatedSetup:
    """The setup behind a simulated run or grid."""

    preset: str
    link: str
    model: str
    layouts: tuple[str, ...]
    vllm_version: str | None = None  # of the measurements the preset is built on, if known
    preset_source: str = ""
    tables: dict[str, str] = field(default_factory=dict)  # layout -> decision table

    def as_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["layouts"] = list(self.layouts)
        return record

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SimulatedSetup:
        return cls(preset=str(data["preset"]), link=str(data["link"]),
                   model=str(data["model"]), layouts=tuple(data.get("layouts", ())),
                   vllm_version=data.get("vllm_version"),
                   preset_source=str(data.get("preset_source", "")),
                   tables={str(k): str(v) for k, v in dict(data.get("tables", {})).items()})

    def line(self) -> str:
        """One line for stdout and report headers."""
        version = f" (vLLM {self.vllm_version})" if self.vllm_version else ""
        tables = "; tables " + ", ".join(f"{layout}: {path}" for layout, path in
                                         sorted(self.tables.items())) if self.tables else ""
        return (f"simulated: preset {self.preset}{version}, link {self.link}, model "
                f"{self.model}, layouts {', '.join(self.layouts)}{tables}")


def vllm_version_of(cost: object, preset: str = "") -> str | None:
    """The vLLM version a cost preset stands for: the one its name marks (`@vllm-0.13`, the
    host side's release, profiler/engine/vllm_versions.py), else its own attribute
    (`vllm_version`, or its kernel model's), else the version its source names."""
    if VERSION_MARK in preset:
        return preset.partition(VERSION_MARK)[2]
    for holder in (cost, getattr(cost, "kernel", None)):
        version = getattr(holder, "vllm_version", None)
        if version:
            return str(version)
    match = _VLLM_IN_SOURCE.search(str(getattr(cost, "source", "")))
    return match.group(1) if match else None


def describe(preset: str, link: str, model: str, layouts: Iterable[str],
             tables: Mapping[str, Path | str] | None = None) -> SimulatedSetup:
    """The record of a setup; loads the preset (once per process) for its version and source."""
    from profiler.engine.presets import cached_cost

    cost = cached_cost(preset)
    return SimulatedSetup(preset=preset, link=link, model=model,
                          layouts=tuple(dict.fromkeys(layouts)),
                          vllm_version=vllm_version_of(cost, preset),
                          preset_source=str(getattr(cost, "source", "")),
                          tables={k: str(v) for k, v in (tables or {}).items()})


def sidecar_path(out: Path) -> Path:
    """Where a grid table's setup record lies beside it (`grid.parquet` -> `grid.meta.json`)."""
    return out.with_suffix(".meta.json")


def read_setup(grid_path: Path) -> SimulatedSetup | None:
    """A grid table's setup record: the sidecar, else the Parquet metadata (None: neither,
    e.g. a grid from before records were written)."""
    sidecar = sidecar_path(grid_path)
    try:
        if sidecar.is_file():
            return SimulatedSetup.from_dict(json.loads(sidecar.read_text())["setup"])
        if grid_path.suffix == ".parquet":
            import pyarrow.parquet as pq

            metadata = pq.read_schema(grid_path).metadata or {}
            if METADATA_KEY in metadata:
                return SimulatedSetup.from_dict(json.loads(metadata[METADATA_KEY]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


# The PPD paper's testbed, which its figures (paper_figures.py) were measured on.
PAPER_MODEL = "llama-3.1-8b"
PAPER_GPU = "h100"
PAPER_SETUP = "Llama-3.1-8B on H100 GPUs"


def setup_of_grid(grid_paths: Iterable[Path], grid: Any) -> list[SimulatedSetup]:
    """The setups of grid tables: their records, else what the rows' `cost` and `layout`
    columns say (a grid written before the records; its link is not known)."""
    setups = [setup for path in grid_paths if (setup := read_setup(path)) is not None]
    if setups or "cost" not in grid:
        return setups
    layouts = tuple(dict.fromkeys(str(layout) for layout in grid["layout"]))
    return [SimulatedSetup(preset=str(cost), link="unknown (the grid has no setup record)",
                           model=str(cost).split(":")[1] if ":" in str(cost) else "unknown",
                           layouts=layouts) for cost in dict.fromkeys(grid["cost"])]


def paper_differences(setups: Iterable[SimulatedSetup]) -> list[str]:
    """How simulated setups differ from the paper's (model, GPU); empty when they match."""
    found = []
    for setup in setups:
        gpu = setup.preset.split(":")[0] if ":" in setup.preset else f"preset {setup.preset}"
        if setup.model != PAPER_MODEL:
            found.append(f"model {setup.model} (the paper's: {PAPER_MODEL})")
        if gpu != PAPER_GPU:
            found.append(f"hardware {gpu} (the paper's: {PAPER_GPU})")
        tp = [part for part in setup.preset.split(":")[2:] if part.startswith("tp")]
        if tp:
            found.append(f"tensor parallelism {tp[0]} (the paper's: one GPU per node)")
    return list(dict.fromkeys(found))


def report_preface(setups: list[SimulatedSetup]) -> list[str]:
    """The `ppd sim paper` sections that say what was simulated and, for another setup than
    the paper's, how it differs - before any `ours (paper)` cell."""
    if not setups:
        return ["What was simulated: unknown (the grid names no preset); the paper's figures "
                f"in parentheses are {PAPER_SETUP}."]
    lines = [f"What was simulated: {setup.line().removeprefix('simulated: ')}"
             for setup in setups]
    differences = paper_differences(setups)
    if differences:
        lines.append(
            "## Not the paper's setup\n"
            f"Each cell's `ours (paper)` puts this grid's number beside the paper's figure for "
            f"another setup: the paper measured {PAPER_SETUP}; this grid differs in "
            f"{'; '.join(differences)}. Compare the signs and shapes of the changes, not their "
            "values.")
    else:
        lines.append(f"Same model and GPU as the paper ({PAPER_SETUP}), simulated.")
    return lines
