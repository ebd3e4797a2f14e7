"""Design-space grids: axes of hardware fields and precisions, their product and samples of it.

A :class:`Grid` is an ordered set of axes, each a spec field (``"array.rows"``,
``"memory.dram_bytes_per_s"``; the ``section.key`` paths of :mod:`npujax.hw.fields`),
``"dataflow"`` (short for ``array.dataflow``; ``ws``/``os``/``is`` accepted) or ``"bits"`` (one
uniform weight and activation width for every layer), with its values. A configuration is one
value per axis; configurations are numbered in row-major order of the product (the last axis
varies fastest), so a set of configurations is a ``[n, axes]`` array of value indices
(:func:`configurations`): the full product, a uniform random sample without replacement, or a
Latin hypercube sample (McKay, Beckman and Conover, Technometrics 1979: every axis's values are
covered evenly), all reproducible from a seed.

Axes split into *traced* ones (``bits`` and the fields :func:`npujax.hw.fields.is_traced`
accepts: the numeric fields of ``array``, ``memory``, ``vector``, ``host``, ``technology``,
``energy`` and ``area``), which the sweep evaluates as data in one compiled program, and
*static* ones (``dataflow``, ``array.precision_scaling``, ``memory.mapping`` and the
``layout``/``ops`` fields: names that choose the cost model's formulas or numbers that change
the layers' workloads). The sweep compiles one program per combination of the static axes'
values other than the dataflow: that program costs every dataflow of the grid and each
configuration takes its own (:mod:`npujax.explore.sweep`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from npujax.errors import ConfigError
from npujax.hw import fields
from npujax.hw.fields import TRACED_SECTIONS as TRACED_SECTIONS
from npujax.hw.spec import NpuSpec
from npujax.systolic.dataflow import get_dataflow

__all__ = ["Grid", "parse_grid_axis", "configurations", "SAMPLING_METHODS", "TRACED_SECTIONS"]

#: How :func:`configurations` picks a subset of the product.
SAMPLING_METHODS = ("random", "lhs")
#: Widths the ``bits`` axis may take (those npujax quantizes to).
_BITS_RANGE = (2, 16)


@dataclasses.dataclass(frozen=True)
class Grid:
    """Axes of a design-space sweep: ``{name: values}`` in order (validated on construction).

    Attributes:
      axes: ``(name, values)`` pairs; names are ``section.key`` spec fields, ``dataflow`` or
        ``bits``; every value is valid for the field (checked against the base spec).
    """

    axes: tuple[tuple[str, tuple[Any, ...]], ...]

    @classmethod
    def build(cls, axes: Mapping[str, Sequence[Any]], base: NpuSpec) -> Grid:
        """A validated grid: every value of every axis is checked against ``base`` as a preset
        value would be (:meth:`NpuSpec.with_fields`).

        Raises:
          ConfigError: no axes, an axis without values or with repeated values, an unknown
            field, a value a preset could not hold, or a field ``base`` ignores
            (:func:`npujax.hw.fields.ignored`).
        """
        if not axes:
            raise ConfigError("a sweep needs at least one --grid axis (e.g. array.rows=8,16,32).")
        out: list[tuple[str, tuple[Any, ...]]] = []
        for raw, values in axes.items():
            name = raw if raw == "bits" else fields.canonical(raw)
            vals = tuple(values)
            if not vals:
                raise ConfigError(f"grid axis {raw!r} has no values; give e.g. {raw}=8,16.")
            if name == "array.dataflow":
                vals = tuple(get_dataflow(v).name for v in vals)
            if len(set(vals)) != len(vals):
                raise ConfigError(f"grid axis {raw!r} repeats a value: {list(values)}.")
            if name == "bits":
                bad = [v for v in vals if not (isinstance(v, int) and not isinstance(v, bool)
                                               and _BITS_RANGE[0] <= v <= _BITS_RANGE[1])]
                if bad:
                    raise ConfigError(f"bits {bad} outside [{_BITS_RANGE[0]}, "
                                      f"{_BITS_RANGE[1]}]; use whole widths such as 2,4,8.")
            else:  # validated like a preset file; ints of float fields become floats
                vals = tuple(fields.get(fields.replace(base, {name: v}), name) for v in vals)
            if any(n == name for n, _ in out):
                raise ConfigError(f"grid axis {raw!r} is given twice.")
            out.append((name, vals))
        fields.check_varied(base, [n for n, _ in out if n != "bits"], "grid axis")
        return cls(tuple(out))

    @property
    def names(self) -> tuple[str, ...]:
        """The axis names, in order."""
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Number of values per axis."""
        return tuple(len(v) for _, v in self.axes)

    @property
    def size(self) -> int:
        """Number of configurations in the full product."""
        return math.prod(self.shape)

    def is_static(self, name: str) -> bool:
        """Whether axis ``name`` is a name or changes the workloads (see module doc): not a
        traced number (the sweep compiles one program per value, but the dataflow's values,
        which one program serves)."""
        return name != "bits" and not fields.is_traced(name)

    def to_json(self) -> dict[str, list[Any]]:
        """``{name: values}`` (JSON-ready)."""
        return {n: list(v) for n, v in self.axes}


def parse_grid_axis(text: str) -> tuple[str, tuple[Any, ...]]:
    """``"array.rows=8,16,32"`` as ``("array.rows", (8, 16, 32))``: whole numbers become ints,
    other numbers floats, anything else stays a string.

    Raises:
      ConfigError: no ``=``, an empty name, no values, or a range (``8:16``, ``8..16``).
    """
    name, sep, rest = text.partition("=")
    name = name.strip()
    values = [v.strip() for v in rest.split(",") if v.strip()]
    if not sep or not name or not values:
        raise ConfigError(f"bad --grid {text!r}; write section.key=v1,v2,... "
                          "(e.g. array.rows=8,16,32 or dataflow=ws,os,is).")
    for v in values:
        if any(c.isdigit() for c in v) and (":" in v or ".." in v):
            raise ConfigError(f"bad --grid {text!r}: {v!r} looks like a range; list the "
                              f"values, comma-separated (e.g. {name}=8,16,32).")

    def value(v: str) -> Any:
        try:
            return int(v)
        except ValueError:
            pass
        try:
            return float(v)
        except ValueError:
            return v

    return name, tuple(value(v) for v in values)


def configurations(grid: Grid, sample: int | None = None, method: str = "random",
                   seed: int = 0) -> np.ndarray:
    """The configurations of a sweep as value indices, int64 ``[n, len(grid.axes)]``.

    Args:
      grid: the axes.
      sample: None for the full product (row-major, last axis fastest); else the number of
        configurations to draw.
      method: ``random`` (uniform, without replacement, in product order) or ``lhs`` (Latin
        hypercube: each axis's values are hit ``sample / len(values)`` times, +-1).
      seed: the sampling seed (the same seed gives the same configurations).

    Raises:
      ConfigError: an unknown method, a sample < 1, or a random sample larger than the product.
    """
    shape = grid.shape
    if sample is None:
        return _digits(np.arange(grid.size, dtype=np.int64), shape)
    if method not in SAMPLING_METHODS:
        raise ConfigError(f"unknown sampling method {method!r}; use one of "
                          f"{', '.join(SAMPLING_METHODS)}.")
    if sample < 1:
        raise ConfigError(f"--sample must be >= 1, got {sample}.")
    rng = np.random.default_rng(seed)
    if method == "random":
        if sample > grid.size:
            raise ConfigError(f"--sample {sample} exceeds the {grid.size} configurations of the "
                              "grid; leave --sample out to evaluate them all.")
        idx = np.sort(rng.choice(grid.size, size=sample, replace=False).astype(np.int64))
        return _digits(idx, shape)
    cols = []
    for k in shape:  # one stratum per sample and axis, strata shuffled independently per axis
        strata = (rng.permutation(sample) + rng.random(sample)) / sample
        cols.append(np.minimum((strata * k).astype(np.int64), k - 1))
    return np.stack(cols, axis=1) if cols else np.zeros((sample, 0), np.int64)


def _digits(index: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Row-major mixed-radix digits of ``index`` for ``shape``."""
    out = np.zeros((index.size, len(shape)), np.int64)
    rest = index.copy()
    for j in reversed(range(len(shape))):
        out[:, j] = rest % shape[j]
        rest //= shape[j]
    return out
