"""The shape-bucket workflow of ``npujax lower --shapes``: a model lowered at each input shape
of a distribution, and the bucket plans of :mod:`npujax.plan.buckets`."""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from npujax._progress import track
from npujax.errors import ConfigError
from npujax.hw.spec import NpuSpec
from npujax.ir.graph import Graph
from npujax.plan.buckets import BucketPlan, ShapeCosts, bucket_plans, switch_reload_s
from npujax.plan.lower import lower

__all__ = ["parse_shape", "read_shape_distribution", "apply_shape", "shape_costs",
           "shape_bucket_report"]


def parse_shape(token: str) -> tuple[int, ...]:
    """``"640"`` -> ``(640,)`` (a sequence length, or a square side); ``"48x320"`` -> ``(48,
    320)`` (H x W).

    Raises:
      ConfigError: not one or two positive integers joined by ``x``.
    """
    try:
        dims = tuple(int(d) for d in token.strip().lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) not in (1, 2) or any(d < 1 for d in dims):
        raise ConfigError(f"input shape {token!r}: write a sequence length or side (e.g. 640) or "
                          "a resolution HxW (e.g. 48x320), positive integers.")
    return dims


def read_shape_distribution(source: str | Path | Sequence[str]
                            ) -> list[tuple[tuple[int, ...], float]]:
    """A shape distribution from a CSV file (columns ``shape,probability``; a header row is
    optional; weights are normalised) or a list of ``SHAPE:WEIGHT`` tokens (``["48x160:3",
    "48x320:1"]``). Repeated shapes add up.

    Raises:
      ConfigError: a missing file, a bad shape or weight, or no positive weight.
    """
    rows: list[tuple[str, str]] = []
    if isinstance(source, Path) or (isinstance(source, str) and (
            Path(source).is_file() or source.lower().endswith(".csv"))):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"shape distribution {str(path)!r} is not a file; give a CSV with "
                              "columns shape,probability or SHAPE:WEIGHT tokens.")
        with path.open(newline="") as f:
            for r in csv.reader(f):
                if not r or r[0].strip().startswith("#") or r[0].strip().lower() == "shape":
                    continue
                if len(r) != 2:
                    raise ConfigError(f"{path}: row {r} must be shape,probability.")
                rows.append((r[0], r[1]))
    else:
        tokens = [source] if isinstance(source, str) else list(source)
        for t in tokens:
            shape, _, w = str(t).partition(":")
            rows.append((shape, w or "1"))
    dist: dict[tuple[int, ...], float] = {}
    for shape, w in rows:
        try:
            weight = float(w)
        except ValueError:
            weight = -1.0
        if not weight >= 0 or weight == float("inf"):
            raise ConfigError(f"shape {shape!r}: weight {w!r} must be a finite number >= 0.")
        dims = parse_shape(shape)
        dist[dims] = dist.get(dims, 0.0) + weight
    total = sum(dist.values())
    if not total > 0:
        raise ConfigError("the shape distribution has no positive weight.")
    return [(s, w / total) for s, w in dist.items() if w > 0]


def apply_shape(shapes: Mapping[str, Sequence[int]], dims: tuple[int, ...]
                ) -> dict[str, tuple[int, ...]]:
    """The model's input shapes at one point: a 4-D (NCHW) input takes ``H x W`` (a single
    number: a square), a 2-D or 3-D input (tokens) takes the length on axis 1; others keep
    theirs.

    Raises:
      ConfigError: an ``HxW`` for a model without a 4-D input, or no input that changes.
    """
    out: dict[str, tuple[int, ...]] = {}
    changed = False
    for name, sh in shapes.items():
        sh = tuple(int(d) for d in sh)
        if len(sh) == 4:
            h, w = (dims[0], dims[0]) if len(dims) == 1 else dims
            out[name] = (sh[0], sh[1], h, w)
            changed = True
        elif len(sh) in (2, 3) and len(dims) == 1:
            out[name] = (sh[0], dims[0], *sh[2:])
            changed = True
        else:
            out[name] = sh
    if not changed:
        raise ConfigError(f"shape {'x'.join(map(str, dims))} changes none of the inputs "
                          f"{dict(shapes)}: a resolution needs a 4-D (NCHW) input, a length a "
                          "2-D or 3-D one.")
    return out


def _ordered(dist: list[tuple[tuple[int, ...], float]]) -> list[tuple[tuple[int, ...], float]]:
    """The shapes sorted; each must contain the previous (padding only grows a shape)."""
    out = sorted(dist, key=lambda sp: (len(sp[0]), sp[0]))
    dims = {len(s) for s, _ in out}
    if len(dims) > 1:
        raise ConfigError("mix of lengths and HxW resolutions in one distribution; use one.")
    for (a, _), (b, _) in zip(out, out[1:]):
        if any(x > y for x, y in zip(a, b)):
            raise ConfigError(
                f"shapes {'x'.join(map(str, a))} and {'x'.join(map(str, b))}: neither contains "
                "the other, so one cannot be padded to the other; bucket such resolutions "
                "separately (e.g. one distribution per aspect ratio).")
    return out


def shape_costs(load: Callable[[dict[str, tuple[int, ...]]], Graph],
                base_shapes: Mapping[str, Sequence[int]],
                dist: list[tuple[tuple[int, ...], float]], spec: NpuSpec,
                precision: Callable[[Graph], Any], dataflow: str | None = None,
                show_progress: bool = False) -> ShapeCosts:
    """The model lowered at every shape of ``dist`` (``load`` imports it at given input
    shapes): latency, MACs and DRAM bytes per shape (:class:`~npujax.plan.buckets.ShapeCosts`)."""
    dist = _ordered(dist)
    lat, macs, dram = [], [], []
    for dims, _ in track(dist, "lowering at each shape", show_progress):
        g = load(apply_shape(base_shapes, dims))
        s = lower(g, spec, precision(g), dataflow=dataflow)
        lat.append(s.latency_s)
        macs.append(s.macs)
        dram.append(s.dram_bytes)
    return ShapeCosts(tuple("x".join(map(str, d)) for d, _ in dist),
                      tuple(p for _, p in dist), tuple(lat), tuple(macs), tuple(dram))


def shape_bucket_report(costs: ShapeCosts, ks: Sequence[int], compile_s: float,
                        inferences: float) -> dict[str, Any]:
    """The JSON-ready report: the per-shape costs, the best plan per ``k``, recompiling per
    shape (``k = n``, every compiled shape cached) and reloading on every shape change (one
    model resident), and the recommended plan (the least expected time per inference)."""
    plans: list[BucketPlan] = bucket_plans(costs, ks, compile_s=compile_s,
                                           inferences=inferences)
    n = len(costs.shapes)
    per_shape = bucket_plans(costs, [n], compile_s=compile_s, inferences=inferences)[0]
    best = min(plans + [per_shape], key=lambda p: (p.total_s, len(p.buckets)))
    expected = sum(p * t for p, t in zip(costs.probabilities, costs.latency_s))
    return {
        "shapes": [{"shape": s, "probability": p, "latency_s": t, "macs": m, "dram_bytes": d}
                   for s, p, t, m, d in zip(costs.shapes, costs.probabilities, costs.latency_s,
                                            costs.macs, costs.dram_bytes)],
        "compile_s": compile_s, "inferences": inferences,
        "plans": [p.to_dict() for p in plans],
        "recompile_per_shape": per_shape.to_dict(),
        "reload_on_change_s": expected + switch_reload_s(costs.probabilities, compile_s),
        "recommended": best.to_dict(),
    }
