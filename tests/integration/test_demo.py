"""The demo end to end: the full default run through the CLI, as the README's first command."""

import csv
import json

import pytest

from npujax.quantize.model_file import load_graph
from tests.helpers import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.flax_model]

REPORT_KEYS = {"float_accuracy", "ptq_int8_accuracy", "qat_int8_accuracy", "mixed_precision",
               "int8_latency_s", "dataflow_latency_s", "layers"}
LAYER_KEYS = {"name", "op", "M", "K", "N", "macs", "weight_bits", "act_bits", "compute_cycles",
              "memory_cycles", "latency_s", "bound"}


def check_report(report, out):
    assert REPORT_KEYS <= set(report)
    assert set(report["dataflow_latency_s"]) == {"weight_stationary", "output_stationary",
                                                 "input_stationary"}
    mp = report["mixed_precision"]
    assert {"weight_bits", "accuracy", "latency_s"} <= set(mp)
    assert set(mp["weight_bits"]) == {"conv1", "conv2", "fc1", "fc2"}
    assert all(b in (2, 4, 8) for b in mp["weight_bits"].values())
    for row in report["layers"]:
        assert LAYER_KEYS <= set(row)
    assert sum(r["latency_s"] for r in report["layers"]) == pytest.approx(
        report["int8_latency_s"], rel=1e-9)
    assert sum(r["latency_s"] for r in mp["layers"]) == pytest.approx(mp["latency_s"], rel=1e-9)
    assert report["dataflow_latency_s"][report["dataflow"]] == pytest.approx(
        report["int8_latency_s"], rel=1e-9)
    for name in ("report.json", "layers_int8.csv", "layers_mixed.csv", "layer_latency.png",
                 "dataflow_latency.png", "breakdown_mixed.png", "roofline.png", "model.npz"):
        assert (out / name).stat().st_size > 0, name
    with open(out / "layers_int8.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == [r["name"] for r in report["layers"]]
    assert not list(out.glob(".*.tmp"))  # atomic writes left no temporary files
    graph, params, qstate, meta = load_graph(out / "model.npz")
    assert set(qstate) == {"conv1", "conv2", "fc1", "fc2"}
    assert meta["mixed_precision_policy"] == mp["weight_bits"]


def test_demo_cli_default_meets_targets(tmp_path):
    """The README's main command on the defaults, with the acceptance targets of the issue."""
    out = tmp_path / "run"
    r = run_cli("demo", "--out", str(out),
                "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "latency µs" in r.stdout and "weight_stationary" in r.stdout
    report = json.loads((out / "report.json").read_text())
    check_report(report, out)
    f = report["float_accuracy"]
    assert f >= 0.97
    assert report["qat_int8_accuracy"] >= f - 0.01
    assert report["mixed_precision"]["accuracy"] >= f - 0.02
    assert report["mixed_precision"]["latency_s"] < report["int8_latency_s"]
    assert report["mixed_precision"]["latency_s"] <= report["mixed_precision"]["budget_s"] * (
        1 + 1e-9)

    # `npujax lower` on the saved model reproduces the INT8 latency of the report
    lo = run_cli("lower", str(out / "model.npz"),
                 "--out", str(tmp_path / "lowered"))
    assert lo.returncode == 0, lo.stderr
    sched = json.loads((tmp_path / "lowered" / "schedule.json").read_text())
    assert sched["latency_s"] == pytest.approx(report["int8_latency_s"], rel=1e-9)


def test_a_users_file_in_out_is_refused_before_the_work(tmp_path):
    """A file of the user's where the demo writes one is refused at the start (a new user's
    trial saw every table printed, 20 CPU s, then the refusal); it is kept."""
    out = tmp_path / "runs"
    out.mkdir()
    (out / "report.json").write_text("mine\n")
    r = run_cli("demo", "--out", out, "--no-progress")
    assert r.returncode == 10 and "holds 'report.json', which npujax did not write" in r.stderr
    assert "float" not in r.stdout.lower() and (out / "report.json").read_text() == "mine\n"
