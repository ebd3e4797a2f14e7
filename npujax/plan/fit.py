"""Fit a hardware preset to a measured per-layer profile by gradient descent.

The cost model (the one cost program, :func:`npujax.plan.program_costs`, with every cost pass of
the preset) is differentiable in its relaxed mode (``CostMode(relaxed=True)``,
``npujax/_relax.py``: exact forward values, straight-through and smooth-maximum gradients), so the
preset's numbers can be fitted to what a device measures, as one fits any model's parameters:

* **Parameters.** The chosen numeric :class:`~npujax.hw.NpuSpec` fields (:data:`FITTABLE`), and
  where the user allows them, an *efficiency factor* per op class (:func:`op_class`: the
  modelled latency of the class is divided by it, so it absorbs what the analytical model gets
  wrong for a whole kind of layer) and a fixed *per-layer overhead* in seconds (kernel launch,
  dispatch). Each is kept inside its physical range ``[lo, hi]`` (the range preset validation
  enforces; fields that may be 0 use ``hi x 1e-9`` as ``lo``,
  :func:`npujax.hw.fields.log_range`) by a bounded reparametrisation in log space:
  ``value = exp(log lo + sigmoid(u) (log hi - log lo))`` with ``u`` unbounded, so every step of
  the optimiser stays physical.
* **Loss.** The mean squared error of log latencies over the measured layers,
  ``mean((log model_i - log measured_i)^2)`` (relative errors, so a 10 us layer counts as much
  as a 10 ms one), plus ``regularization x mean(log efficiency^2)``: the factors and the
  hardware's overall speed are otherwise interchangeable, and the small penalty puts the shared
  part into the hardware fields.
* **Optimiser.** Adam (optax, Kingma and Ba, arXiv:1412.6980) on ``u`` with a cosine-decayed
  learning rate, the whole run one jitted ``lax.scan`` per chunk of steps.
* **Identifiability.** At the optimum, ``J = d log model / d log value`` (``[layers, params]``,
  forward-mode through the relaxed model) gives the Gauss-Newton covariance ``s^2 (J^T J +
  eps)^-1`` of the log parameters, ``s`` the RMS log residual (at least 1 %). A parameter whose
  relative standard error exceeds :data:`IDENTIFIABLE_REL_ERR` is reported as *not
  identifiable* by this profile: e.g. on a model whose layers are all compute-bound, ``clock_hz``
  and ``rows`` x ``cols`` scale the same latencies, and only their product is determined. Such a
  field keeps the preset's value and the identified ones are fitted again without it; a fit that
  would end worse on the profile than the preset returns the preset's values.

Integer fields (rows, cols, cores, lanes, SRAM bytes) are fitted as reals and rounded when the
preset is written; :func:`fit_spec` reports the exact model of the rounded preset as the fit's
result, so the numbers it reports are what ``npujax lower`` gives with the written file.

References: fitting simulator parameters to measurements by gradient, DiffTune (Renda et al.,
MICRO 2020, arXiv:1912.00103), which needed a learned surrogate; here the analytical model is
differentiated itself.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax import _program_cache
from npujax.errors import ConfigError
from npujax.hw import fields as hw_fields
from npujax.hw.spec import NpuSpec, differentiable_spec
from npujax.plan.costs import LayerCosts
from npujax.plan.passes.attention import AttentionChain
from npujax.plan.passes.base import LATENCY, CostMode
from npujax.plan.program import program_cost
from npujax.plan.workload import Workload

__all__ = ["FITTABLE", "OP_CLASSES", "IDENTIFIABLE_REL_ERR", "FitConfig", "FitResult",
           "op_class", "resolve_fields", "fit_spec", "predict_latency_s", "exact_layer_costs",
           "fit_metrics"]

#: The spec fields :func:`fit_spec` may fit (``section.key``; traced fields,
#: :func:`npujax.hw.fields.is_traced`, that change latency smoothly). Layout and operator fields
#: change the workloads, width fields the arithmetic itself; they are not fitted.
FITTABLE = (
    "array.rows", "array.cols", "array.clock_hz", "array.cores",
    "memory.ifmap_sram_bytes", "memory.filter_sram_bytes", "memory.ofmap_sram_bytes",
    "memory.dram_bytes_per_s", "memory.dram_latency_s",
    "vector.lanes", "vector.special_cycles_per_elem",
    "host.cpu_ops_per_s", "host.link_bytes_per_s", "host.link_latency_s",
    "host.invocation_overhead_s", "host.elementwise_elems_per_s",
)

#: Op classes of the efficiency factors (:func:`op_class`).
OP_CLASSES = ("conv", "depthwise", "matmul", "vector", "layout", "cpu")

#: A parameter whose relative standard error (1 sigma) exceeds this is not identifiable.
IDENTIFIABLE_REL_ERR = 0.1

#: Range of an efficiency factor (dimensionless) and of the per-layer overhead (s).
EFFICIENCY_RANGE = (1e-3, 1e3)
OVERHEAD_RANGE = (1e-9, 1e-2)


def op_class(w: Workload) -> str:
    """The efficiency class of a layer: ``cpu`` (host fallback), ``layout`` (layout
    transforms), ``vector`` (vector unit), ``depthwise`` (grouped convolutions), ``conv`` (Conv and
    ConvTranspose) or ``matmul`` (other GEMMs: Gemm, MatMul, Einsum)."""
    if w.device == "cpu":
        return "cpu"
    if w.kind == "layout":
        return "layout"
    if w.kind != "gemm":
        return "vector"
    if w.groups > 1:
        return "depthwise"
    return "conv" if w.op in ("Conv", "ConvTranspose") else "matmul"


def resolve_fields(names: Sequence[str]) -> tuple[str, ...]:
    """Full ``section.key`` names of fittable fields given as ``key`` or ``section.key``.

    Raises:
      ConfigError: an unknown, ambiguous, not fittable or repeated name, or none.
    """
    short: dict[str, list[str]] = {}
    for f in FITTABLE:
        short.setdefault(hw_fields.parse(f)[1], []).append(f)
    out: list[str] = []
    for raw in names:
        n = raw.strip()
        full = n if n in FITTABLE else (short[n][0] if len(short.get(n, [])) == 1 else None)
        if full is None:
            raise ConfigError(f"cannot fit {raw!r}; fittable fields are {', '.join(short)} "
                              "(or section.key).")
        if full in out:
            raise ConfigError(f"field {full!r} is given twice.")
        out.append(full)
    if not out:
        raise ConfigError("give at least one field to fit, e.g. clock_hz,dram_bytes_per_s.")
    return tuple(out)


def _to_value(u: jax.Array, lo: Any, hi: Any) -> jax.Array:
    return jnp.exp(jnp.log(lo) + jax.nn.sigmoid(u) * (jnp.log(hi) - jnp.log(lo)))


def _to_u(value: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    s = (np.log(value) - np.log(lo)) / (np.log(hi) - np.log(lo))
    s = np.clip(s, 1e-6, 1 - 1e-6)
    return np.log(s) - np.log1p(-s)


def predict_latency_s(layers: Sequence[Workload], spec: NpuSpec,
                      efficiency: Mapping[str, float] | None = None,
                      overhead_s: float = 0.0, bits: int = 8, *,
                      chains: Sequence[AttentionChain] = ()) -> np.ndarray:
    """float64 ``[L]`` modelled seconds per layer (the one cost program, exact mode, weights and
    activations at ``bits``; ``chains`` the graph's attention blocks, :func:`npujax.plan.network`),
    with the fit's efficiency factors (``{class: factor}``, missing classes 1) and per-layer
    overhead (s)."""
    c = exact_layer_costs(layers, spec, bits, chains=chains)
    lat = np.asarray(c.latency_cycles, np.float64) / spec.array.clock_hz
    eff = np.asarray([(efficiency or {}).get(op_class(w), 1.0) for w in layers])
    return lat / eff + overhead_s


def exact_layer_costs(layers: Sequence[Workload], spec: NpuSpec, bits: int = 8, *,
                      chains: Sequence[AttentionChain] = ()) -> LayerCosts:
    """The one cost program's per-layer costs, exact mode without energy, every layer's weights
    and activations at ``bits``: :class:`~npujax.plan.LayerCosts` of float64 ``[L]`` arrays
    (array cycles; counts int64). One traced program per workload list, run with numpy
    (``npujax._program_cache.evaluate``, as ``lower`` runs its own) and kept for the next spec
    (the fit's predictions, a table's bounds).

    Raises:
      ConfigError: as :func:`npujax.plan.program_cost`.
    """
    key = (tuple(layers), tuple(chains))
    with jax.enable_x64(True):
        wb = np.full(len(layers), float(bits), np.float32)
        return jax.tree.map(np.asarray, _program_cache.evaluate(
            _exact_program(*key), (spec, wb, wb), lambda: _exact_costs(*key)(spec, wb, wb),
            name="exact_costs", static=key))


def _exact_program(layers: tuple[Workload, ...], chains: tuple[AttentionChain, ...] = ()
                   ) -> Callable[..., Any]:
    return lambda spec, w, a: program_cost(layers, spec, w, a, chains=chains,
                                           mode=LATENCY).costs


@functools.lru_cache(maxsize=32)
def _exact_costs(layers: tuple[Workload, ...], chains: tuple[AttentionChain, ...] = ()
                 ) -> Callable[..., Any]:
    return jax.jit(_exact_program(layers, chains))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitConfig:
    """How :func:`fit_spec` fits: the extra parameters, ranges, optimiser and output name.

    Validated once, on construction; what is fitted to what (the workloads, the starting preset,
    the measurements and the fields) are :func:`fit_spec`'s arguments.

    Attributes:
      efficiency: also fit one efficiency factor (dimensionless, in
        ``EFFICIENCY_RANGE``) per :func:`op_class` present among the measured layers.
      overhead: also fit one fixed per-layer overhead (seconds, in ``OVERHEAD_RANGE``,
        every measured layer).
      bounds: ``{field: (lo, hi)}`` narrowing a field's physical range (in the field's unit;
        ``key`` or ``section.key``, kept as full ``section.key`` names in a read-only
        mapping); each must satisfy ``range lo <= lo < hi <= range hi``. None: the physical
        ranges (:func:`npujax.hw.fields.log_range`).
      steps: Adam steps (int >= 1).
      learning_rate: peak Adam step size on the unbounded parameters (finite, > 0), decayed by
        a cosine schedule to 1 % over ``steps``.
      regularization: weight (finite, >= 0) of ``mean(log efficiency^2)`` in the loss.
      temperature: relative temperature of the relaxed cost model (in ``(0, 10]``,
        ``npujax._relax.relaxed``).
      chunk: steps (int >= 1) per jitted ``lax.scan`` between progress reports.
      bits: width (int in ``[1, 64]``) of every layer's weights and activations (8; 32 for an
        fp32 runtime such as onnxruntime on a CPU, with ``array.operand_bits = 32``).
      name: the fitted preset's name; None (or empty): ``<spec>_fitted``.

    Raises:
      ConfigError: a field of the wrong type or out of range; the message names the field, the
        value received and the fix.

    Examples:
      >>> from npujax.plan import FitConfig
      >>> c = FitConfig(efficiency=True, steps=300, bounds={"clock_hz": (1e8, 5e9)})
      >>> dict(c.bounds)
      {'array.clock_hz': (100000000.0, 5000000000.0)}
    """

    efficiency: bool = False
    overhead: bool = False
    bounds: Mapping[str, tuple[float, float]] | None = dataclasses.field(default=None,
                                                                         hash=False)
    steps: int = 400
    learning_rate: float = 0.1
    regularization: float = 1e-3
    temperature: float = 0.05
    chunk: int = 50
    bits: int = 8
    name: str | None = None

    def __post_init__(self) -> None:
        for what in ("efficiency", "overhead"):
            if not isinstance(getattr(self, what), bool):
                raise ConfigError(f"FitConfig.{what} must be True or False, got "
                                  f"{getattr(self, what)!r}.")
        for what, lo, fix in (("steps", 1, "e.g. steps=400"), ("chunk", 1, "e.g. chunk=50"),
                              ("bits", 1, "a width in [1, 64], e.g. bits=8")):
            v = getattr(self, what)
            if (isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo
                    or (what == "bits" and v > 64)):
                rule = "a width in [1, 64]" if what == "bits" else f"an int >= {lo}"
                raise ConfigError(f"FitConfig.{what} must be {rule}, got {v!r}; pass {fix}.")

        def number(what: str, ok: Callable[[float], bool], rule: str, fix: str) -> None:
            v = getattr(self, what)
            if (isinstance(v, bool) or not isinstance(v, int | float | np.number)
                    or not math.isfinite(v) or not ok(float(v))):
                raise ConfigError(f"FitConfig.{what} must be {rule}, got {v!r}; pass {fix}.")

        number("learning_rate", lambda v: v > 0, "a finite number > 0", "e.g. learning_rate=0.1")
        number("regularization", lambda v: v >= 0, "a finite number >= 0",
               "e.g. regularization=1e-3 (0: none)")
        number("temperature", lambda v: 0 < v <= 10, "in (0, 10]", "e.g. temperature=0.05")
        if self.name is not None and not isinstance(self.name, str):
            raise ConfigError(f"FitConfig.name must be a preset name (str) or None, got "
                              f"{self.name!r}.")
        if self.bounds is not None:
            if not isinstance(self.bounds, Mapping):
                raise ConfigError(f"FitConfig.bounds must be a mapping {{field: (lo, hi)}}, got "
                                  f"{self.bounds!r}; pass e.g. bounds={{'clock_hz': (1e8, "
                                  "5e9)}}.")
            out: dict[str, tuple[float, float]] = {}
            for key, rng in self.bounds.items():
                if not isinstance(key, str):
                    raise ConfigError(f"FitConfig.bounds keys must be field names (str), got "
                                      f"{key!r}; e.g. bounds={{'clock_hz': (1e8, 5e9)}}.")
                try:
                    (f,) = resolve_fields([key])
                except ConfigError as e:
                    raise ConfigError(f"FitConfig.bounds: {e}") from None
                if f in out:
                    raise ConfigError(f"FitConfig.bounds gives {f} twice (as {key!r}); give "
                                      "each field once.")
                flo, fhi = hw_fields.log_range(f)
                try:
                    blo, bhi = (float(x) for x in rng)
                except (TypeError, ValueError):
                    raise ConfigError(f"FitConfig.bounds[{key!r}] must be a pair (lo, hi) of "
                                      f"numbers, got {rng!r}.") from None
                if not flo <= blo < bhi <= fhi:
                    raise ConfigError(f"FitConfig.bounds of {f} must satisfy {flo:g} <= lo < hi "
                                      f"<= {fhi:g}, got ({blo:g}, {bhi:g}); narrow the "
                                      "field's physical range, do not widen or invert it.")
                out[f] = (blo, bhi)
            object.__setattr__(self, "bounds", types.MappingProxyType(out))


@dataclasses.dataclass(frozen=True)
class FitResult:
    """The outcome of :func:`fit_spec`.

    Attributes:
      spec: the fitted preset (integer fields rounded, validated as a preset file is).
      fields: the fitted ``section.key`` fields.
      bits: the width every layer was costed at.
      initial, fitted: ``{field: value}`` before and after (``fitted`` as in ``spec``).
      efficiency: ``{op class: factor}`` (empty unless allowed).
      overhead_s: the fitted per-layer overhead in seconds (0 unless allowed).
      rel_std_err: ``{parameter: relative standard error}`` of every fitted parameter
        (fields, ``efficiency.<class>``, ``overhead_s``) at the optimum.
      identifiable: ``{parameter: bool}``: ``rel_std_err <= IDENTIFIABLE_REL_ERR``.
      loss: float ``[steps]``, the loss at each step.
      layer_index: int ``[P]``, the fitted layers (into the workloads).
      measured_s, before_s, after_s: float64 ``[P]``: measured, modelled with the initial
        spec, modelled with ``spec`` (and the factors), exact mode.
    """

    spec: NpuSpec
    fields: tuple[str, ...]
    bits: int
    initial: dict[str, float]
    fitted: dict[str, float]
    efficiency: dict[str, float]
    overhead_s: float
    rel_std_err: dict[str, float]
    identifiable: dict[str, bool]
    loss: np.ndarray
    layer_index: np.ndarray
    measured_s: np.ndarray
    before_s: np.ndarray
    after_s: np.ndarray


def fit_metrics(measured_s: np.ndarray, modelled_s: np.ndarray) -> dict[str, float]:
    """``mape`` (mean absolute percentage error, %), ``spearman`` (rank correlation, scipy's
    ``spearmanr``), ``rms_log_err`` and ``total_err_pct`` (error of the summed latency, %)."""
    from scipy.stats import spearmanr

    m, p = np.asarray(measured_s, np.float64), np.asarray(modelled_s, np.float64)
    rho = float(spearmanr(m, p).statistic) if len(m) > 1 else float("nan")
    return {"mape": float(np.mean(np.abs(p - m) / m) * 100.0),
            "spearman": rho if math.isfinite(rho) else 0.0,
            "rms_log_err": float(np.sqrt(np.mean(np.log(p / m) ** 2))),
            "total_err_pct": float((p.sum() / m.sum() - 1.0) * 100.0)}


def fit_spec(
    layers: Sequence[Workload],
    spec: NpuSpec,
    layer_index: np.ndarray,
    measured_s: np.ndarray,
    fields: Sequence[str],
    *,
    config: FitConfig | None = None,
    chains: Sequence[AttentionChain] = (),
    progress: Callable[[int, float], None] | None = None,
) -> FitResult:
    """Fit ``fields`` of ``spec`` (and optional efficiency factors and overhead) to
    ``measured_s`` by Adam on the log-latency error through the relaxed cost model.

    Args:
      layers: the model's workloads on ``spec`` (:func:`npujax.plan.workloads`); every layer
        is costed with weights and activations at the config's ``bits``.
      spec: the starting preset; fields not fitted keep their values.
      layer_index: int ``[P]``, the measured layers (indices into ``layers``).
      measured_s: float ``[P]`` measured seconds of those layers (> 0).
      fields: fields to fit, ``key`` or ``section.key`` of :data:`FITTABLE`.
      config: how to fit (:class:`FitConfig`: factors, overhead, bounds, Adam, width, name);
        None: ``FitConfig()``.
      chains: the graph's attention blocks (:func:`npujax.plan.network`), so the fit's model
        is the one ``lower`` reports (every cost pass of the preset, relaxed: the cross-layer
        placement's decisions carry no gradient, its costs follow the chosen branch).
      progress: called ``progress(step, loss)`` after every step (e.g. a progress bar).

    Returns:
      A :class:`FitResult`.

    Raises:
      ConfigError: bad fields, bounds for fields not fitted, a starting value outside its fit
        range, mismatched or non-positive measurements, a config that is not a
        :class:`FitConfig`, or a fitted value the preset cannot hold.

    Examples:
      >>> from npujax.plan import FitConfig, fit_spec, network  # doctest: +SKIP
      >>> layers, chains = network(graph, spec)  # doctest: +SKIP
      >>> r = fit_spec(layers, spec, index, measured_s, ["clock_hz", "dram_bytes_per_s"],
      ...              config=FitConfig(efficiency=True, steps=300),
      ...              chains=chains)  # doctest: +SKIP
      >>> r.spec, r.identifiable  # doctest: +SKIP
    """
    if config is None:
        config = FitConfig()
    elif not isinstance(config, FitConfig):
        raise ConfigError(f"fit_spec's config must be a FitConfig, got {type(config).__name__}; "
                          "pass config=FitConfig(steps=..., ...).")
    efficiency, overhead, bounds, bits = (config.efficiency, config.overhead, config.bounds,
                                          config.bits)
    steps, chunk, learning_rate, regularization = (config.steps, config.chunk,
                                                   config.learning_rate, config.regularization)
    full = resolve_fields(fields)
    hw_fields.check_varied(spec, full, "fitted field")
    idx = np.asarray(layer_index, np.int64)
    meas = np.asarray(measured_s, np.float64)
    if idx.ndim != 1 or idx.shape != meas.shape or idx.size == 0:
        raise ConfigError(f"layer_index {idx.shape} and measured_s {meas.shape} must be equal, "
                          "non-empty 1-D arrays.")
    if np.any(idx < 0) or np.any(idx >= len(layers)):
        raise ConfigError(f"layer_index must index the {len(layers)} layers.")
    if not np.all(np.isfinite(meas) & (meas > 0)):
        raise ConfigError("measured latencies must be finite and > 0 seconds; drop layers "
                          "measured as 0 (below the profiler's resolution).")
    lo, hi = [], []
    for f in full:
        flo, fhi = bounds[f] if bounds and f in bounds else hw_fields.log_range(f)
        v0 = float(hw_fields.get(spec, f))
        if not flo <= v0 <= fhi:
            raise ConfigError(f"the starting value {f} = {v0:g} is outside its fit range "
                              f"[{flo:g}, {fhi:g}]; widen the bounds.")
        lo.append(flo)
        hi.append(fhi)
    unknown = set(bounds or {}) - set(full)
    if unknown:
        raise ConfigError(f"bounds given for fields not fitted: {sorted(unknown)}; fit them "
                          "too, or drop their bounds from the FitConfig.")
    classes = [op_class(layers[i]) for i in idx]
    eff_names = sorted(set(classes)) if efficiency else []
    cls_index = np.asarray([eff_names.index(c) if efficiency else 0 for c in classes], np.int64)
    labels = list(full) + [f"efficiency.{c}" for c in eff_names] + (["overhead_s"]
                                                                      if overhead else [])
    lo += [EFFICIENCY_RANGE[0]] * len(eff_names) + ([OVERHEAD_RANGE[0]] if overhead else [])
    hi += [EFFICIENCY_RANGE[1]] * len(eff_names) + ([OVERHEAD_RANGE[1]] if overhead else [])
    init = ([float(hw_fields.get(spec, f)) for f in full] + [1.0] * len(eff_names)
            + ([1e-6] if overhead else []))
    lo_a, hi_a = np.asarray(lo), np.asarray(hi)
    u0 = _to_u(np.asarray(init), lo_a, hi_a)
    nf, ne = len(full), len(eff_names)
    wb = jnp.full(len(layers), float(bits), jnp.float32)
    tl = tuple(layers)
    relaxed = CostMode(relaxed=True, temperature=config.temperature, count_slope="mean",
                       energy=False)

    with jax.enable_x64(True):
        base = differentiable_spec(spec, jnp.float64)
        log_meas = jnp.log(jnp.asarray(meas))

        def model_log_s(values: jax.Array) -> jax.Array:
            s = hw_fields.replace_traced(base, {f: values[i] for i, f in enumerate(full)})
            # the mean slope of fold counts: a descent over many units (as codesign's)
            c = program_cost(tl, s, wb, wb, chains=chains, mode=relaxed).costs
            lat = c.latency_cycles[idx] / s.array.clock_hz
            if ne:
                lat = lat / values[nf:nf + ne][cls_index]
            if overhead:
                lat = lat + values[-1]
            return jnp.log(jnp.maximum(lat, 1e-30))

        def loss_fn(u: jax.Array) -> jax.Array:
            v = _to_value(u, lo_a, hi_a)
            err = jnp.mean((model_log_s(v) - log_meas) ** 2)
            if ne:
                err = err + regularization * jnp.mean(jnp.log(v[nf:nf + ne]) ** 2)
            return err

        import optax

        schedule = optax.cosine_decay_schedule(learning_rate, steps, alpha=0.01)
        opt = optax.adam(schedule)

        @functools.partial(jax.jit, static_argnames="n")
        def run(u, state, n):
            def step(carry, _):
                u, state = carry
                loss, g = jax.value_and_grad(loss_fn)(u)
                g = jnp.where(jnp.isfinite(g), g, 0.0)
                upd, state = opt.update(g, state, u)
                return (optax.apply_updates(u, upd), state), loss
            (u, state), losses = jax.lax.scan(step, (u, state), None, length=n)
            return u, state, losses

        u = jnp.asarray(u0)
        state = opt.init(u)
        history: list[np.ndarray] = []
        done = 0
        while done < steps:
            n = min(chunk, steps - done)
            with jax.numpy_dtype_promotion("standard"):  # optax's schedules mix int and float
                u, state, losses = run(u, state, n)
            losses = np.asarray(losses)
            history.append(losses)
            if progress is not None:
                for k, loss in enumerate(losses):
                    progress(done + k + 1, float(loss))
            done += n
        values = np.asarray(_to_value(u, lo_a, hi_a))
        # identifiability: Gauss-Newton covariance of the log parameters at the optimum
        jac, resid = jax.jit(lambda lv: (jax.jacfwd(lambda x: model_log_s(jnp.exp(x)))(lv),
                                         model_log_s(jnp.exp(lv)) - log_meas))(
            jnp.log(jnp.asarray(values)))
        jac, resid = np.asarray(jac), np.asarray(resid)
    sigma = max(float(np.sqrt(np.mean(resid ** 2))), 0.01)
    jtj = jac.T @ jac
    eps = 1e-9 * max(float(np.trace(jtj)), 1e-12)
    cov = sigma ** 2 * np.linalg.inv(jtj + eps * np.eye(len(labels)))
    rel = np.sqrt(np.maximum(np.diag(cov), 0.0))
    rel_err = {k: float(r) for k, r in zip(labels, rel)}

    identified = {k: bool(r <= IDENTIFIABLE_REL_ERR) for k, r in rel_err.items()}
    fitted_raw = {f: float(values[i]) if identified[f] else float(hw_fields.get(spec, f))
                  for i, f in enumerate(full)}
    keep = [f for f in full if identified[f]]
    if len(keep) < len(full) and keep:
        # a field the profile does not identify keeps the preset's value: fit the others again
        again = fit_spec(layers, spec, idx, meas, keep, config=config, chains=chains)
        fitted_raw.update({f: float(hw_fields.get(again.spec, f)) for f in keep})
        values = np.concatenate([[fitted_raw[f] for f in full], [
            again.efficiency.get(c, 1.0) for c in eff_names],
            [again.overhead_s] if overhead else []])
    integer = {f: isinstance(hw_fields.get(spec, f), int) for f in full}
    fitted = {f: float(max(1, round(v))) if integer[f] else v for f, v in fitted_raw.items()}
    changes = {f: (int(v) if integer[f] else v) for f, v in fitted.items()}
    try:
        fitted_spec = hw_fields.replace(spec, changes,
                                        name=config.name or f"{spec.name}_fitted")
    except ConfigError as e:
        raise ConfigError(f"the fitted values cannot form a preset: {e}") from None
    fitted_spec = dataclasses.replace(
        fitted_spec, description=f"{spec.name} with {', '.join(full)} fitted to a measured "
                                 f"profile (npujax fit). {spec.description}".strip())
    eff = {c: float(values[nf + k]) for k, c in enumerate(eff_names)}
    ovh = float(values[-1]) if overhead else 0.0
    before = predict_latency_s(layers, spec, bits=bits, chains=chains)[idx]
    after = predict_latency_s(layers, fitted_spec, eff, ovh, bits, chains=chains)[idx]
    if not keep or (np.mean(np.log(after / meas) ** 2) > np.mean(np.log(before / meas) ** 2)):
        # nothing identified, or a fit worse than the preset on its own data: the preset stays
        fitted_spec = dataclasses.replace(spec, name=config.name or f"{spec.name}_fitted")
        fitted = {f: float(hw_fields.get(spec, f)) for f in full}
        eff, ovh, after = {c: 1.0 for c in eff_names}, 0.0, before
    return FitResult(
        spec=fitted_spec, fields=full, bits=bits,
        initial={f: float(hw_fields.get(spec, f)) for f in full},
        fitted=fitted, efficiency=eff, overhead_s=ovh, rel_std_err=rel_err,
        identifiable=identified,
        loss=np.concatenate(history), layer_index=idx, measured_s=meas, before_s=before,
        after_s=after)
