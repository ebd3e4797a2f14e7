"""A sweep sharded over 8 host devices, and over two processes joined by jax.distributed, gives
the single-device results bit for bit."""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.explore import COLUMNS, sweep
from npujax.frontends.flax import trace_flax
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.quantize.model_file import save_graph

ROOT = Path(__file__).resolve().parents[2]
# 12 configurations: not a multiple of 8, so the sharded batches are padded
GRID = {"array.rows": [8, 16, 32], "memory.dram_bytes_per_s": [3.2e9, 12.8e9], "bits": [4, 8]}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with jax.numpy_dtype_promotion("standard"):
        g, p = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)),
                                    jnp.zeros((1, 8, 8, 1), jnp.float32)))
    path = tmp_path_factory.mktemp("m") / "model.npz"
    save_graph(path, g, p)
    return g, path


@pytest.fixture(scope="module")
def reference(model):
    """The single-device run, in this process, its program compiled (a sweep this small runs
    with numpy otherwise)."""
    import importlib

    sw = importlib.import_module("npujax.explore.sweep")
    keep, sw.NUMPY_MAX_CONFIGS = sw.NUMPY_MAX_CONFIGS, 0
    try:
        return sweep(model[0], "edge_16x16", GRID, devices=jax.local_devices()[:1]).columns
    finally:
        sw.NUMPY_MAX_CONFIGS = keep


@pytest.fixture(scope="module")
def numpy_reference(model):
    """The single-device run, in this process, as a sweep this small runs: with numpy."""
    return sweep(model[0], "edge_16x16", GRID, devices=jax.local_devices()[:1]).columns


def _python(code: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _equal(got: dict, want: dict) -> None:
    for k in COLUMNS:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)  # bit for bit


def test_eight_host_devices_equal_one_device(model, reference, tmp_path):
    """Also through the sharded program the command line keeps (``npujax._program_cache``)."""
    out, kept = tmp_path / "cols.npz", tmp_path / "kept.npz"
    p = _python(f"""
        import importlib, jax, numpy as np
        from npujax import _program_cache
        from npujax.explore import sweep
        importlib.import_module("npujax.explore.sweep").NUMPY_MAX_CONFIGS = 0  # (compiled)
        from npujax.quantize.model_file import load_graph
        assert len(jax.local_devices()) == 8, jax.local_devices()
        g = load_graph({str(model[1])!r})[0]
        r = sweep(g, "edge_16x16", {GRID!r})  # sharded over the 8 devices
        np.savez({str(out)!r}, **r.columns)
        _program_cache.enable({str(tmp_path / "programs")!r})
        r = sweep(g, "edge_16x16", {GRID!r})  # the same, exported with its shardings
        np.savez({str(kept)!r}, **r.columns)
    """, _env(XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
                   + " --xla_force_host_platform_device_count=8"))
    log, _ = p.communicate(timeout=240)
    assert p.returncode == 0, log
    assert any((tmp_path / "programs").rglob("sweep_table-*"))
    for path in (out, kept):
        with np.load(path) as z:
            _equal({k: z[k] for k in COLUMNS}, reference)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_device(model, numpy_reference, tmp_path):
    """``npujax sweep`` started twice, joined through jax.distributed on localhost (each
    process evaluates its chunks with numpy, as the one-process run does: the whole sweep is
    12 configurations)."""
    out = tmp_path / "sweep"
    port = _free_port()
    cmd = [sys.executable, "-m", "npujax.cli", "sweep", str(model[1]), "--grid",
           "array.rows=8,16,32", "--grid", "memory.dram_bytes_per_s=3.2e9,12.8e9", "--bits",
           "4,8", "--chunk-size", "4", "--out", str(out), "--no-progress", "--coordinator",
           f"localhost:{port}", "--num-processes", "2", "--process-id"]
    procs = [subprocess.Popen([*cmd, str(rank)], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    # 3 chunks: process 0 evaluates chunks 0 and 2, process 1 chunk 1; process 0 merges
    assert "2 chunk(s) evaluated" in logs[0] and "evaluated 1 chunk(s)" in logs[1], logs
    merged = [np.load(out / "chunks" / f"chunk-{i:06d}.npz") for i in range(3)]
    _equal({k: np.concatenate([m[k] for m in merged]) for k in COLUMNS}, numpy_reference)
    assert len((out / "results.csv").read_text().splitlines()) == 13
