"""`npujax calibrate` and `npujax qat` end to end (the program's main() in-process; slow)."""


import jax.numpy as jnp
import pytest
from flax import nnx

from npujax.frontends.flax import trace_flax
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.quantize.model_file import load_graph, save_graph
from tests.helpers import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.flax_model]


run = run_cli  # in-process: the program's own main(), without a new interpreter


def test_calibrate_writes_model_and_sqnr_report(tmp_path):
    graph, params = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)),
                                         jnp.zeros((1, 8, 8, 1), jnp.float32)))
    save_graph(tmp_path / "model.npz", graph, params)
    r = run("calibrate", str(tmp_path / "model.npz"), "--observer", "entropy", "--batches", "2",
            "--out", str(tmp_path / "out"), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "SQNR" in r.stdout and "fc2" in r.stdout
    assert "entropy, bias correction model" in " ".join(r.stdout.split())  # (rich may wrap)
    for f in ("model_calibrated.npz", "sqnr.md", "sqnr.csv", "sqnr.png"):
        assert (tmp_path / "out" / f).exists()
    meta = load_graph(tmp_path / "out" / "model_calibrated.npz")[3]
    assert meta["observer"] == "entropy" and meta["bias_correction"] == "model"  # the default



def test_qat_tiny_config(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text("[qat]\nfloat_epochs = 2\nqat_steps = 5\ncalibration_batches = 1\n"
                   "schemes = [\"W8A8\"]\nobservers = [\"minmax\"]\nqat_observer = \"minmax\"\n")
    r = run("qat", "--config", str(cfg), "--out", str(tmp_path / "out"), "--no-progress")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "quantization.md").read_text()
    assert "| PTQ minmax |" in md and "| QAT (from PTQ minmax) |" in md
    assert "integer-only" in md
