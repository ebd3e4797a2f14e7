"""The CLI as a user runs it: a separate process, exit codes and messages, no tracebacks."""

import subprocess
import sys

import pytest

GOOD = """name = "t"
[array]
rows = 16
cols = 16
dataflow = "output_stationary"
clock_hz = 1e9
[memory]
ifmap_sram_bytes = 1024
filter_sram_bytes = 1024
ofmap_sram_bytes = 1024
dram_bytes_per_s = 1e9
[vector]
lanes = 4
"""


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "npujax.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_help():
    r = run("--help")
    assert r.returncode == 0 and "demo" in r.stdout and "lower" in r.stdout


@pytest.mark.parametrize(
    "text,message",
    [
        (GOOD.replace("ifmap_sram_bytes = 1024", "ifmap_sram_bytes = -1"), "ifmap_sram_bytes"),
        (GOOD.replace("lanes = 4", "lanes = 4\nbogus = 2"), "unknown key"),
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
