"""Hardware-precision co-design by gradient: array shape, SRAM sizes, a DRAM bandwidth class and
per-layer (weight, activation) widths, chosen jointly under an area (and power) budget and an
accuracy constraint, then rounded to an exact design and evaluated with :func:`npujax.lower`.

**Relaxation.** The hardware numbers are continuous parameters, ``rows = exp(theta_r)``,
``cols = exp(theta_c)``, each SRAM buffer ``exp(theta_s)`` bytes, put into a float spec
(:func:`npujax.hw.differentiable_spec`) and costed by the relaxed model
(the one cost program, :func:`npujax.plan.program_costs`, relaxed with ``count_slope="mean"``,
energy included: every cost pass the preset's switches call for, as ``lower`` applies them;
exact forward values, straight-through and smoothed gradients, ``npujax/_relax.py``; the mean
slope of the fold staircases, not the default change for one unit more, which stalls a descent
on plateaus of whole folds). The bandwidth class ``k`` (of a
small table: bandwidth, PHY area, PHY power, :data:`BANDWIDTH_CLASSES`) and each GEMM layer's
(w, a) candidate are softmax mixtures: the costs are ``sum_k q_k cost(bw_k)`` and the PHY costs
``sum_k q_k cost_k``, and each layer's latency and energy the expectation over its candidates
(FBNet/EdMIPS, as :mod:`npujax.search.cost`); the bandwidth mixture likewise weighs each class's
exact costs (``E_q[T(bw_k)]``, not ``T(E_q[bw])``, which would flatter a mixture). With ``T``
the relaxed latency, ``E`` the energy, ``A`` the area, ``P = E / T + P_phy`` the average power
and ``Omega = sum_l E_p[Omega_l]`` the sensitivity (:func:`npujax.search.loss_sensitivity`:
per-layer loss increase), Adam minimises

    log(f / f_0) + mu_t * (relu(A / A_max - 1)^2 + relu(P / P_max - 1)^2
                           + relu((Omega - Omega_max) / Omega_max)^2),

``f`` the objective (latency ``T``, energy ``E`` or EDP ``E T``), ``f_0`` its value at the
start (the base preset, every layer at 8 bits when 8 is a candidate), ``mu_t`` a penalty weight
that grows linearly from ``mu`` to ``10 mu`` (a quadratic-penalty method; Nocedal and Wright,
"Numerical Optimization", ch. 17). This is DOSA's approach (Hong et al., MICRO 2023,
arXiv:2310.04436: gradient descent through an analytical model, then rounding), extended with
the precision mixture.

**Rounding.** rows and cols are rounded down and up (4 shapes), SRAM buffers down to whole KiB,
the bandwidth class is the most probable; shapes over the area budget are dropped without an
evaluation. On each remaining shape the per-layer candidate is decoded from the exact per-layer
tables of that hardware (the relaxed model's forward values): the most probable candidate per
layer, then, while ``Omega > Omega_max``, the change that lowers ``Omega`` at the least objective
cost per unit of ``Omega``, then coordinate descent (a layer moves to a candidate that lowers the
objective and keeps ``Omega <= Omega_max``). Each decoded design is evaluated exactly by
:func:`npujax.lower` (an *exact evaluation*); the base preset at 8 bits is evaluated too when it
is feasible, so the result is never worse than it. The best feasible design wins.

Random and grid search over the same space, with the same exact evaluator, are
:mod:`npujax.search.codesign_baselines` (the baselines of ``docs/results/codesign.md``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from npujax.errors import ConfigError, NpujaxError
from npujax.hw import fields
from npujax.hw.energy import area_mm2
from npujax.hw.spec import NpuSpec, differentiable_spec
from npujax.ir.graph import Graph
from npujax.numerics import check_bits
from npujax.plan.lower import lower
from npujax.plan.passes.base import CostMode
from npujax.plan.program import network, program_cost
from npujax.quantize.spec import quant_spec
from npujax.search.policy import PrecisionPolicy

__all__ = ["BandwidthClass", "BANDWIDTH_CLASSES", "OBJECTIVES", "CodesignConfig", "Design",
           "CodesignResult", "codesign", "evaluate_design"]

#: What :func:`codesign` can minimise.
OBJECTIVES = ("latency", "energy", "edp")

#: The relaxed cost program of the descent (energy included) with the mean slope of fold counts.
_RELAXED = CostMode(relaxed=True, count_slope="mean")

Choice = tuple[int, int]  # (weight_bits, act_bits)


@dataclasses.dataclass(frozen=True)
class BandwidthClass:
    """A DRAM interface the co-design may choose: its bandwidth and what it costs on the chip.

    Attributes:
      name: e.g. ``lpddr4_x16``.
      dram_bytes_per_s: peak bandwidth (B/s).
      phy_area_mm2: area of the memory controller and PHY (mm^2), added to the chip's area.
      phy_power_w: their power while the chip runs (W), added to its average power (the energy
        per DRAM byte is the preset's ``energy.dram_pj_per_byte``, counted per layer).
    """

    name: str
    dram_bytes_per_s: float
    phy_area_mm2: float
    phy_power_w: float


#: The default DRAM interfaces. Bandwidths are the JEDEC peak rates (JESD209-4 LPDDR4-3200,
#: JESD209-5 LPDDR5-6400, JESD235 HBM2E at 3.6 Gb/s per pin x 1024 pins). PHY areas and powers are
#: ASSUMPTIONS of this model, not vendor data: order-of-magnitude figures that grow with the
#: interface width (LPDDR PHYs of a few tenths of a mm^2 per 16 bits, an HBM PHY of several
#: mm^2), held fixed across technology nodes (PHYs shrink little: their area is set by I/O
#: pads and analog circuits). Pass your own table to :class:`CodesignConfig`.
BANDWIDTH_CLASSES = (
    BandwidthClass("lpddr4_x16", 6.4e9, 0.5, 0.05),
    BandwidthClass("lpddr4_x32", 12.8e9, 1.0, 0.10),
    BandwidthClass("lpddr5_x32", 25.6e9, 1.2, 0.15),
    BandwidthClass("lpddr5_x64", 51.2e9, 2.4, 0.30),
    BandwidthClass("hbm2e_x1024", 460.8e9, 8.0, 1.50),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodesignConfig:
    """Settings of :func:`codesign`, validated once.

    Attributes:
      area_mm2: area budget (mm^2): the modelled blocks (:func:`npujax.hw.area_mm2`) plus the
        bandwidth class's PHY.
      power_w: average-power budget (W), or None for none.
      objective: ``latency`` (s), ``energy`` (J per inference) or ``edp`` (J s).
      candidates: widths (bits) for weights and activations; every (w, a) pair is a candidate.
      max_loss_increase: the accuracy constraint: the sum over GEMM layers of the per-layer
        sensitivity (loss increase, nats) of their chosen pair must not exceed it.
      hardware: choose the hardware (False: keep the base preset's, precision-only search).
      precision: choose per-layer widths (False: every layer at the widest candidate,
        hardware-only search).
      steps: Adam steps.
      learning_rate: Adam step size (on log sizes and logits).
      penalty: initial penalty weight ``mu``.
      dim_range: allowed array rows and columns ``(lo, hi)``.
      sram_range_bytes: allowed bytes of each SRAM buffer ``(lo, hi)``.
      bandwidth_classes: the DRAM interfaces to choose from (:data:`BANDWIDTH_CLASSES`).
      dataflow: overrides the preset's dataflow.

    Raises:
      ConfigError: a non-positive or non-finite budget, an unknown objective, bad widths, empty
        or duplicated bandwidth classes, ranges that are empty or not positive.
    """

    area_mm2: float
    power_w: float | None = None
    objective: str = "latency"
    candidates: tuple[int, ...] = (2, 4, 8)
    max_loss_increase: float = 0.05
    hardware: bool = True
    precision: bool = True
    steps: int = 200
    learning_rate: float = 0.05
    penalty: float = 10.0
    dim_range: tuple[int, int] = (2, 256)
    sram_range_bytes: tuple[int, int] = (1024, 16 * 2**20)
    bandwidth_classes: tuple[BandwidthClass, ...] = BANDWIDTH_CLASSES
    dataflow: str | None = None

    def __post_init__(self) -> None:
        def positive(name: str, v: Any) -> None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise ConfigError(f"codesign {name} must be a positive finite number, got {v!r}.")

        positive("area_mm2", self.area_mm2)
        if self.power_w is not None:
            positive("power_w", self.power_w)
        positive("max_loss_increase", self.max_loss_increase)
        positive("learning_rate", self.learning_rate)
        positive("penalty", self.penalty)
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"unknown codesign objective {self.objective!r}; choose one of "
                              f"{', '.join(OBJECTIVES)}.")
        if not self.candidates or len(set(self.candidates)) != len(self.candidates):
            raise ConfigError(f"codesign candidates {self.candidates!r} must be distinct widths, "
                              "e.g. (2, 4, 8).")
        for b in self.candidates:
            try:
                check_bits(b, "codesign candidate")
            except NpujaxError as e:
                raise ConfigError(str(e)) from None
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"codesign steps must be a positive int, got {self.steps!r}.")
        for name, (lo, hi) in (("dim_range", self.dim_range),
                               ("sram_range_bytes", self.sram_range_bytes)):
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ConfigError(f"codesign {name} {(lo, hi)!r} must be two ints 1 <= lo <= hi.")
        if not self.bandwidth_classes:
            raise ConfigError("codesign needs at least one bandwidth class.")
        names = [c.name for c in self.bandwidth_classes]
        if len(set(names)) != len(names):
            raise ConfigError(f"bandwidth class names {names} repeat; give each once.")
        for c in self.bandwidth_classes:
            positive(f"bandwidth class {c.name!r} dram_bytes_per_s", c.dram_bytes_per_s)
            if c.phy_area_mm2 < 0 or c.phy_power_w < 0:
                raise ConfigError(f"bandwidth class {c.name!r} has a negative PHY cost.")

    @property
    def pairs(self) -> tuple[Choice, ...]:
        """The (weight, activation) candidates, weights major."""
        bits = sorted(self.candidates) if self.precision else [max(self.candidates)]
        return tuple(itertools.product(bits, bits))


@dataclasses.dataclass(frozen=True)
class Design:
    """One exactly evaluated design.

    Attributes:
      spec: the NPU (whole rows, cols and SRAM bytes; the class's bandwidth).
      bandwidth: its DRAM interface.
      policy: per-layer widths (GEMM layers).
      latency_s, energy_j, edp_js: of :func:`npujax.lower` on ``spec`` and ``policy``.
      area_mm2: :func:`npujax.hw.area_mm2` plus the PHY (mm^2).
      power_w: ``energy_j / latency_s`` plus the PHY (W).
      loss_increase: the policy's summed sensitivity (nats).
      feasible: within the area, power and accuracy budgets.
      source: what produced it (``gradient``, ``base``, ``random``, ``grid``).
    """

    spec: NpuSpec
    bandwidth: BandwidthClass
    policy: PrecisionPolicy
    latency_s: float
    energy_j: float
    edp_js: float
    area_mm2: float
    power_w: float
    loss_increase: float
    feasible: bool
    source: str

    def objective(self, name: str) -> float:
        """The value of ``latency``, ``energy`` or ``edp``."""
        return {"latency": self.latency_s, "energy": self.energy_j, "edp": self.edp_js}[name]

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures of the design."""
        a, m = self.spec.array, self.spec.memory
        return {"source": self.source, "rows": a.rows, "cols": a.cols,
                "ifmap_sram_bytes": m.ifmap_sram_bytes, "filter_sram_bytes": m.filter_sram_bytes,
                "ofmap_sram_bytes": m.ofmap_sram_bytes, "bandwidth_class": self.bandwidth.name,
                "dram_bytes_per_s": m.dram_bytes_per_s, "latency_s": self.latency_s,
                "energy_j": self.energy_j, "edp_js": self.edp_js, "area_mm2": self.area_mm2,
                "power_w": self.power_w, "loss_increase": self.loss_increase,
                "feasible": self.feasible,
                "policy": {n: [self.policy.weight_bits[n], self.policy.act_bits[n]]
                           for n in self.policy.weight_bits}}


@dataclasses.dataclass(frozen=True)
class CodesignResult:
    """What :func:`codesign` found.

    Attributes:
      best: the chosen design (feasible).
      base: the base preset at the widest candidate (its bandwidth class the nearest one).
      evaluated: every exactly evaluated design, in order.
      trajectory: per Adam step, ``{"objective", "area_mm2", "power_w", "loss_increase"}`` of
        the relaxed model (lists of floats).
      exact_evaluations: calls of :func:`npujax.lower`.
      max_loss_increase: the accuracy constraint used.
    """

    best: Design
    base: Design
    evaluated: tuple[Design, ...]
    trajectory: dict[str, list[float]]
    exact_evaluations: int
    max_loss_increase: float


def _nearest_class(classes: Sequence[BandwidthClass], bw: float) -> int:
    return int(np.argmin([abs(math.log(c.dram_bytes_per_s / bw)) for c in classes]))


def _check_sensitivity(layers: Sequence[str], sensitivity: Mapping[str, Mapping[Any, float]],
                       pairs: Sequence[Choice]) -> np.ndarray:
    """float64 ``[G, n]`` sensitivities of every layer's candidates."""
    missing = [n for n in layers if n not in sensitivity]
    if missing:
        raise ConfigError(f"sensitivity has no entry for GEMM layers {missing}; compute it for "
                          "every layer (npujax.search.loss_sensitivity).")
    out = np.zeros((len(layers), len(pairs)))
    for i, n in enumerate(layers):
        for j, (w, a) in enumerate(pairs):
            s = sensitivity[n]
            if (w, a) in s:
                out[i, j] = float(s[(w, a)])
            elif w in s:
                out[i, j] = float(s[w])
            else:
                raise ConfigError(f"sensitivity of layer {n!r} has no entry for (w, a) = "
                                  f"{(w, a)}; compute it for every candidate pair.")
    return np.maximum(out, 0.0)


class _Problem:
    """The static parts of a co-design: workloads, candidate pairs, the relaxed program."""

    def __init__(self, graph: Graph, base: NpuSpec, sensitivity: Mapping[str, Mapping[Any, float]],
                 config: CodesignConfig) -> None:
        self.graph, self.base, self.config = graph, base, config
        self.layers, self.chains = network(graph, base)
        self.gemm = [i for i, w in enumerate(self.layers) if w.kind == "gemm"]
        if not self.gemm:
            raise ConfigError("the model has no GEMM layer (Conv, Gemm, MatMul) to co-design for.")
        self.names = [self.layers[i].name for i in self.gemm]
        self.other = [i for i in range(len(self.layers)) if i not in self.gemm]
        self.pairs = config.pairs
        self.omega = _check_sensitivity(self.names, sensitivity, self.pairs)
        self.classes = config.bandwidth_classes
        self.bw = np.asarray([c.dram_bytes_per_s for c in self.classes])
        self.phy_area = np.asarray([c.phy_area_mm2 for c in self.classes])
        self.phy_power = np.asarray([c.phy_power_w for c in self.classes])
        self.widest = self.pairs.index((max(p[0] for p in self.pairs),
                                        max(p[1] for p in self.pairs)))
        self.evaluations = 0
        self._tables = jax.jit(self._tables_fn)

    # -- the relaxed model -------------------------------------------------------------------
    def spec_of(self, rows: Any, cols: Any, sram: Any, bw: Any) -> NpuSpec:
        """A float spec with these hardware numbers (traceable)."""
        return fields.replace_traced(differentiable_spec(self.base), {
            "array.rows": rows, "array.cols": cols, "memory.ifmap_sram_bytes": sram[0],
            "memory.filter_sram_bytes": sram[1], "memory.ofmap_sram_bytes": sram[2],
            "memory.dram_bytes_per_s": bw})

    def _tables_fn(self, rows: Any, cols: Any, sram: Any, bw: Any) -> tuple[Any, Any, Any]:
        """``(latency_s [n, L], energy_j [n, L], area_mm2)`` of every candidate column."""
        spec = self.spec_of(rows, cols, sram, bw)
        L = len(self.layers)
        wb = jnp.asarray([[float(w)] * L for w, _ in self.pairs], jnp.float32)
        ab = jnp.asarray([[float(a)] * L for _, a in self.pairs], jnp.float32)
        df = self.config.dataflow

        def column(w: Any, a: Any) -> tuple[Any, Any]:
            # the mean slope of the fold staircases: the descent moves rows and cols over many
            # units, and one unit more (the default slope) is mostly a plateau that only adds
            # fill and drain, which stalled it at the base shape (npujax/_relax.py)
            p = program_cost(self.layers, spec, w, a, df, chains=self.chains, mode=_RELAXED)
            return (p.costs.latency_cycles.astype(jnp.float32) / spec.array.clock_hz,
                    p.layer_energy.total_j.astype(jnp.float32))

        lat, en = jax.vmap(column)(wb, ab)
        return lat, en, area_mm2(spec)

    def expected(self, lat: Any, en: Any, probs: Any) -> tuple[Any, Any]:
        """Expected latency and energy of a per-layer mixture ``probs [G, n]``."""
        g = jnp.asarray(self.gemm, jnp.int32)
        t = jnp.sum(probs * lat[:, g].T)
        e = jnp.sum(probs * en[:, g].T)
        if self.other:
            o = jnp.asarray(self.other, jnp.int32)
            t = t + jnp.sum(lat[self.widest, o])
            e = e + jnp.sum(en[self.widest, o])
        return t, e

    def objective(self, t: Any, e: Any) -> Any:
        return {"latency": t, "energy": e, "edp": t * e}[self.config.objective]

    # -- exact evaluation --------------------------------------------------------------------
    def exact_spec(self, rows: int, cols: int, sram: Sequence[int], k: int) -> NpuSpec:
        c = self.classes[k]
        return self.base.with_fields(
            {"array.rows": int(rows), "array.cols": int(cols),
             "memory.ifmap_sram_bytes": int(sram[0]), "memory.filter_sram_bytes": int(sram[1]),
             "memory.ofmap_sram_bytes": int(sram[2]), "memory.dram_bytes_per_s":
             float(c.dram_bytes_per_s)},
            name=f"{self.base.name}_codesign")

    def total_area(self, spec: NpuSpec, k: int) -> float:
        return float(area_mm2(spec)) + float(self.phy_area[k])

    def evaluate(self, spec: NpuSpec, k: int, choice: Sequence[int], source: str) -> Design:
        """Exact evaluation (one :func:`npujax.lower`) of candidate columns ``choice [G]``."""
        self.evaluations += 1
        w = {n: self.pairs[j][0] for n, j in zip(self.names, choice, strict=True)}
        a = {n: self.pairs[j][1] for n, j in zip(self.names, choice, strict=True)}
        sched = lower(self.graph, spec, quant_spec(self.graph, w, a),
                      dataflow=self.config.dataflow)
        t, e = sched.latency_s, sched.energy_j
        area = self.total_area(spec, k)
        power = e / t + float(self.phy_power[k])
        loss = float(self.omega[np.arange(len(choice)), np.asarray(choice)].sum())
        cfg = self.config
        feasible = (area <= cfg.area_mm2 * (1 + 1e-9) and loss <= cfg.max_loss_increase
                    * (1 + 1e-9) and (cfg.power_w is None or power <= cfg.power_w * (1 + 1e-9)))
        return Design(spec, self.classes[k], PrecisionPolicy(w, a), t, e, e * t, area, power,
                      loss, feasible, source)

    def tables(self, spec: NpuSpec) -> tuple[np.ndarray, np.ndarray]:
        """Exact per-layer ``[n, L]`` latency and energy tables on a concrete spec."""
        m = spec.memory
        lat, en, _ = self._tables(
            jnp.float32(spec.array.rows), jnp.float32(spec.array.cols),
            jnp.asarray([m.ifmap_sram_bytes, m.filter_sram_bytes, m.ofmap_sram_bytes],
                        jnp.float32), jnp.float32(m.dram_bytes_per_s))
        return np.asarray(lat, np.float64), np.asarray(en, np.float64)

    def decode(self, spec: NpuSpec, probs: np.ndarray) -> list[int]:
        """Per-layer candidate columns on ``spec``: argmax, repaired to the accuracy constraint,
        then improved by coordinate descent on the exact per-layer tables."""
        lat, en = self.tables(spec)
        g = np.asarray(self.gemm)
        lt, et = lat[:, g].T, en[:, g].T  # [G, n]
        t0 = float(lat[self.widest, self.other].sum()) if self.other else 0.0
        e0 = float(en[self.widest, self.other].sum()) if self.other else 0.0
        rows = np.arange(len(g))

        def value(c: np.ndarray) -> float:
            return float(self.objective(t0 + lt[rows, c].sum(), e0 + et[rows, c].sum()))

        def loss(c: np.ndarray) -> float:
            return float(self.omega[rows, c].sum())

        limit = self.config.max_loss_increase
        c = np.argmax(probs, axis=1)
        while loss(c) > limit:  # repair: the cheapest reduction of Omega per unit objective
            best, pick = math.inf, None
            for i in rows:
                for j in range(len(self.pairs)):
                    d_omega = self.omega[i, c[i]] - self.omega[i, j]
                    if d_omega <= 0:
                        continue
                    trial = c.copy()
                    trial[i] = j
                    rate = (value(trial) - value(c)) / d_omega
                    if rate < best:
                        best, pick = rate, (i, j)
            if pick is None:
                break
            c[pick[0]] = pick[1]
        for _ in range(4):  # coordinate descent within the constraint
            changed = False
            for i in rows:
                for j in range(len(self.pairs)):
                    trial = c.copy()
                    trial[i] = j
                    if loss(trial) <= limit and value(trial) < value(c) * (1 - 1e-12):
                        c, changed = trial, True
            if not changed:
                break
        return [int(v) for v in c]


def _base_design(p: _Problem) -> Design:
    k = _nearest_class(p.classes, p.base.memory.dram_bytes_per_s)
    spec = p.base if math.isclose(p.base.memory.dram_bytes_per_s, p.bw[k], rel_tol=1e-9) \
        else p.base.with_fields({"memory.dram_bytes_per_s": float(p.bw[k])})
    return p.evaluate(spec, k, [p.widest] * len(p.names), "base")


def _check_reachable(p: _Problem) -> None:
    """The smallest design must fit the area budget, else nothing can."""
    cfg = p.config
    if not cfg.hardware:
        k = _nearest_class(p.classes, p.base.memory.dram_bytes_per_s)
        smallest = p.total_area(p.base, k)
    else:
        lo = cfg.dim_range[0]
        s = cfg.sram_range_bytes[0]
        k = int(np.argmin(p.phy_area))
        smallest = p.total_area(p.exact_spec(lo, lo, (s, s, s), k), k)
    if smallest > cfg.area_mm2:
        raise ConfigError(f"area budget {cfg.area_mm2:.4g} mm^2 is below the smallest design "
                          f"this co-design can build ({smallest:.4g} mm^2 incl. the DRAM PHY); "
                          "raise --area-mm2 or widen the ranges.")
    if float(p.omega.min(axis=1).sum()) > cfg.max_loss_increase:
        raise ConfigError(f"no policy meets the accuracy constraint: even the least sensitive "
                          f"candidates sum to {float(p.omega.min(axis=1).sum()):.4g} nats > "
                          f"{cfg.max_loss_increase:.4g}; raise the allowed loss increase or "
                          "add wider candidates.")


def codesign(graph: Graph, base: NpuSpec, sensitivity: Mapping[str, Mapping[Any, float]],
             config: CodesignConfig) -> CodesignResult:
    """Choose array shape, SRAM sizes, bandwidth class and per-layer widths by gradient.

    See the module docstring for the relaxation, the penalty and the rounding.

    Args:
      graph: the optimized model (BN folded, activations fused).
      base: the preset whose other fields (dataflow, clock, vector unit, energy and area tables,
        ...) the design keeps; the start of the descent.
      sensitivity: ``{layer: {(w, a): loss increase}}`` for every GEMM layer and candidate pair
        (:func:`npujax.search.loss_sensitivity`); a ``{layer: {w: ...}}`` form keyed by the
        weight width is accepted too.
      config: budgets, objective and candidates (:class:`CodesignConfig`).

    Returns:
      A :class:`CodesignResult`; ``best`` is feasible and never worse than ``base`` when the
      base is feasible.

    Raises:
      ConfigError: a budget no design can meet (area below the smallest design, an accuracy
        constraint below the least sensitive policy, or no rounded design within the power
        budget), a model without GEMM layers, missing sensitivities, or a ``base`` whose
        buffers a per-model SRAM split sizes (:func:`npujax.hw.fields.check_varied`).

    Examples:
      >>> res = codesign(graph, load_npu_spec("bitserial_16x16"), sens,
      ...                CodesignConfig(area_mm2=4.0, objective="edp"))  # doctest: +SKIP
    """
    fields.check_varied(base, ("memory.ifmap_sram_bytes", "memory.ofmap_sram_bytes"),
                        "co-design of")
    p = _Problem(graph, base, sensitivity, config)
    _check_reachable(p)
    base_design = _base_design(p)
    evaluated = [base_design]
    lo_d, hi_d = (math.log(v) for v in config.dim_range)
    lo_s, hi_s = (math.log(v) for v in config.sram_range_bytes)
    k0 = _nearest_class(p.classes, base.memory.dram_bytes_per_s)
    m = base.memory
    theta = {
        "dims": jnp.log(jnp.asarray([base.array.rows, base.array.cols], jnp.float32)),
        "sram": jnp.log(jnp.asarray([m.ifmap_sram_bytes, m.filter_sram_bytes,
                                     m.ofmap_sram_bytes], jnp.float32)),
        "bw": 2.0 * jax.nn.one_hot(k0, len(p.classes), dtype=jnp.float32),
        "alpha": 2.0 * jax.nn.one_hot(jnp.full(len(p.names), p.widest), len(p.pairs),
                                      dtype=jnp.float32),
    }
    theta["dims"] = jnp.clip(theta["dims"], lo_d, hi_d)
    theta["sram"] = jnp.clip(theta["sram"], lo_s, hi_s)
    omega = jnp.asarray(p.omega, jnp.float32)
    bw, phy_a, phy_p = (jnp.asarray(v, jnp.float32) for v in (p.bw, p.phy_area, p.phy_power))
    limit = jnp.float32(config.max_loss_increase)
    power_max = jnp.float32(config.power_w if config.power_w is not None else jnp.inf)

    def metrics(th: dict[str, Any]) -> tuple[Any, ...]:
        hw = th if config.hardware else jax.tree.map(jax.lax.stop_gradient, th)
        dims, sram = jnp.exp(hw["dims"]), jnp.exp(hw["sram"])
        q = jax.nn.softmax(hw["bw"]) if config.hardware else jax.nn.one_hot(k0, len(p.classes))
        # every class's tables: the expectation over classes is exact at a one-hot q (the cost
        # at the mean bandwidth would be optimistic: latency is convex in the bandwidth)
        lat, en, area = jax.vmap(lambda b: p._tables_fn(dims[0], dims[1], sram, b))(bw)
        probs = jax.nn.softmax(th["alpha"], axis=1)
        t, e = jax.vmap(lambda lt, et: p.expected(lt, et, probs))(lat, en)
        t, e = jnp.sum(q * t), jnp.sum(q * e)
        area = area[0] + jnp.sum(q * phy_a)
        power = e / t + jnp.sum(q * phy_p)
        loss = jnp.sum(probs * omega)
        return p.objective(t, e), area, power, loss

    f0 = float(p.objective(base_design.latency_s, base_design.energy_j))
    opt = optax.adam(config.learning_rate)

    @jax.jit
    def step(th: dict[str, Any], state: Any, mu: Any) -> tuple[Any, ...]:
        def total(th: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
            f, area, power, loss = metrics(th)
            pen = (jnp.square(jax.nn.relu(area / config.area_mm2 - 1.0))
                   + jnp.where(jnp.isfinite(power_max),
                               jnp.square(jax.nn.relu(power / power_max - 1.0)), 0.0)
                   + jnp.square(jax.nn.relu((loss - limit) / limit)))
            return jnp.log(f / f0) + mu * pen, (f, area, power, loss)

        (_, aux), grads = jax.value_and_grad(total, has_aux=True)(th)
        if not config.precision:
            grads = {**grads, "alpha": jnp.zeros_like(grads["alpha"])}
        updates, state = opt.update(grads, state, th)
        th = optax.apply_updates(th, updates)
        th = {**th, "dims": jnp.clip(th["dims"], lo_d, hi_d),
              "sram": jnp.clip(th["sram"], lo_s, hi_s)}
        return th, state, aux

    state = opt.init(theta)
    traj: dict[str, list[float]] = {"objective": [], "area_mm2": [], "power_w": [],
                                    "loss_increase": []}
    for i in range(config.steps):
        mu = config.penalty * (1.0 + 9.0 * i / max(config.steps - 1, 1))
        theta, state, aux = step(theta, state, jnp.float32(mu))
        for key, v in zip(traj, aux, strict=True):
            traj[key].append(float(v))

    for d in _round(p, theta):
        evaluated.append(d)
    feasible = [d for d in evaluated if d.feasible]
    if not feasible:
        raise ConfigError(
            f"no rounded design meets the budgets (area {config.area_mm2} mm^2, power "
            f"{config.power_w} W, loss increase {config.max_loss_increase}); evaluated "
            f"{[(round(d.area_mm2, 3), round(d.power_w, 3)) for d in evaluated]} (mm^2, W). "
            "Raise a budget or run more steps.")
    best = min(feasible, key=lambda d: d.objective(config.objective))
    return CodesignResult(best, base_design, tuple(evaluated), traj, p.evaluations,
                          config.max_loss_increase)


def _round(p: _Problem, theta: Mapping[str, Any]) -> list[Design]:
    """Exact designs around the relaxed optimum (see the module docstring)."""
    cfg = p.config
    if cfg.hardware:
        dims = np.exp(np.asarray(theta["dims"], np.float64))
        sram = np.exp(np.asarray(theta["sram"], np.float64))
        k = int(np.argmax(np.asarray(theta["bw"])))
        lo, hi = cfg.dim_range
        shapes = sorted({(int(np.clip(r, lo, hi)), int(np.clip(c, lo, hi)))
                         for r in (math.floor(dims[0]), math.ceil(dims[0]))
                         for c in (math.floor(dims[1]), math.ceil(dims[1]))})
        kib = [max(cfg.sram_range_bytes[0], int(s // 1024) * 1024) for s in sram]
        specs = [p.exact_spec(r, c, kib, k) for r, c in shapes]
    else:
        k = _nearest_class(p.classes, p.base.memory.dram_bytes_per_s)
        specs = [p.base.with_fields({"memory.dram_bytes_per_s": float(p.bw[k])})]
    probs = np.asarray(jax.nn.softmax(theta["alpha"], axis=1))
    out = []
    for spec in specs:
        if p.total_area(spec, k) > cfg.area_mm2:
            continue
        out.append(p.evaluate(spec, k, p.decode(spec, probs), "gradient"))
    return out


def evaluate_design(graph: Graph, base: NpuSpec, sensitivity: Mapping[str, Mapping[Any, float]],
                    config: CodesignConfig, *, rows: int, cols: int, sram_bytes: Sequence[int],
                    bandwidth: str, policy: Mapping[str, Choice]) -> Design:
    """Exact evaluation of one design in :func:`codesign`'s space (one :func:`npujax.lower`).

    Raises:
      ConfigError: an unknown bandwidth class, a policy that misses a GEMM layer or uses a
        width outside the candidates, a value a preset cannot hold.
    """
    p = _Problem(graph, base, sensitivity, config)
    names = [c.name for c in p.classes]
    if bandwidth not in names:
        raise ConfigError(f"unknown bandwidth class {bandwidth!r}; known: {names}.")
    k = names.index(bandwidth)
    try:
        choice = [p.pairs.index((int(policy[n][0]), int(policy[n][1]))) for n in p.names]
    except (KeyError, ValueError):
        raise ConfigError(f"policy must give every GEMM layer {p.names} a (w, a) pair among "
                          f"{p.pairs}.") from None
    return p.evaluate(p.exact_spec(rows, cols, sram_bytes, k), k, choice, "manual")
