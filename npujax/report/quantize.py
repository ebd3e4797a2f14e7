"""The report of ``npujax quantize``: per-layer table (rich, CSV, Markdown) and the summary page."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

__all__ = ["LAYER_COLUMNS", "layers_table", "guard_line", "describe_vs_float", "layers_csv_text",
           "layers_markdown", "quantize_markdown"]

#: The per-layer columns (``layers.csv``'s header).
LAYER_COLUMNS = ("name", "op", "weight_bits", "act_bits", "sqnr_db", "weight_sqnr_db",
                 "act_sqnr_db", "dominant", "latency_us")
_HEAD = ("layer", "op", "W bits", "A bits", "SQNR (dB)", "W-only SQNR (dB)",
         "A-only SQNR (dB)", "worse", "latency (µs)")


def _cell(v: Any, column: str = "") -> str:
    if v is None:  # a float operand's width; a column not measured
        return "float" if column.endswith("_bits") else "-"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.2f}" if abs(v) >= 0.01 else f"{v:.3g}"
    return str(v)


def layers_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """A rich table of the per-layer rows (worst SQNR first). ``SQNR``: the layer's output with
    the whole model quantized; ``W-only`` / ``A-only``: the model output with only that layer's
    weights / input activations quantized; ``worse``: the operand that costs more."""
    t = Table(title=title)
    for h in _HEAD:
        t.add_column(h, justify="left" if h in ("layer", "op", "worse") else "right")
    for r in rows:
        t.add_row(*(_cell(r[c], c) for c in LAYER_COLUMNS))
    return t


def layers_csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV (:data:`LAYER_COLUMNS`; an empty bits cell is a float operand)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(LAYER_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: ("" if r[c] is None else r[c]) for c in LAYER_COLUMNS})
    return buf.getvalue()


def layers_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(_HEAD) + " |", "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r[c], c) for c in LAYER_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def guard_line(guard: dict[str, Any], mode: str) -> str:
    """The bias-correction guard's line (``QuantizeResult.calibration["bias_correction_guard"]``,
    :meth:`npujax.quantize.ptq.CorrectionCheck.describe`): the output SQNR on the calibration
    data with and without the correction (None: no error, infinite), and what was kept."""
    from npujax.quantize.ptq import CorrectionCheck

    db = guard["calibration_output_sqnr_db"]
    return CorrectionCheck(mode, guard["kept"] == "corrected",
                           *(math.inf if db[k] is None else db[k]
                             for k in ("uncorrected", "corrected"))).describe()


def describe_vs_float(vs_float: dict[str, Any]) -> str:
    """One line for the terminal, ``report.md`` and the log: the output SQNR (dB), the top-1
    agreement (%) and on how many held-out examples, whether that is far from float, and
    whether the examples are too few to judge (the dict of
    :func:`npujax.workflows.quantize.output_vs_float`)."""
    n = vs_float["examples"]
    return (f"output SQNR {vs_float['output_sqnr_db']:.1f} dB"
            + ("" if vs_float["top1_agreement"] is None
               else f", top-1 agreement {vs_float['top1_agreement']:.1f} %")
            + f" on {n} held-out example{'s' * (n != 1)}"
            + ("; far from float: check the calibration (--method, --bias-correction) before "
               "deploying the file" if vs_float["far"] else "")
            + (f" (only {n}: too few to judge; give --data more examples)"
               if vs_float["too_few"] else ""))


def quantize_markdown(result: Any, title: str) -> str:
    """The ``report.md`` page of a :class:`npujax.workflows.quantize.QuantizeResult`."""
    out = [f"# {title}", ""]
    if result.float_accuracy is not None:
        out.append(f"- accuracy: float {result.float_accuracy:.2f} %, quantized "
                   f"{result.accuracy:.2f} % (drop {result.float_accuracy - result.accuracy:.2f} "
                   f"points) on {result.examples['evaluation']} held-out examples")
    if result.vs_float is not None:
        line = describe_vs_float(result.vs_float)
        out.append("- against the float model (no labels needed): "
                   + (f"**{line}**" if result.vs_float["far"] else line))
    cal = result.calibration
    how = "".join([f", {cal['observer']} observer" if "observer" in cal else "",
                   "" if "bias_correction" not in cal else
                   ", no bias correction" if cal["bias_correction"] is None else
                   f", bias correction {cal['bias_correction']}"])
    out.append(f"- calibration: {result.examples['calibration']} examples{how}")
    bc = cal.get("bias_correction_guard")
    if bc is not None:
        out.append(f"- {guard_line(bc, cal['bias_correction'])}")
    if result.latency_s is not None:
        out.append(f"- modelled latency on {result.npu}: {result.latency_s * 1e6:.3f} µs per "
                   "inference")
    if result.ort is not None:
        worst = max(float(v["max_abs_diff"] or 0.0) for v in result.ort.values())
        first = next(iter(result.ort.values()))
        accs = sorted({v["accuracy"] for v in result.ort.values() if v["accuracy"] is not None})
        acc = "" if not accs else (f"; accuracy {', '.join(f'{a:.2f} %' for a in accs)} "
                                   f"(npujax fake-quant {first['fake_quant_accuracy']:.2f} % on "
                                   "the same examples)")
        beyond = max(int(v.get("examples_beyond_bound") or 0) for v in result.ort.values())
        out.append(f"- onnxruntime, all 4 optimization levels: max |ORT - npujax fake-quant| "
                   f"= {worst:.3g} (bound {result.ort_bound:.3g}"
                   f"{f', exceeded on {beyond} example(s)' if beyond else ''}){acc}")
    drift = getattr(result, "ort_drift", None)
    if drift is not None:
        tf = drift["teacher_forced"]
        out.append(f"- end to end, the outputs drifted beyond the bound at "
                   f"{', '.join(drift['levels'])} (largest difference "
                   f"{drift['largest_difference']:.3g}, {100 * drift['fraction_beyond_bound']:.1f} "
                   "% of the examples), by rounding ties compounding through the layers: every "
                   f"Q/DQ pair ({tf['pairs']}, {tf['values']} values on {tf['examples']} "
                   f"examples) equals npujax's fake-quant teacher-forced ({tf['mismatches']} "
                   f"differ) and the drift starts at {drift['starts_at']['pair']} with "
                   f"{drift['starts_at']['values_differing']} of {drift['starts_at']['values']} "
                   "values one grid step off, so the file was accepted")
    for n in result.notes:
        out.append(f"- {n}")
    c = result.control
    if c is not None:
        out += ["", f"## Accuracy control (max drop {c.max_drop:g} points): "
                f"{'met' if c.met else 'NOT met'}", "",
                f"Before: {c.initial_accuracy:.2f} % (drop "
                f"{c.float_accuracy - c.initial_accuracy:.2f} points)."
                + ("" if c.steps else " No layer had to be returned."), ""]
        if c.steps:
            out += ["| step | layer | from (W, A) | to | W-only SQNR (dB) | A-only SQNR (dB) | "
                    "accuracy (%) | drop (points) |", "|---:|---|---|---|---:|---:|---:|---:|"]
        for i, s in enumerate(c.steps, 1):
            out.append(f"| {i} | {s.layer} | {s.before} | "
                       f"{'float' if s.after is None else s.after} | "
                       f"{_cell(s.sensitivity.weight_sqnr_db)} | "
                       f"{_cell(s.sensitivity.act_sqnr_db)} | {s.accuracy:.2f} | "
                       f"{s.drop:.2f} |")
    out += ["", "## Layers (worst SQNR first)", "",
            "SQNR: the layer's output with the whole model quantized. W-only / A-only: the "
            "model's output with only that layer's weights / input activations quantized "
            "(lower: more sensitive).", "", layers_markdown(result.layers)]
    return "\n".join(out)
