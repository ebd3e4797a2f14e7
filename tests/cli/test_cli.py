"""The CLI as a user runs it: exit codes and messages, no tracebacks (in-process through the
program's own ``main``; ``test_help`` runs the real program in a separate process)."""

import importlib.resources
import json
import re
import subprocess
import sys

import pytest

from tests.helpers import run_cli

GOOD = importlib.resources.files("npujax.presets").joinpath("edge_16x16.toml").read_text()


run = run_cli


def test_help():
    r = subprocess.run([sys.executable, "-m", "npujax.cli", "--help"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "demo" in r.stdout and "lower" in r.stdout


@pytest.mark.parametrize(
    "text,message",
    [
        (GOOD.replace("ifmap_sram_bytes = 131072", "ifmap_sram_bytes = -1"), "ifmap_sram_bytes"),
        (GOOD.replace("lanes = 16", "lanes = 16\nbogus = 2"), "unknown key"),
        ("this is not toml [", "not valid TOML"),
    ],
)
def test_malformed_preset_exits_nonzero_without_traceback(tmp_path, text, message):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    r = run("demo", "--npu", str(p), "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert message in r.stderr and r.stderr.startswith("npujax: error:")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_missing_preset(tmp_path):
    r = run("demo", "--npu", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr


def test_lower_missing_model(tmp_path):
    r = run("lower", str(tmp_path / "none.npz"))
    assert r.returncode == 5 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_bad_bits_spec(tmp_path):
    r = run("lower", str(tmp_path / "x.npz"), "--weight-bits", "fc1=four")
    assert r.returncode == 2 and "bit-width" in r.stderr


def test_presets_lists_default():
    r = run("presets")
    assert r.returncode == 0 and "edge_16x16" in r.stdout


def test_own_process_freezes_its_start_up_and_collects_garbage_after(monkeypatch, capsys):
    """``main()`` as the npujax program runs it (no argv): the start-up's objects frozen out
    of the cyclic collector, which is on again for the command; a caller's ``main(argv)``
    leaves the collector alone."""
    import gc

    from npujax.cli import main

    monkeypatch.setattr(sys, "argv", ["npujax", "presets"])
    frozen = gc.get_freeze_count()  # (the suite freezes its own start-up: tests/conftest.py)
    try:
        assert main() == 0
        assert gc.isenabled() and gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
        gc.freeze()  # (as the suite left it)
        gc.enable()
    frozen = gc.get_freeze_count()
    assert main(["presets"]) == 0 and gc.get_freeze_count() <= frozen  # (nothing new frozen)
    assert "edge_16x16" in capsys.readouterr().out


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize
    from npujax.models.cnn import DigitsCNN
    from npujax.quantize.model_file import save_graph

    with jax.numpy_dtype_promotion("standard"):
        g, p = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)),
                                    jnp.zeros((1, 8, 8, 1), jnp.float32)))
    path = tmp_path_factory.mktemp("m") / "model.npz"
    save_graph(path, g, p)
    return path


@pytest.mark.parametrize("bits,code,message", [
    ("fc1=-4", 3, "spec 'fc1=-4' has a width outside [2, 16]"), ("fc1=0", 3, "[2, 16]"),
    ("64", 3, "[2, 16]"),
    ("fc1=4,fc1=2", 2, "twice"), ("avgpool_0=4", 2, "not GEMM layers"),
])
def test_lower_rejects_bad_bit_widths(saved_model, bits, code, message):
    r = run("lower", str(saved_model), "--weight-bits", bits)
    assert r.returncode == code and message in r.stderr and "Traceback" not in r.stderr


def test_lower_writes_readable_outputs(saved_model, tmp_path):
    import os
    import stat

    r = run("lower", str(saved_model), "--npu", "gemmini_16x16", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "fallback" in r.stdout  # gemmini has no average pooling: it runs on the CPU
    assert "…" not in r.stdout  # a pipe gets whole table cells, never shortened ones
    # the headline is the last line: the schedule's own total and its host layers
    sched = json.loads((tmp_path / "o" / "schedule.json").read_text())
    last = r.stdout.strip().splitlines()[-1]
    host = sum(x["device"] != "npu" for x in sched["layers"])
    assert last.startswith(f"{saved_model.name} on gemmini_16x16: "
                           f"{sched['latency_s'] * 1e3:,.3f} ms per inference"), last
    assert last.endswith(f"; {host} of {len(sched['layers'])} layers on the host") and host > 0
    mode = stat.S_IMODE(os.stat(tmp_path / "o" / "schedule.json").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_out_that_is_a_file_is_a_clear_error(saved_model, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = run("lower", str(saved_model), "--out", str(f / "sub"))
    assert r.returncode == 2 and "cannot create output folder" in r.stderr
    assert "Traceback" not in r.stderr


def test_not_an_npz_model(tmp_path):
    f = tmp_path / "README.md"
    f.write_text("# hello")
    r = run("lower", str(f))
    assert r.returncode == 5 and "not an npujax graph file" in r.stderr
    assert "pickle" not in r.stderr


def test_version_and_usage_errors_are_one_line(capsys):
    """In-process (no subprocess needed): --version, and argparse's usage errors keep the CLI's
    contract of one 'npujax: error' line and exit code 2."""
    from npujax import __version__
    from npujax.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"npujax {__version__}"
    for argv, message in ((["lower", "m.npz", "--batch", "0"], "--batch: must be >= 1"),
                          (["search", "m.npz", "--candidates", "2,x"], "comma-separated"),
                          (["calibrate", "m.npz", "--observer", "kl"], "invalid choice"),
                          (["lower", "m.npz", "--bogus"], "--bogus (see 'npujax lower --help')"),
                          (["nope"], "invalid choice")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith("npujax: error:") and message in err


def test_repeated_bit_options_combine():
    from npujax.cli._common import bits_spec
    from npujax.errors import ConfigError

    assert bits_spec(["fc1=4", "conv1=2,fc2=8"]) == {"fc1": 4, "conv1": 2, "fc2": 8}
    assert bits_spec(["4"]) == 4
    with pytest.raises(ConfigError, match="twice"):
        bits_spec(["fc1=4", "fc1=2"])


@pytest.mark.integration  # ~4 s: lowers the model at every dataflow (one compilation each)
def test_lower_format_csv_and_json_print_only_the_schedule(saved_model, capsys):
    """``--format csv|json`` is for pipelines: stdout holds the CSV / JSON alone."""
    import csv
    import io
    import json

    from npujax.cli import main

    assert main(["lower", str(saved_model), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and {"name", "latency_cycles", "latency_s"} <= set(rows[0])
    # off a terminal the phases are plain lines on stderr (a cold lower of a real model takes
    # minutes and printed nothing: issue 28); --no-progress silences them
    assert f"npujax: lower: importing {saved_model} ..." in err
    assert re.search(r"npujax: lower: costing \d+ nodes on edge_16x16: done in", err), err
    assert main(["lower", str(saved_model), "--format", "json", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert err == ""
    assert main(["-q", "lower", str(saved_model), "--format", "json"]) == 0  # -q: the same
    assert capsys.readouterr().err == ""
    assert doc["latency_s"] > 0 and len(doc["layers"]) == len(rows)
    assert main(["lower", str(saved_model), str(saved_model), "--format", "csv"]) == 2


@pytest.mark.parametrize("argv,message", [
    (["--merge", "a", "b", "--grid", "array.rows=8"], "--merge takes the slices' folders only; "
                                                      "--grid come from the slices"),
    ([], "needs a MODEL and at least one --grid"),
    (["m.onnx", "--grid", "array.rows=8", "--shard", "4/4"], "--shard takes I/N with 0 <= I < N"),
])
def test_sweep_slices_arguments(tmp_path, argv, message):
    r = run("sweep", *argv, "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()
