"""Fit a preset to a device's whole-model benchmark table, judged by leave-one-out.

Vendors publish end-to-end times per model (the Coral Edge TPU's benchmarks page, MLPerf Tiny
and Inference results), not per-layer profiles. :func:`fit_table` fits a few of a preset's
numeric fields at once to such a table:

* **Model.** A model's predicted time is its summed layer latency under the one cost program
  (:func:`npujax.plan.program_cost`, every cost pass of the preset, weights and activations at
  ``bits``). The parameters are the chosen :data:`~npujax.plan.fit.FITTABLE` fields (at most
  :data:`MAX_TABLE_FIELDS`), as in a preset file, so the fitted preset is an ordinary preset.
* **Loss.** A robust loss of the log ratios ``r_i = log(predicted_i / measured_i)``
  (relative errors, so a 2 ms model counts as much as a 300 ms one): by default scipy's
  ``soft_l1``, ``f^2 sum_i 2 (sqrt(1 + (r_i / f)^2) - 1)`` with ``f`` = :data:`TABLE_LOSS_SCALE`
  = 0.1, quadratic for errors well under 10 % and growing like ``2 f |r_i|`` beyond. Why not
  squares: a table has rows the cost model cannot know about (a timed file smaller than the
  published architecture we build, an unpublished compiler choice), and under a squared loss
  such a row, 2x off, pulls the fitted numbers for every other model (Huber, "Robust
  estimation of a location parameter", Ann. Math. Statist. 1964). Why this one: the figure of
  merit is a mean *absolute* relative error, and ``soft_l1`` is the smooth, convex
  approximation of the absolute error (the loss adds no local minima of its own); its scale
  is the noise of the data, not a choice made on them: one model's published figure moves
  10-19 % between versions of a table, so a log error of about 0.1 is where "noise" ends and
  "a row the model cannot know about" begins. The redescending losses (``cauchy``,
  ``arctan``) ignore such rows almost entirely but are not convex. ``loss="linear"`` is the
  plain squared loss. (Losses as in scipy's ``least_squares``; Triggs et al.,
  "Bundle adjustment - a modern synthesis", 2000, sec. 4.3.)
* **Optimiser.** Trust-region least squares (scipy's ``least_squares``, ``trf``, Branch,
  Coleman and Li, SIAM J. Sci. Comput. 1999) in log space within each field's physical range,
  its Jacobian by forward-mode differentiation of the relaxed cost model
  (``CostMode(relaxed=True)``: exact forward values, straight-through gradients of ceilings and
  smooth maxima, ``npujax/_relax.py``). With a handful of parameters it converges in tens of
  model evaluations where Adam needs hundreds.
* **Identifiability.** At the optimum, the Gauss-Newton covariance ``s^2 (J^T W J)^-1`` of the
  log parameters gives each field's relative standard error: ``W`` the robust loss's weights
  ``w_i = rho'((r_i / f)^2)`` (1 for the squared loss), ``s^2 = sum_i w_i r_i^2 / (n - p)``
  (at least ``0.01^2``). These are the weights of the weighted least squares whose solution
  the robust fit is (iteratively reweighted least squares; Holland and Welsch, Commun. Statist.
  1977), so a row the loss discounts informs the errors as little as it informs the values.
  (scipy's returned ``jac`` is scaled by ``sqrt(rho' + 2 z rho'')`` instead: the cost's
  curvature, which for a redescending loss is clipped at zero and is not a weight.) The same
  error is also computed with each row left out in turn, and a field's error is the largest
  of them (:func:`one_out_errors`): a field that one model alone informs is that model's
  number, not the table's. A field above
  :data:`TABLE_IDENTIFIABLE_REL_ERR`, or pinned at a bound of its range, is not
  identified by this table: it is reset to the preset's value and the others are fitted again,
  until every fitted field is identified. A fit never ends worse on the table, by its own
  loss, than the preset it started from (it returns the preset's values if it would).
* **Judged out of sample.** Leave-one-out cross-validation: each model is predicted by a fit of
  the other models (the same procedure, identifiability included). Its MAPE, Spearman's rank
  correlation and worst model are the fit's figures of merit; the in-sample figures are
  reported beside them and are always better.

The table knows nothing about the device: a new device is one preset plus its table
(:func:`read_table`).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import ConfigError
from npujax.hw import fields as hw_fields
from npujax.hw.spec import NpuSpec, differentiable_spec
from npujax.plan.fit import fit_metrics, predict_latency_s, resolve_fields
from npujax.plan.passes.attention import AttentionChain
from npujax.plan.passes.base import CostMode
from npujax.plan.program import program_cost
from npujax.plan.workload import Workload

__all__ = ["MAX_TABLE_FIELDS", "TABLE_IDENTIFIABLE_REL_ERR", "DTYPE_BITS", "TABLE_LOSSES",
           "TABLE_LOSS", "TABLE_LOSS_SCALE", "TableRow", "TableModel", "TableFitResult",
           "read_table", "predict_model_s", "models_needed", "table_loss", "one_out_errors",
           "table_fields", "fit_table"]

#: At most this many fields are fitted to a table: a benchmark table has tens of rows, and
#: every added number makes the fit's parameters less identifiable.
MAX_TABLE_FIELDS = 5

#: A field whose relative standard error (1 sigma) exceeds this is not identified by a table.
#: Looser than a per-layer profile's 10 % (:data:`~npujax.plan.fit.IDENTIFIABLE_REL_ERR`): a
#: table has tens of rows, each measured to about ±10 % (the Coral figures move 10-19 %
#: between published versions), so a field known to ±25 % is still what the table says.
TABLE_IDENTIFIABLE_REL_ERR = 0.25

#: The losses a table fit accepts, by scipy ``least_squares``'s names (``linear``: squares):
#: ``name -> (rho(z), rho'(z))`` of ``z = (r / f)^2``; ``rho'`` is the IRLS weight of a
#: residual ``r``.
TABLE_LOSSES: dict[str, tuple[Callable[[np.ndarray], np.ndarray],
                         Callable[[np.ndarray], np.ndarray]]] = {
    "linear": (lambda z: z, np.ones_like),
    "soft_l1": (lambda z: 2.0 * (np.sqrt(1.0 + z) - 1.0), lambda z: 1.0 / np.sqrt(1.0 + z)),
    "huber": (lambda z: np.where(z <= 1.0, z, 2.0 * np.sqrt(z) - 1.0),
              lambda z: np.where(z <= 1.0, 1.0, 1.0 / np.sqrt(np.maximum(z, 1.0)))),
    "cauchy": (np.log1p, lambda z: 1.0 / (1.0 + z)),
    "arctan": (np.arctan, lambda z: 1.0 / (1.0 + z ** 2)),
}

#: The default loss of a table fit (the module docstring says why).
TABLE_LOSS = "soft_l1"

#: The default scale ``f`` of the robust loss, in log ratio: errors well under ``f`` count as
#: squares, errors well over it about linearly. One model's published time moves 10-19 %
#: between versions of the Coral table, so a table's noise is about 0.1 in log ratio.
TABLE_LOSS_SCALE = 0.1


class TableRow(NamedTuple):
    """One row of a benchmark table (:func:`read_table`).

    Attributes:
      model: the row's label (e.g. ``MobileNet v2``).
      source: what npujax builds for it: a model spec (``keras:MobileNetV2``, ``zoo:NAME``,
        an ``.onnx`` path), or ``""`` where no architecture is given (the row is skipped).
      input_hwc: ``(height, width, channels)`` of the model's input, or None (the model's own).
      measured_s: the measured time per inference (s), > 0.
      group: the row's group (the host, a board), ``""`` when the table has none.
      bits: the width the row's model ran at (a ``bits`` or ``dtype`` column: ``INT8`` is 8,
        ``FP16`` 16), or None: the fit's ``bits``.
    """

    model: str
    source: str
    input_hwc: tuple[int, ...] | None
    measured_s: float
    group: str = ""
    bits: int | None = None


#: Widths of the data types vendors name in benchmark tables (``dtype`` column).
DTYPE_BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8, "int16": 16, "fp16": 16,
              "float16": 16, "bf16": 16, "bfloat16": 16, "tf32": 32, "fp32": 32,
              "float32": 32, "int32": 32}


def _parse_bits(text: str, col: str, where: str) -> int | None:
    text = text.strip().lower()
    if not text:
        return None
    if col == "dtype":
        if text not in DTYPE_BITS:
            raise ConfigError(f"{where}: dtype {text!r} is not one of "
                              f"{', '.join(DTYPE_BITS)}; or give a bits column.")
        return DTYPE_BITS[text]
    try:
        b = int(text)
    except ValueError:
        b = 0
    if not 1 <= b <= 64:
        raise ConfigError(f"{where}: bits must be a whole number in [1, 64], got {text!r}.")
    return b


def _parse_shape(text: str, where: str) -> tuple[int, ...] | None:
    """``(H, W, C)`` of a table's input shape: ``224x224x3`` (or with commas), or a batch-1
    4-D shape as vendors print it, ``[1, 3, 224, 224]`` (NCHW, RKNN's model zoo) or
    ``1x224x224x3`` (NHWC): the channel axis is the one of at most 4 (image channels) where the
    other candidate is larger. Other ranks are kept as given."""
    text = text.strip().lower().strip("[]()").replace(" ", "")
    if not text:
        return None
    try:
        dims = tuple(int(d) for d in text.replace(",", "x").split("x"))
    except ValueError:
        raise ConfigError(f"{where}: input shape {text!r} is not like 224x224x3 (height x "
                          "width x channels) or [1, 3, 224, 224].") from None
    if not dims or any(d < 1 for d in dims):
        raise ConfigError(f"{where}: input shape {text!r} needs positive dimensions.")
    if len(dims) == 4:
        n, a, b, c = dims
        if n != 1:
            raise ConfigError(f"{where}: input shape {text!r} has batch {n}; a benchmark "
                              "table's row is one inference (batch 1).")
        if a <= 4 < c:
            return (b, c, a)  # N C H W
        if c <= 4 < a:
            return (a, b, c)  # N H W C
        raise ConfigError(f"{where}: input shape {text!r} does not say which axis holds the "
                          "channels; write it as height x width x channels (224x224x3).")
    return dims


def read_table(path: str | Path) -> list[TableRow]:
    """Read a benchmark table: a CSV with a header.

    Columns (others are ignored): ``model`` (label), ``measured_ms`` (or ``measured_s``, or
    ``fps``: batch-1 inferences per second, read as ``1 / fps`` seconds),
    optionally ``source`` (the model spec npujax builds; without it the label itself is the
    spec; a relative ``.onnx`` or ``.npz`` path is relative to the table's folder),
    ``input_shape`` or ``input_hwc`` (``224x224x3``, or a batch-1 ``[1, 3, 224, 224]`` /
    ``1x224x224x3``, read as height x width x channels), ``group`` or ``host``, and ``bits``
    or ``dtype`` (``INT8``, ``FP16``, ...: the row's width, :data:`DTYPE_BITS`; empty: the
    fit's).

    Args:
      path: the CSV file.

    Returns:
      The rows, in file order.

    Raises:
      ConfigError: an unreadable file, a missing column, a time that is not a finite positive
        number, or no rows; the message names the line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the benchmark table {p}: {e}") from None
    reader = csv.DictReader(text.splitlines())
    cols = [c.strip() for c in reader.fieldnames or []]
    reader.fieldnames = cols
    time_col = next((c for c in ("measured_ms", "measured_s", "fps") if c in cols), None)
    if "model" not in cols or time_col is None:
        raise ConfigError(f"{p}: a benchmark table needs the columns model and measured_ms "
                          f"(or measured_s, or fps); it has {cols}.")
    bits_col = next((c for c in ("bits", "dtype") if c in cols), None)
    shape_col = next((c for c in ("input_shape", "input_hwc") if c in cols), None)
    group_col = next((c for c in ("group", "host") if c in cols), None)
    rows: list[TableRow] = []
    for k, r in enumerate(reader, start=2):
        where = f"{p}, line {k}"
        label = (r.get("model") or "").strip()
        if not label:
            raise ConfigError(f"{where}: empty model.")
        try:
            t = float(r.get(time_col) or "")
        except ValueError:
            t = float("nan")
        if not (math.isfinite(t) and t > 0):
            raise ConfigError(f"{where}: {time_col} must be a finite number > 0, got "
                              f"{r.get(time_col)!r}.")
        source = ((r.get("source") if "source" in cols else label) or "").strip()
        if source.lower().endswith((".onnx", ".npz")) and not Path(source).is_absolute():
            source = str(p.parent / source)  # a model file beside the table
        seconds = {"measured_ms": t / 1000.0, "measured_s": t, "fps": 1.0 / t}[time_col]
        rows.append(TableRow(label, source,
                             _parse_shape(r.get(shape_col) or "", where) if shape_col else None,
                             seconds, (r.get(group_col) or "").strip() if group_col else "",
                             _parse_bits(r.get(bits_col) or "", bits_col, where)
                             if bits_col else None))
    if not rows:
        raise ConfigError(f"{p}: the benchmark table has no rows.")
    return rows


class TableModel(NamedTuple):
    """A measured model ready to fit: its label, group, workloads on the preset and time.

    Attributes:
      name: the row's label.
      group: the row's group (``""`` for none).
      layers: its workloads on the preset (:func:`npujax.plan.network`).
      chains: its attention blocks (:func:`npujax.plan.network`).
      measured_s: the measured time per inference (s).
      bits: the width it ran at, or None: the caller's ``bits`` (:class:`TableRow`).
    """

    name: str
    group: str
    layers: tuple[Workload, ...]
    chains: tuple[AttentionChain, ...]
    measured_s: float
    bits: int | None = None


def predict_model_s(model: TableModel, spec: NpuSpec, bits: int = 8) -> float:
    """The modelled time (s) of one inference of ``model`` on ``spec``: its summed layer
    latency, exact mode, weights and activations at the model's own width, else ``bits``."""
    return float(np.sum(predict_latency_s(model.layers, spec, bits=model.bits or bits,
                                          chains=model.chains)))


@dataclasses.dataclass(frozen=True)
class TableFitResult:
    """The outcome of :func:`fit_table`.

    Attributes:
      spec: the fitted preset (identified fields fitted, the others as the preset; integer
        fields rounded).
      fields: the fields asked for.
      initial, fitted: ``{field: value}`` before and after (``fitted`` as in ``spec``).
      rel_std_err: ``{field: relative standard error}`` of each asked-for field at the first
        full fit (Gauss-Newton, the largest over the tables without one row:
        :func:`one_out_errors`).
      identifiable: ``{field: bool}``: identified by the table (relative standard error at
        most :data:`TABLE_IDENTIFIABLE_REL_ERR`, not at a bound; else left at the preset).
      not_identified: ``{field: why}`` for each field not identified (no model depends on it,
        its error, a bound, or a fit worse than the preset).
      names, groups: the models' labels and groups, ``[n]``.
      measured_s, preset_s, fitted_s, loo_s: float64 ``[n]``: measured; predicted by the
        preset; by the fit of every model (in sample); by the fit without that model
        (leave-one-out, out of sample). ``loo_s`` is NaN without cross-validation.
      loo_fitted: ``[n]`` ``{field: value}`` of each leave-one-out fit.
      metrics: ``{"preset"|"in_sample"|"loo": fit_metrics(...)}``
        (:func:`npujax.plan.fit.fit_metrics`: MAPE %, Spearman, RMS log error, total error).
      bits: the width every layer was costed at (a model's own width, if it has one, instead).
      loss, loss_scale: the loss the fit minimised (:data:`TABLE_LOSSES`) and its scale.
      cost: ``{"preset"|"in_sample": table_loss(...)}``, the loss of every model's log ratio
        at the preset and at the fit (:func:`table_loss`; the second not the larger, up to
        the rounding of integer fields).
    """

    spec: NpuSpec
    fields: tuple[str, ...]
    initial: dict[str, float]
    fitted: dict[str, float]
    rel_std_err: dict[str, float]
    identifiable: dict[str, bool]
    not_identified: dict[str, str]
    names: tuple[str, ...]
    groups: tuple[str, ...]
    measured_s: np.ndarray
    preset_s: np.ndarray
    fitted_s: np.ndarray
    loo_s: np.ndarray
    loo_fitted: tuple[dict[str, float], ...]
    metrics: dict[str, dict[str, float]]
    bits: int
    loss: str
    loss_scale: float
    cost: dict[str, float]

    @property
    def worst(self) -> tuple[str, float]:
        """The model with the largest out-of-sample error (in-sample without cross-validation)
        and its ratio predicted / measured."""
        pred = self.loo_s if np.all(np.isfinite(self.loo_s)) else self.fitted_s
        k = int(np.argmax(np.abs(np.log(pred / self.measured_s))))
        return self.names[k], float(pred[k] / self.measured_s[k])


def models_needed(n_fields: int, cross_validate: bool = True) -> int:
    """The fewest measured models that can fit ``n_fields`` fields: each fit needs more models
    than fields, and a leave-one-out fit has one model fewer (at least 2 in any case)."""
    return max(n_fields + (2 if cross_validate else 1), 2)


def _check_loss(loss: str, scale: float) -> None:
    if loss not in TABLE_LOSSES:
        raise ConfigError(f"unknown table-fit loss {loss!r}; choose one of "
                          f"{', '.join(TABLE_LOSSES)} (default {TABLE_LOSS}; linear = squares).")
    try:
        f = float(scale)
    except (TypeError, ValueError):
        f = math.nan
    if not (math.isfinite(f) and f > 0):
        raise ConfigError(f"the loss scale must be a finite number > 0 (a log ratio, e.g. "
                          f"{TABLE_LOSS_SCALE}), got {scale!r}.")


def table_loss(log_ratios: np.ndarray | Sequence[float], loss: str = TABLE_LOSS,
               scale: float = TABLE_LOSS_SCALE) -> float:
    """The cost a table fit minimises: ``scale^2 sum_i rho((r_i / scale)^2)`` of the log ratios
    ``r_i = log(predicted_i / measured_i)`` (``sum_i r_i^2`` for ``loss="linear"``; twice
    scipy's ``least_squares`` cost).

    Args:
      log_ratios: float ``[n]``, the models' ``log(predicted / measured)``.
      loss: one of :data:`TABLE_LOSSES`.
      scale: the loss's scale ``f`` in log ratio, > 0 (ignored by ``linear``).

    Returns:
      The cost (>= 0; 0 only when every ratio is 1).

    Raises:
      ConfigError: an unknown loss or a scale that is not a finite number > 0.
    """
    _check_loss(loss, scale)
    r = np.asarray(log_ratios, np.float64)
    if loss == "linear":
        return float(np.sum(r ** 2))
    return float(scale ** 2 * np.sum(TABLE_LOSSES[loss][0]((r / scale) ** 2)))


def _loss_weights(r: np.ndarray, loss: str, scale: float) -> np.ndarray:
    """The IRLS weights ``rho'((r / scale)^2)`` of residuals ``r`` (ones for ``linear``)."""
    if loss == "linear":
        return np.ones_like(r)
    return np.asarray(TABLE_LOSSES[loss][1]((r / scale) ** 2), np.float64)


_RELAXED = CostMode(relaxed=True, temperature=0.05, count_slope="mean", energy=False)


@functools.lru_cache(maxsize=64)
def _log_total_and_jacobian(layers: tuple[Workload, ...], chains: tuple[AttentionChain, ...],
                            fields: tuple[str, ...], bits: int) -> Callable[..., Any]:
    """The jitted ``(log seconds, d log seconds / d log fields)`` of one model under the
    relaxed cost program, as a function of ``(spec, log field values)``: one compiled program
    per model, fields and width, kept for the next fit (leave-one-out, another table)."""
    wb = jnp.full(len(layers), float(bits), jnp.float64)

    def log_total(base: NpuSpec, lv: jax.Array) -> jax.Array:
        s = hw_fields.replace_traced(base, {f: jnp.exp(lv[i]) for i, f in enumerate(fields)})
        c = program_cost(layers, s, wb, wb, chains=chains, mode=_RELAXED).costs
        return jnp.log(jnp.sum(c.latency_cycles) / s.array.clock_hz)

    return jax.jit(lambda base, lv: (log_total(base, lv),
                                     jax.jacfwd(log_total, argnums=1)(base, lv)))


class _Residuals:
    """``log(predicted / measured)`` of every model and its Jacobian in the log parameters,
    one compiled program per model (the relaxed cost model, forward mode)."""

    def __init__(self, models: Sequence[TableModel], spec: NpuSpec, fields: tuple[str, ...],
                 bits: int, progress: Callable[[str], None] | None) -> None:
        self.models = tuple(models)
        self.fields = fields
        self.log_meas = np.log([m.measured_s for m in models])
        with jax.enable_x64(True):
            self._base = differentiable_spec(spec, jnp.float64)
            self._fns = [_log_total_and_jacobian(m.layers, m.chains, fields, m.bits or bits)
                         for m in self.models]
        self._cache: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self._progress = progress

    def __call__(self, lv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(r [n], J [n, p])`` at log parameters ``lv`` (memoised)."""
        key = np.asarray(lv, np.float64).tobytes()
        hit = self._cache.get(key)
        if hit is None:
            rs, js = [], []
            with jax.enable_x64(True):
                x = jnp.asarray(lv, jnp.float64)
                for k, fn in enumerate(self._fns):
                    if self._progress is not None and not self._cache:
                        self._progress(f"compiling the cost program of {self.models[k].name}")
                    r, j = fn(self._base, x)
                    rs.append(float(r))
                    js.append(np.asarray(j, np.float64))
            hit = (np.asarray(rs) - self.log_meas, np.stack(js))
            self._cache[key] = hit
        return hit


def _solve(res: _Residuals, rows: np.ndarray, free: list[int], lv0: np.ndarray,
           lo: np.ndarray, hi: np.ndarray, loss: str, scale: float) -> np.ndarray:
    """The ``loss`` fit over ``rows`` in the ``free`` log parameters (the others stay at
    ``lv0``); returns the full log-parameter vector."""
    from scipy.optimize import least_squares

    if not free:
        return lv0.copy()

    def full(x: np.ndarray) -> np.ndarray:
        lv = lv0.copy()
        lv[free] = x
        return lv

    sol = least_squares(lambda x: res(full(x))[0][rows],
                        np.clip(lv0[free], lo[free], hi[free]),
                        jac=lambda x: res(full(x))[1][np.ix_(rows, np.asarray(free))],
                        bounds=(lo[free], hi[free]), method="trf", x_scale="jac",
                        loss=loss, f_scale=scale,
                        xtol=1e-10, ftol=1e-12, gtol=1e-12, max_nfev=100)
    return full(sol.x)


def _gauss_newton_errors(r: np.ndarray, j: np.ndarray, w: np.ndarray, n_free: int
                         ) -> np.ndarray:
    """The standard errors ``sqrt(diag(s^2 (J^T W J)^-1))`` of weighted least squares with
    residuals ``r`` (n,), Jacobian ``j`` (n, p) and weights ``w`` (n,), ``s^2 = sum w r^2 /
    (n - n_free)`` floored at ``0.01^2``. A direction no row informs gets a huge error (the
    normal matrix is regularised by ``1e-12`` of its trace), never a zero one."""
    dof = max(len(r) - n_free, 1)
    s2 = max(float(np.sum(w * r ** 2)) / dof, 1e-4)
    jtj = j.T @ (w[:, None] * j)
    eps = 1e-12 * max(float(np.trace(jtj)), 1e-30)
    cov = s2 * np.linalg.pinv(jtj + eps * np.eye(j.shape[1]))
    return np.sqrt(np.maximum(np.diag(cov), 0.0))


def one_out_errors(r: np.ndarray, j: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each parameter's largest standard error over the tables that leave one row out.

    The Gauss-Newton error (the module docstring) says how well the whole table
    determines a parameter. A parameter that only one row informs (one model whose time
    depends on it) has a small error too, because that row alone fixes it, yet the estimate
    is that row's, and a table without it says nothing. Leaving each row out in turn (the
    deletion diagnostics of Belsley, Kuh and Welsch, "Regression Diagnostics", 1980, ch. 2;
    the jackknife's idea, linearised at the optimum: the same ``J`` and ``r``, one row fewer)
    and keeping each parameter's largest error tells the two apart: a parameter is determined
    by the table only if it is determined without any one of its rows.

    Args:
      r: (n,) float residuals (log ratios) at the optimum.
      j: (n, p) float Jacobian of ``r`` in the log parameters.
      w: (n,) float IRLS weights of the loss (1 for least squares).

    Returns:
      (p,) float64: the largest standard error of each log parameter (its relative error)
      over the ``n`` tables of ``n - 1`` rows; ``inf``-like (huge) where leaving one row out
      leaves the parameter undetermined.
    """
    n, p = j.shape
    if n <= p:
        return np.full(p, np.inf)
    every = np.arange(n)
    return np.max([_gauss_newton_errors(r[k], j[k], w[k], p)
                   for k in (np.delete(every, i) for i in range(n))], axis=0)


def _rel_err(res: _Residuals, rows: np.ndarray, free: list[int], lv: np.ndarray,
             loss: str, scale: float) -> np.ndarray:
    """Each free log parameter's standard error: the larger of the Gauss-Newton error
    ``s^2 (J^T W J)^-1`` with the loss's IRLS weights ``W`` (the module docstring) and the
    largest such error with any one row left out (:func:`one_out_errors`)."""
    r, j = res(lv)
    r, j = r[rows], j[np.ix_(rows, np.asarray(free))]
    w = _loss_weights(r, loss, scale)
    return np.maximum(_gauss_newton_errors(r, j, w, len(free)), one_out_errors(r, j, w))


def _fit_rows(res: _Residuals, rows: np.ndarray, lv0: np.ndarray, lo: np.ndarray,
              hi: np.ndarray, loss: str, scale: float
              ) -> tuple[np.ndarray, dict[int, float], list[int], dict[int, str]]:
    """The identified fit over ``rows``: ``(log parameters, {index: rel err at the first
    fit}, identified indices, {index: why it is not identified})``; never worse on ``rows``
    than ``lv0`` by ``loss``."""
    # a field no measured model depends on (a zero Jacobian column) is not identified
    j0 = np.abs(res(lv0)[1][rows])
    free = [i for i in range(len(lv0)) if float(np.max(j0[:, i])) > 1e-9]
    why = {i: "no model's time depends on it" for i in range(len(lv0)) if i not in free}
    first: dict[int, float] = {i: math.inf for i in why}
    lv = lv0.copy()
    while free:
        lv = _solve(res, rows, free, lv0, lo, hi, loss, scale)
        err = _rel_err(res, rows, free, lv, loss, scale)
        if len(first) < len(lv0):
            first.update({i: float(e) for i, e in zip(free, err)})
        span = hi - lo
        pinned = [i for i in free if min(lv[i] - lo[i], hi[i] - lv[i]) < 1e-3 * span[i]]
        bad = [i for i, e in zip(free, err) if e > TABLE_IDENTIFIABLE_REL_ERR or i in pinned]
        if not bad:
            break
        # drop the least determined field, back to the preset's value, and fit the rest again
        e_of = dict(zip(free, err))
        worst = max(bad, key=lambda i: (i in pinned, e_of[i]))
        why[worst] = ("the fit ends at a bound of its range" if worst in pinned else
                      f"its relative standard error {e_of[worst]:.0%} (the largest with any one "
                      f"row left out) exceeds {TABLE_IDENTIFIABLE_REL_ERR:.0%}")
        free.remove(worst)
        lv = lv0.copy()
    if not free:
        lv = lv0.copy()
    r0 = res(lv0)[0][rows]
    r1 = res(lv)[0][rows]
    if table_loss(r1, loss, scale) > table_loss(r0, loss, scale):
        why.update({i: "the fit predicts the table worse than the preset" for i in free})
        return lv0.copy(), first, [], why
    return lv, first, free, why


def table_fields(fields: Sequence[str], spec: NpuSpec) -> tuple[str, ...]:
    """The ``section.key`` paths of ``fields``, checked for a table fit of ``spec``: what
    :func:`fit_table` refuses, without any model (so a command fails before building them).

    Args:
      fields: names or paths of :data:`~npujax.plan.fit.FITTABLE` fields.
      spec: the starting preset.

    Returns:
      The resolved paths, in order.

    Raises:
      ConfigError: an unknown or unfittable field, one the spec ignores, more than
        :data:`MAX_TABLE_FIELDS`, or a starting value outside the field's range (a field the
        preset leaves at 0, "not modelled", included).
    """
    full = resolve_fields(fields)
    hw_fields.check_varied(spec, full, "fitted field")
    if len(full) > MAX_TABLE_FIELDS:
        raise ConfigError(f"fit at most {MAX_TABLE_FIELDS} fields to a benchmark table, got "
                          f"{len(full)} ({', '.join(full)}); a table of tens of models cannot "
                          "identify more.")
    for f in full:
        flo, fhi = hw_fields.log_range(f)
        v = float(hw_fields.get(spec, f))
        if not flo <= v <= fhi:
            raise ConfigError(f"the starting value {f} = {v:g} is outside its range "
                              f"[{flo:g}, {fhi:g}]; set it in the preset first (0 means "
                              "not modelled, and a fit starts from the preset's value).")
    return full


def fit_table(
    models: Sequence[TableModel],
    spec: NpuSpec,
    fields: Sequence[str],
    *,
    bits: int = 8,
    cross_validate: bool = True,
    loss: str = TABLE_LOSS,
    loss_scale: float = TABLE_LOSS_SCALE,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> TableFitResult:
    """Fit ``fields`` of ``spec`` to the measured whole-model times of ``models``.

    Args:
      models: the measured models (:class:`TableModel`, workloads on ``spec``), at least
        :func:`models_needed` of them.
      spec: the starting preset; fields not fitted (or not identified) keep their values.
      fields: at most :data:`MAX_TABLE_FIELDS` fields of :data:`~npujax.plan.fit.FITTABLE`
        (``key`` or ``section.key``).
      bits: width of every layer's weights and activations (8 for an int8 device), for the
        models without a width of their own (``TableModel.bits``).
      cross_validate: also run leave-one-out (one more fit per model).
      loss: the loss of the log ratios, one of :data:`TABLE_LOSSES` (default ``soft_l1``:
        robust to a row the cost model cannot explain; ``linear``: least squares).
      loss_scale: the robust loss's scale in log ratio (default 0.1: a table's noise).
      name: the fitted preset's name (default ``<spec>_fitted``).
      progress: called with a line of text at each stage (compiles, each fold).

    Returns:
      A :class:`TableFitResult`.

    Raises:
      ConfigError: more than :data:`MAX_TABLE_FIELDS` fields, unknown fields, a starting value
        outside a field's range, too few models, an unknown loss or a scale not > 0, or
        fitted values a preset cannot hold.

    Examples:
      >>> from npujax.plan.fit_table import fit_table  # doctest: +SKIP
      >>> r = fit_table(models, load_npu_spec("coral_edgetpu"),
      ...               ["dram_bytes_per_s", "link_latency_s"])  # doctest: +SKIP
      >>> r.metrics["loo"]["mape"], r.identifiable  # doctest: +SKIP
    """
    _check_loss(loss, loss_scale)
    loss_scale = float(loss_scale)
    full = table_fields(fields, spec)
    n = len(models)
    need = models_needed(len(full), cross_validate)
    if n < need:
        raise ConfigError(f"{n} measured model(s) cannot fit {len(full)} field(s)"
                          f"{' with leave-one-out' if cross_validate else ''}: each fit needs "
                          f"more models than fields, so give at least {need} (models of "
                          "different kinds: compute-, memory- and overhead-bound).")
    lo, hi, v0 = [], [], []
    for f in full:
        flo, fhi = hw_fields.log_range(f)
        lo.append(math.log(flo))
        hi.append(math.log(fhi))
        v0.append(float(hw_fields.get(spec, f)))
    lo_a, hi_a = np.asarray(lo), np.asarray(hi)
    lv0 = np.log(np.asarray(v0))
    res = _Residuals(models, spec, full, bits, progress)
    every = np.arange(n)
    lv, first, ident, why = _fit_rows(res, every, lv0, lo_a, hi_a, loss, loss_scale)
    loo = np.full(n, np.nan)
    loo_fitted: list[dict[str, float]] = []
    if cross_validate:
        for k in range(n):
            if progress is not None:
                progress(f"leave-one-out {k + 1}/{n}: fitting without {models[k].name}")
            lv_k, _, _, _ = _fit_rows(res, np.delete(every, k), lv0, lo_a, hi_a, loss,
                                   loss_scale)
            loo[k] = math.exp(res(lv_k)[0][k] + res.log_meas[k])
            loo_fitted.append({f: float(math.exp(lv_k[i])) for i, f in enumerate(full)})

    integer = {f: isinstance(hw_fields.get(spec, f), int) for f in full}
    changes: dict[str, Any] = {}
    for i, f in enumerate(full):
        if i in ident:
            v = float(math.exp(lv[i]))
            changes[f] = int(max(1, round(v))) if integer[f] else v
    try:
        fitted_spec = hw_fields.replace(spec, changes, name=name or f"{spec.name}_fitted")
    except ConfigError as e:
        raise ConfigError(f"the fitted values cannot form a preset: {e}") from None
    fitted_spec = dataclasses.replace(
        fitted_spec, description=(
            f"{spec.name} with {', '.join(changes) or 'nothing'} fitted to a benchmark table of "
            f"{n} models (npujax fit --table). {spec.description}").strip())
    meas = np.asarray([m.measured_s for m in models])
    preset = np.asarray([predict_model_s(m, spec, bits) for m in models])
    fitted = np.asarray([predict_model_s(m, fitted_spec, bits) for m in models])
    metrics = {"preset": fit_metrics(meas, preset), "in_sample": fit_metrics(meas, fitted)}
    if cross_validate:
        metrics["loo"] = fit_metrics(meas, loo)
    return TableFitResult(
        spec=fitted_spec, fields=full,
        initial={f: v0[i] for i, f in enumerate(full)},
        fitted={f: float(hw_fields.get(fitted_spec, f)) for f in full},
        rel_std_err={f: first.get(i, float("inf")) for i, f in enumerate(full)},
        identifiable={f: i in ident for i, f in enumerate(full)},
        not_identified={f: why[i] for i, f in enumerate(full) if i not in ident},
        names=tuple(m.name for m in models), groups=tuple(m.group for m in models),
        measured_s=meas, preset_s=preset, fitted_s=fitted, loo_s=loo,
        loo_fitted=tuple(loo_fitted), metrics=metrics, bits=bits, loss=loss,
        loss_scale=loss_scale,
        cost={"preset": table_loss(np.log(preset / meas), loss, loss_scale),
              "in_sample": table_loss(np.log(fitted / meas), loss, loss_scale)})
