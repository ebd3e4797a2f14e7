"""The sequential bias correction ("model" mode) in one layer-by-layer pass equals its former
form (one whole quantized run per wave of layers)."""

import importlib

import jax
import numpy as np

from npujax.ir.execute import execute
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from tests.helpers import assert_close
from tests.quantize.ptq_graphs import se_residual_net

ptq = importlib.import_module("npujax.quantize.ptq")  # (the package exports the function ptq)


def test_one_pass_equals_the_waves_on_a_residual_se_net():
    # a residual read across three corrected layers, an SE block's pooled branch, two parallel
    # layers (one wave), a batch-folded Reshape (run per example)
    rng = np.random.default_rng(0)
    graph, params = se_residual_net(rng)
    x = rng.uniform(size=(16, 6, 6, 3)).astype(np.float32)
    batches = [x[:8], x[8:]]
    q = quant_spec(graph, 4, 4)
    qstate = calibrate(graph, params, batches, q)
    one = ptq.bias_correction(graph, params, q, batches, qstate, mode="model")
    waves = ptq._sequential_in_waves(graph, params, q, qstate, batches)
    for name in ("c1", "se", "a", "b", "fc"):
        shift = np.abs(np.asarray(one[name]["bias"]) - params[name]["bias"]).max()
        assert shift > 1e-3, name  # each layer really corrected
        assert_close(one[name]["bias"], waves[name]["bias"], atol=1e-7)
    run = jax.jit(lambda p: execute(graph, p, x, quant=q, qstate=qstate))
    assert_close(run(one), run(waves), atol=1e-6)
