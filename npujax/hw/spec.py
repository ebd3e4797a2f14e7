"""Hardware description: a frozen, validated NpuSpec loaded from a TOML preset.

Hardware is data. Every numeric field carries its unit in its name (``clock_hz``, ``sram_bytes``,
``dram_bytes_per_s``). A preset file has one table per section::

    name = "edge_16x16"
    description = "..."
    [array]    rows, cols, dataflow, clock_hz, operand_bits
    [memory]   ifmap_sram_bytes, filter_sram_bytes, ofmap_sram_bytes, dram_bytes_per_s
    [vector]   lanes

Unknown keys, missing keys, wrong types and non-positive sizes are rejected with a
:class:`~npujax.errors.ConfigError` that names the file, the key and the fix.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from npujax.errors import ConfigError

__all__ = [
    "ArraySpec",
    "MemorySpec",
    "VectorSpec",
    "NpuSpec",
    "DATAFLOWS",
    "load_npu_spec",
    "npu_spec_from_dict",
    "list_presets",
]

#: Dataflow names understood by :mod:`npujax.systolic`.
DATAFLOWS = ("weight_stationary", "output_stationary", "input_stationary")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArraySpec:
    """The systolic MAC array.

    Attributes:
      rows, cols: PE array height and width (PEs), >= 1.
      dataflow: default dataflow, one of :data:`DATAFLOWS`.
      clock_hz: array clock frequency (Hz), > 0.
      operand_bits: native operand width of a MAC (bits); wider operands take
        ``ceil(w/operand_bits) * ceil(a/operand_bits)`` passes.
    """

    rows: int
    cols: int
    dataflow: str
    clock_hz: float
    operand_bits: int = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemorySpec:
    """On-chip SRAM buffers (one per GEMM operand, as in SCALE-Sim) and off-chip DRAM.

    Attributes:
      ifmap_sram_bytes, filter_sram_bytes, ofmap_sram_bytes: buffer capacities (bytes), >= 1.
      dram_bytes_per_s: sustained DRAM bandwidth (bytes/s), > 0.
    """

    ifmap_sram_bytes: int
    filter_sram_bytes: int
    ofmap_sram_bytes: int
    dram_bytes_per_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class VectorSpec:
    """The vector unit for pooling, elementwise and activation ops not fused into a GEMM.

    Attributes:
      lanes: elements processed per clock cycle, >= 1.
    """

    lanes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class NpuSpec:
    """A complete NPU description (see the module docstring for the TOML layout).

    Attributes:
      name: preset name.
      description: free text, including the sources of the figures.
      array, memory, vector: the sections.
    """

    name: str
    description: str = ""
    array: ArraySpec
    memory: MemorySpec
    vector: VectorSpec

    @property
    def peak_macs_per_s(self) -> float:
        """``rows * cols * clock_hz``: the compute roof (MAC/s at native operand width)."""
        return self.array.rows * self.array.cols * self.array.clock_hz

    @property
    def dram_bytes_per_cycle(self) -> float:
        """DRAM bandwidth in bytes per array clock cycle."""
        return self.memory.dram_bytes_per_s / self.array.clock_hz


_SECTIONS: dict[str, type] = {"array": ArraySpec, "memory": MemorySpec, "vector": VectorSpec}


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _check_value(where: str, key: str, value: Any, annotation: str) -> Any:
    if annotation == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {value!r}.")
        if key == "dataflow" and value not in DATAFLOWS:
            raise ConfigError(
                f"{where}: unknown dataflow {value!r}; use one of {', '.join(DATAFLOWS)}."
            )
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: '{key}' must be a number, got {value!r}.")
    if annotation == "int":
        if not float(value).is_integer():
            raise ConfigError(f"{where}: '{key}' must be a whole number, got {value!r}.")
        value = int(value)
    else:
        value = float(value)
    if not math.isfinite(value) or value <= 0:
        unit = key.rsplit("_", 1)[-1] if "_" in key else ""
        raise ConfigError(
            f"{where}: '{key}' must be a positive finite number{f' ({unit})' if unit else ''}, "
            f"got {value!r}."
        )
    return value


def _build_section(where: str, cls: type, table: Any) -> Any:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: must be a TOML table [section], got {table!r}.")
    fields = _fields(cls)
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed keys are {', '.join(fields)}."
        )
    kwargs = {}
    for name, f in fields.items():
        if name not in table:
            if f.default is dataclasses.MISSING:
                raise ConfigError(f"{where}: missing required key '{name}'.")
            continue
        kwargs[name] = _check_value(where, name, table[name], str(f.type))
    return cls(**kwargs)


def npu_spec_from_dict(data: Mapping[str, Any], origin: str = "<dict>") -> NpuSpec:
    """Validate a parsed preset and build the :class:`NpuSpec`.

    Args:
      data: the TOML document as a mapping (see the module docstring).
      origin: file name used in error messages.

    Raises:
      ConfigError: unknown/missing key, wrong type, non-positive size or unknown dataflow.
    """
    allowed = {"name", "description", *_SECTIONS}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(
            f"{origin}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: name, description and the sections [{'], ['.join(_SECTIONS)}]."
        )
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise ConfigError(f"{origin}: 'name' (a non-empty string) is required.")
    missing = [s for s in _SECTIONS if s not in data]
    if missing:
        raise ConfigError(f"{origin}: missing section(s) [{'], ['.join(missing)}].")
    sections = {s: _build_section(f"{origin} [{s}]", cls, data[s]) for s, cls in _SECTIONS.items()}
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{origin}: 'description' must be a string.")
    return NpuSpec(name=data["name"], description=description, **sections)


def list_presets() -> list[str]:
    """Names of the presets installed with npujax (``configs/npu/*.toml`` in the repository)."""
    try:
        files = importlib.resources.files("npujax.presets")
        return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".toml"))
    except (ModuleNotFoundError, FileNotFoundError):  # pragma: no cover
        return []


def load_npu_spec(preset: str | os.PathLike[str]) -> NpuSpec:
    """Load and validate a hardware preset.

    Args:
      preset: a path to a ``.toml`` file, or the name of an installed preset (e.g.
        ``"edge_16x16"``, see :func:`list_presets`).

    Returns:
      The validated, frozen :class:`NpuSpec`.

    Raises:
      ConfigError: the file does not exist, is not valid TOML, or fails validation.
    """
    path = Path(preset)
    if path.is_file():
        text, origin = path.read_bytes(), str(path)
    elif str(preset) in list_presets():
        res = importlib.resources.files("npujax.presets").joinpath(f"{preset}.toml")
        text, origin = res.read_bytes(), f"preset {preset!r}"
    else:
        raise ConfigError(
            f"hardware preset {str(preset)!r} not found: it is neither a file nor an installed "
            f"preset. Pass a path to a .toml file or one of: {', '.join(list_presets())}."
        )
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{origin} is not valid TOML: {e}.") from None
    return npu_spec_from_dict(data, origin)
