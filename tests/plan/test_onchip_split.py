"""The unified on-chip SRAM's per-model split (npujax/plan/passes/onchip_split.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.errors import ConfigError
from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.plan import network
from npujax.plan.fit import predict_latency_s
from npujax.plan.passes.onchip_split import ACTIVATION_SHARES, split_spec

UNIFIED = {"memory.sram_split": "per_model", "memory.onchip_sram_bytes": 8 << 20}


def test_split_spec_by_hand():
    spec = load_npu_spec("coral_edgetpu").with_fields(UNIFIED)
    with jax.enable_x64(True):
        s = split_spec(spec, 0.25)
        # 8 MiB less the 128 KiB filter buffer = 8,257,536 B; a quarter to the activations
        assert float(s.memory.ifmap_sram_bytes) == float(s.memory.ofmap_sram_bytes) == 1_032_192
        assert float(s.memory.parameter_cache_bytes) == 6_193_152
    assert s.memory.sram_split == "fixed"
    # a per-model split needs the SRAM's size; a fixed one does not read it
    with pytest.raises(ConfigError, match="onchip_sram_bytes"):
        spec.with_fields({"memory.onchip_sram_bytes": 0})
    with pytest.raises(ConfigError, match="onchip_sram_bytes"):
        load_npu_spec("edge_16x16").with_fields({"memory.onchip_sram_bytes": 1 << 20})
    with pytest.raises(ConfigError, match="filter buffer"):
        spec.with_fields({"memory.onchip_sram_bytes": 131072})


def test_the_model_gets_its_fastest_split():
    with jax.numpy_dtype_promotion("standard"):
        graph, _ = optimize(*trace_flax(DigitsCNN(rngs=nnx.Rngs(0)),
                                        jnp.zeros((1, 8, 8, 1), jnp.float32)))
    # 4 KiB of SRAM beside a 1 KiB filter buffer: DigitsCNN's activations and parameters
    # compete for it (layer-by-layer fusion: a small program)
    base = load_npu_spec("coral_edgetpu").with_fields(
        {"memory.filter_sram_bytes": 1024, "memory.sram_split": "per_model",
         "memory.onchip_sram_bytes": 5 * 1024, "ops.fusion": "elementwise"})
    layers, chains = network(graph, base)
    unified = float(np.sum(predict_latency_s(layers, base, chains=chains)))
    each = []
    for share in ACTIVATION_SHARES:
        a = share * 4096  # whole bytes: 4 KiB x k/32
        each.append(float(np.sum(predict_latency_s(layers, base.with_fields(
            {"memory.sram_split": "fixed", "memory.onchip_sram_bytes": 0,
             "memory.ifmap_sram_bytes": int(a / 2), "memory.ofmap_sram_bytes": int(a / 2),
             "memory.parameter_cache_bytes": int(4096 - a)}), chains=chains))))
    assert unified == min(each)
    # the choice matters here: the largest activation share is 4 % faster than the smallest
    assert each[-1] == min(each) < 0.97 * each[0]
    # lower reports the split it chose (the first fastest), and sizes the SRAM report by it
    from npujax.plan import lower, memory_report

    sched = lower(graph, base)
    sp = sched.sram_split
    assert sp["activation_share"] == ACTIVATION_SHARES[int(np.argmin(each))]
    assert sp["ifmap_sram_bytes"] + sp["ofmap_sram_bytes"] + sp["parameter_cache_bytes"] == 4096
    assert memory_report(graph, sched, base).sram_capacity_bytes == (
        1024 + 4096 * sp["activation_share"])
    assert lower(graph, "edge_16x16").sram_split is None
