"""The ``npujax fit --table`` workflow: fit a preset to a device's benchmark table.

:func:`fit_benchmark_table` reads the table (:func:`npujax.plan.fit_table.read_table`), builds
every row's model that npujax can build (``keras:NAME``, ``zoo:NAME``, ONNX files, saved npujax
models; rows without an architecture are listed as skipped, never guessed), fits the chosen
fields with leave-one-out cross-validation (:func:`npujax.plan.fit_table.fit_table`), and
:func:`write_table_fit` writes ``fitted.toml`` (a preset every ``--npu`` accepts),
``predictions.csv`` (each model's out-of-sample prediction), ``fit.json`` and the log-log plot
``predictions.png``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from npujax._atomic import atomic_write_text
from npujax.errors import ConfigError, GraphError, NpujaxError
from npujax.hw.spec import NpuSpec, as_spec, spec_to_toml
from npujax.ir.graph import Graph
from npujax.plan.fit_table import (
    TABLE_IDENTIFIABLE_REL_ERR,
    TABLE_LOSS,
    TABLE_LOSS_SCALE,
    TableFitResult,
    TableModel,
    TableRow,
    fit_table,
    models_needed,
    read_table,
    table_fields,
    table_loss,
)
from npujax.plan.program import Network, network
from npujax.report import plot_measured_vs_modelled, write_json

__all__ = ["TableFitRun", "CHANNEL_MINOR", "table_graph", "deployed_spec", "deployed_model",
           "table_network",
           "fit_benchmark_table", "model_bound", "loss_label", "print_table_fit",
           "write_table_fit"]

#: Device activation layouts with the channels innermost (``NC1HWC0`` is NHWC in blocks of
#: ``c0`` channels): a table's NCHW model is built channels-last for them.
CHANNEL_MINOR = ("NHWC", "NC1HWC0")


@dataclasses.dataclass(frozen=True)
class TableFitRun:
    """A finished table fit with what its report shows.

    Attributes:
      table: the table file; group: the group fitted (None: every row).
      rows: the rows fitted, aligned with ``result``'s models.
      skipped: ``(row, reason)`` of the rows npujax could not build or that were filtered out.
      start: the starting preset; result: the fit.
      bounds: ``[n]`` the bound of each model's slowest layer on the fitted preset
        (``compute``, ``memory``, ``transfer``, ``fallback``), and the share of its time.
      base: the preset name or TOML path the fit started from (``fitted.toml`` keeps its
        comments and sources); None when it started from an :class:`NpuSpec` object.
    """

    table: str
    group: str | None
    rows: tuple[TableRow, ...]
    skipped: tuple[tuple[TableRow, str], ...]
    start: NpuSpec
    result: TableFitResult
    bounds: tuple[str, ...]
    base: str | None = None


def table_graph(row: TableRow, layout: str | None = None) -> Graph:
    """The optimized graph of one table row's model, at the row's input shape.

    ``keras:NAME`` gets ``input_shape=HxWxC`` from the row (unless the spec sets it); an ONNX
    model keeps its own static shape, and a dynamic one takes ``1 x C x H x W``.

    A benchmark table times the vendor's own deployed model, whose input arrives in the
    device's layout. So with a channels-minor ``layout`` (:data:`CHANNEL_MINOR`, the preset's
    ``layout.activation_layout``: ``NHWC``, or ``NC1HWC0`` as Rockchip's NC1HWC2) an NCHW
    model (an ONNX export of a PyTorch model) is rewritten channels-last
    (:func:`npujax.ir.passes.channels_last`): the same layers, without the input and output
    layout conversions that :func:`npujax.lower` would cost for an NCHW model on such a device
    and that the measured model does not have (:func:`table_network` builds it).

    Raises:
      ConfigError: a row without a source; errors of the model's loader.
      GraphError: an NCHW model that cannot be rewritten channels-last.
    """
    from npujax.workflows.fit import load_model_graphs

    src = row.source
    if not src:
        raise ConfigError(f"row {row.model!r} names no architecture (empty source).")
    if src.startswith("zoo:"):  # the zoo's ONNX file, then at the row's shape as any ONNX
        from npujax.models.zoo import MODELS, fetch_model

        if src[4:] not in MODELS:
            raise ConfigError(f"row {row.model!r}: unknown zoo model {src[4:]!r}; known: "
                              f"{', '.join(sorted(MODELS))}.")
        src = str(fetch_model(src[4:]))
    shapes = None
    if row.input_hwc is not None:
        hwc = "x".join(str(d) for d in row.input_hwc)
        if src.startswith("keras:"):
            if "input_shape=" not in src:
                src = f"{src}:input_shape={hwc}"
        elif src.lower().endswith(".onnx") and len(row.input_hwc) == 3:
            h, w, c = row.input_hwc
            from npujax.frontends.onnx import dynamic_input_shape

            shapes = dynamic_input_shape(src, (1, c, h, w))
            if shapes is None:
                _check_static_shape(src, row)
    graph = load_model_graphs(src, shapes)[1]
    if layout in CHANNEL_MINOR:
        from npujax.ir.passes import channels_last

        graph = channels_last(graph, {})[0]
    return graph


def _check_static_shape(path: str, row: TableRow) -> None:
    """Refuse a single-input ONNX file fixed at another 4-D input than the row's (it would be
    costed at its own shape, not the measured one)."""
    from npujax.frontends.onnx import load_onnx_model

    m = load_onnx_model(path)
    inits = {i.name for i in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in inits]
    if len(ins) != 1 or row.input_hwc is None:
        return
    dims = tuple(d.dim_value for d in ins[0].type.tensor_type.shape.dim)
    h, w, c = row.input_hwc
    if len(dims) == 4 and dims[1:] not in ((c, h, w), (h, w, c)):
        raise ConfigError(f"row {row.model!r} was measured at {h}x{w}x{c}, but {path} has a "
                          f"fixed input {list(dims)}: export it at the row's shape (or with a "
                          "dynamic one), or correct the row's input_shape.")


def deployed_spec(spec: NpuSpec, model_layout: str = "NHWC") -> NpuSpec:
    """The spec a table's model (activations in ``model_layout``) is built on, as the device
    runs its own deployed model: whose input arrives in the device's layout and whose outputs
    leave in it, so no conversion between layouts at the graph's input and outputs (what a
    vendor's benchmark times: RKNN's ``rknn_run`` after ``rknn_inputs_set``, the Edge TPU's
    ``Invoke``).

    For a channels-minor device (:data:`CHANNEL_MINOR`): ``spec`` with ``activation_layout =
    model_layout`` and channels padded to the device's ``lcm(c0, channel_alignment)`` (``c0``
    only for ``NC1HWC0``), i.e. the device's padding and operators without the boundary
    conversions; ``spec`` itself where that is already so, or for any other device layout.
    Only the workloads differ: the cost program does not read the layout."""
    lay = spec.layout
    if lay.activation_layout not in CHANNEL_MINOR or model_layout not in ("NHWC", "NCHW"):
        return spec
    align = lay.channel_alignment
    if lay.activation_layout == "NC1HWC0":
        align = math.lcm(lay.c0, align)
    if lay.activation_layout == model_layout and align == lay.channel_alignment:
        return spec
    return spec.with_fields({"layout.activation_layout": model_layout,
                             "layout.channel_alignment": align})


def deployed_model(graph: Graph, spec: NpuSpec) -> tuple[Graph, NpuSpec]:
    """``(graph, spec)`` as the device runs its own deployed model, the model a vendor's
    benchmark times: on a channels-minor device (:data:`CHANNEL_MINOR`) the graph rewritten
    channels-last (:func:`npujax.ir.passes.channels_last`), or kept in its own layout where
    that rewrite does not apply (a per-channel constant, a Slice of a 4-D activation); either
    way on :func:`deployed_spec`, so without layout conversions at the graph's input and
    outputs. Any other device: both unchanged. ``fit --table`` and ``npujax lower
    --deployed`` cost this model.

    Args:
      graph: an optimized graph (NCHW or NHWC activations).
      spec: the device.

    Returns:
      The graph and spec to cost.
    """
    from npujax.ir.passes import channels_last
    from npujax.plan.workload import model_layout

    if spec.layout.activation_layout in CHANNEL_MINOR:
        try:
            graph = channels_last(graph, {})[0]
        except GraphError:
            pass  # kept in its own layout: deployed_spec drops its boundary conversions
    return graph, deployed_spec(spec, model_layout(graph))


def table_network(row: TableRow, spec: NpuSpec) -> Network:
    """One table row's model on ``spec`` as the device runs its own deployed model
    (:func:`table_graph` at the row's shape, then :func:`deployed_model`).

    Raises:
      ConfigError: as :func:`table_graph`; LimitError: as :func:`npujax.plan.network`.
    """
    return network(*deployed_model(table_graph(row, None), spec))


def fit_benchmark_table(
    table: str | Path,
    npu: str | NpuSpec,
    fields: Sequence[str],
    *,
    group: str | None = None,
    bits: int = 8,
    cross_validate: bool = True,
    loss: str = TABLE_LOSS,
    loss_scale: float = TABLE_LOSS_SCALE,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> TableFitRun:
    """Fit ``fields`` of the preset ``npu`` to the measured models of a benchmark table.

    Args:
      table: the CSV (:func:`npujax.plan.fit_table.read_table`).
      npu: the starting preset (name, TOML path or spec).
      fields: the fields to fit (at most :data:`~npujax.plan.fit_table.MAX_TABLE_FIELDS`).
      group: fit only the rows of this group (``group`` or ``host`` column); None: every row,
        which needs a table of one group.
      bits: width of every layer's weights and activations.
      cross_validate: also predict each model from a fit without it.
      loss: the fit's loss of the log ratios (:func:`npujax.plan.fit_table.fit_table`;
        default ``soft_l1``; ``linear``: least squares).
      loss_scale: the robust loss's scale in log ratio (default 0.1).
      name: the fitted preset's name.
      progress: called with a line of text per stage.

    Returns:
      A :class:`TableFitRun`.

    Raises:
      ConfigError: an unreadable table, a table of several groups without ``group``, an
        unknown group, fewer buildable rows than needed; as
        :func:`npujax.plan.fit_table.fit_table`.
    """
    spec = as_spec(npu)
    table_loss([], loss, loss_scale)  # an unknown loss fails before any model is built
    table_fields(fields, spec)  # and so do the fields
    rows = read_table(table)
    groups = sorted({r.group for r in rows})
    if group is None and len(groups) > 1:
        raise ConfigError(f"the table has {len(groups)} groups ({', '.join(groups)}); pick one "
                          "with --group (a preset describes one host).")
    if group is not None and group not in groups:
        raise ConfigError(f"no rows of group {group!r}; the table's groups are "
                          f"{', '.join(groups) or '(none)'}.")
    buildable = [r for r in rows if r.source and (group is None or r.group == group)]
    need = models_needed(len(fields), cross_validate)
    if len(buildable) < need:  # before building anything
        skipped_n = sum(1 for r in rows if not r.source and (group is None or r.group == group))
        raise ConfigError(f"{len(buildable)} row(s) name a model to build"
                          f"{f' ({skipped_n} without a source skipped)' if skipped_n else ''}; "
                          f"fitting {len(fields)} field(s)"
                          f"{' with leave-one-out' if cross_validate else ''} needs at least "
                          f"{need}.")
    used: list[TableRow] = []
    models: list[TableModel] = []
    skipped: list[tuple[TableRow, str]] = []
    for r in rows:
        if group is not None and r.group != group:
            continue
        if not r.source:
            skipped.append((r, "no architecture given (empty source)"))
            continue
        if progress is not None:
            progress(f"building {r.model} ({r.source})")
        try:
            net = table_network(r, spec)
        except NpujaxError as e:
            skipped.append((r, str(e)))
            if progress is not None:
                progress(f"  not built, skipped: {e}")
            continue
        used.append(r)
        models.append(TableModel(r.model, r.group, net.layers, net.chains, r.measured_s,
                                 r.bits))
    result = fit_table(models, spec, fields, bits=bits, cross_validate=cross_validate,
                       loss=loss, loss_scale=loss_scale, name=name, progress=progress)
    bounds = tuple(model_bound(m, result.spec, bits) for m in models)
    return TableFitRun(str(table), group, tuple(used), tuple(skipped), spec, result, bounds,
                       None if isinstance(npu, NpuSpec) else str(npu))


def model_bound(model: TableModel, spec: NpuSpec, bits: int = 8) -> str:
    """What bounds a model on ``spec``: the part holding most of its modelled time
    (``compute``: array, vector unit and conversions; ``memory``: DMA and stalls;
    ``fallback``: the host CPU; ``transfer``: the host link) and its share, e.g.
    ``"memory 86%"`` (the one cost program, exact mode, every layer at the model's width,
    else ``bits``)."""
    import numpy as np

    from npujax.plan.fit import exact_layer_costs

    c = exact_layer_costs(model.layers, spec, model.bits or bits, chains=model.chains)
    total_of = lambda *vs: float(sum(np.sum(np.asarray(v, np.float64)) for v in vs))  # noqa: E731
    parts = {"compute": total_of(c.compute_cycles, c.convert_cycles),
             "memory": total_of(c.dma_cycles, c.stall_cycles),
             "fallback": total_of(c.fallback_cycles), "transfer": total_of(c.transfer_cycles)}
    total = sum(parts.values()) or 1.0
    k = max(parts, key=lambda p: parts[p])
    return f"{k} {parts[k] / total:.0%}"


def _ms(v: float) -> str:
    return "-" if not math.isfinite(v) else (f"{v * 1e3:.3g}" if v < 1 else f"{v * 1e3:.4g}")


def _pct(pred: float, meas: float) -> str:
    return "-" if not math.isfinite(pred) else f"{(pred / meas - 1) * 100:+.1f} %"


def prediction_rows(run: TableFitRun) -> list[dict[str, Any]]:
    """One dict per model: label, group, source, measured and predicted ms, errors, bound."""
    r = run.result
    return [{"model": row.model, "group": row.group, "source": row.source,
             "measured_ms": float(r.measured_s[k] * 1e3),
             "preset_ms": float(r.preset_s[k] * 1e3),
             "fitted_ms": float(r.fitted_s[k] * 1e3),
             "loo_ms": float(r.loo_s[k] * 1e3),
             "loo_error_pct": float((r.loo_s[k] / r.measured_s[k] - 1) * 100),
             "bound": run.bounds[k]}
            for k, row in enumerate(run.rows)]


def print_table_fit(console: Console, run: TableFitRun) -> None:
    """Print the fitted numbers, the per-model predictions and the figures of merit."""
    r = run.result
    t = Table(title=f"fitted numbers ({r.spec.name})")
    for c in ("field", "preset", "fitted", "rel. std. err.", "identified"):
        t.add_column(c, justify="left" if c == "field" else "right")
    for f in r.fields:
        t.add_row(f, f"{r.initial[f]:.4g}", f"{r.fitted[f]:.4g}",
                  f"{r.rel_std_err[f]:.1%}" if math.isfinite(r.rel_std_err[f]) else "inf",
                  "yes" if r.identifiable[f] else
                  f"no: kept at the preset ({r.not_identified.get(f, '')})")
    console.print(t)
    console.print(f"rel. std. err.: the largest of the Gauss-Newton error with every row and "
                  f"with each row left out; identified at <= "
                  f"{TABLE_IDENTIFIABLE_REL_ERR:.0%} and not at a bound of its range "
                  "(docs/fit.md)")
    t = Table(title="time per inference (ms): out-of-sample = fitted without that model")
    for c in ("model", "measured", "preset", "out-of-sample", "error", "bound"):
        t.add_column(c, justify="left" if c in ("model", "bound") else "right")
    for k, row in enumerate(run.rows):
        t.add_row(row.model, _ms(r.measured_s[k]), _ms(r.preset_s[k]), _ms(r.loo_s[k]),
                  _pct(r.loo_s[k], r.measured_s[k]), run.bounds[k])
    console.print(t)
    t = Table(title="figures of merit")
    for c in ("", "MAPE", "Spearman", "total error"):
        t.add_column(c, justify="left" if not c else "right")
    for key, label in (("preset", "preset"), ("in_sample", "fit, in sample"),
                       ("loo", "fit, leave-one-out")):
        if key in r.metrics:
            m = r.metrics[key]
            rho = f"{m['spearman']:.3f}" if len(r.names) >= 4 else "n/a (< 4 models)"
            t.add_row(label, f"{m['mape']:.1f} %", rho, f"{m['total_err_pct']:+.1f} %")
    console.print(t)
    worst, ratio = r.worst
    console.print(f"worst model: {worst} (predicted/measured = {ratio:.2f})")
    a = run.start.array
    if a.cores > 1 and a.cores_per_inference == 0:
        console.print(f"note: {run.start.name} splits every layer over its {a.cores} cores; a "
                      "table measured on fewer (RKNN's default core mask runs a model on one) "
                      "needs array.cores_per_inference in the preset.")
    console.print(f"loss: {loss_label(r)}")
    for row, why in run.skipped:
        console.print(f"skipped {row.model}: {why}")


def loss_label(result: TableFitResult) -> str:
    """The fit's loss in words, e.g. ``soft_l1, scale 0.1`` or ``linear (least squares)``."""
    return ("linear (least squares)" if result.loss == "linear"
            else f"{result.loss}, scale {result.loss_scale:g}")


def write_table_fit(out: str | Path, run: TableFitRun) -> list[str]:
    """Write ``fitted.toml``, ``predictions.csv``, ``fit.json`` and ``predictions.png`` into
    ``out`` (each atomically; call inside ``npujax._atomic.staged_dir`` for the whole folder).

    Returns:
      The file names written.
    """
    out = Path(out)
    r = run.result
    kept = ", ".join(k for k, v in r.identifiable.items() if v) or "none identified"
    header = (f"fitted by npujax fit --table {Path(run.table).name} "
              f"({len(run.rows)} models, fields: {kept}, loss: {loss_label(r)})"
              + "".join(f"\n{f} kept at the preset: {why}"
                        for f, why in r.not_identified.items()))
    notes = {f: f"fitted by npujax fit --table (relative standard error "
                f"{r.rel_std_err[f]:.0%})" for f in r.fields if r.identifiable[f]}
    atomic_write_text(out / "fitted.toml", spec_to_toml(r.spec, header, base=run.base,
                                                        notes=notes))
    rows = prediction_rows(run)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["model"])
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / "predictions.csv", buf.getvalue())
    write_json(out / "fit.json", {
        "table": run.table, "group": run.group, "start": run.start.name,
        "fitted_preset": r.spec.name, "bits": r.bits,
        "loss": {"name": r.loss, "scale": r.loss_scale, "cost": r.cost},
        # (a field no model depends on has an infinite error: null)
        "fields": {f: {"preset": r.initial[f], "fitted": r.fitted[f],
                       "rel_std_err": r.rel_std_err[f] if math.isfinite(r.rel_std_err[f])
                       else None, "identifiable": r.identifiable[f],
                       "not_identified_because": r.not_identified.get(f)}
                   for f in r.fields},
        "metrics": r.metrics, "worst": {"model": r.worst[0], "ratio": r.worst[1]},
        "leave_one_out_fits": [dict(zip(("model", "fitted"), (n, v)))
                               for n, v in zip(r.names, r.loo_fitted)],
        "models": rows,
        "skipped": [{"model": row.model, "reason": why} for row, why in run.skipped]})
    series = {"preset": r.preset_s}
    if "loo" in r.metrics:
        series["fitted, leave-one-out"] = r.loo_s
    else:
        series["fitted, in sample"] = r.fitted_s
    plot_measured_vs_modelled(out / "predictions.png", r.measured_s, series,
                              title=f"{r.spec.name}: {Path(run.table).name}"
                                    + (f"\n{run.group}" if run.group else ""),
                              what="time per inference", unit="ms", labels=r.names)
    return ["fitted.toml", "predictions.csv", "fit.json", "predictions.png"]
