"""Machine-readable outputs (JSON, CSV), written atomically."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import Any

from npujax._atomic import atomic_write_text
from npujax.plan.lower import Schedule
from npujax.plan.passes.energy import ENERGY_BREAKDOWN

__all__ = ["write_json", "write_layers_csv", "json_text", "layers_csv_text", "LAYER_COLUMNS"]

#: Columns of the per-layer CSV, in order.
LAYER_COLUMNS = (
    "name", "op", "kind", "device", "M", "K", "N", "macs", "weight_bits", "act_bits",
    "compute_cycles", "fill_drain_cycles", "memory_cycles", "dma_cycles", "stall_cycles",
    "fallback_cycles", "transfer_cycles", "latency_cycles", "latency_s", "bound", "utilization",
    "mapping_efficiency", "dram_bytes", "weight_dram_bytes", "folds", "energy_j",
    *(f"energy_{k}_j" for k in ENERGY_BREAKDOWN), "epilogue", "reason", "input_placement",
    "output_placement",
)


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy / jax scalars and arrays
        return _clean(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"refusing to write a non-finite number ({obj}) to JSON.")
    return obj


def json_text(data: dict[str, Any]) -> str:
    """``data`` as indented JSON text (numpy/jax values converted; NaN/inf refused)."""
    return json.dumps(_clean(data), indent=2) + "\n"


def write_json(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON (numpy/jax values converted; NaN/inf refused)."""
    atomic_write_text(path, json_text(data))


def _rounded(column: str, v: Any) -> Any:
    """A CSV cell: cycles to 0.1 cycle, seconds and fractions to 6 significant digits (the
    model's float32 figures carry no more; ``report.json`` keeps the full values)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, float) or not math.isfinite(v):
        return v
    if column.endswith("_cycles"):
        return round(v, 1)
    if v.is_integer():
        return int(v)
    return float(f"{v:.6g}")


def write_layers_csv(path: str | os.PathLike[str], schedule: Schedule) -> None:
    """Write :func:`layers_csv_text` of ``schedule`` to ``path`` (atomically)."""
    atomic_write_text(path, layers_csv_text(schedule))


def layers_csv_text(schedule: Schedule) -> str:
    """One row per layer with :data:`LAYER_COLUMNS` (units in the names: ``_cycles``, ``_s``,
    ``_bytes``, ``_bits``, ``_j``; ``utilization`` and ``mapping_efficiency`` are fractions), cycles
    rounded to 0.1 and other figures to 6 significant digits."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=LAYER_COLUMNS)
    w.writeheader()
    for row in schedule.to_dict()["layers"]:
        row["epilogue"] = "+".join(row["epilogue"])
        w.writerow({k: _rounded(k, row[k]) for k in LAYER_COLUMNS})
    return buf.getvalue()
