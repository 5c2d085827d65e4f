"""Presets backed by profiler.sim's engine model (adapted to the emulator's port)."""

from __future__ import annotations

from profiler.emulate.presets import ModelShape, Preset, PresetError


def sim_preset(hardware: str, model: ModelShape) -> Preset:
    raise PresetError(f"no engine preset {hardware}:{model.name} (profiler.sim is not here yet)")
