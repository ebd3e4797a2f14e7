"""``lower`` with its cost program run by numpy (npujax._jaxpr_numpy, the default) equals the
same program compiled by XLA to float64 rounding, counts exactly, on each kind of program."""

import numpy as np
import pytest

from npujax import _program_cache
from npujax.hw import load_npu_spec
from npujax.plan import lower_by_dataflow


def _schedules_close(a, b):
    for df in a:
        x, y = a[df], b[df]
        assert [r.name for r in x.layers] == [r.name for r in y.layers]
        for field in ("compute_cycles", "folds", "dram_bytes"):
            assert [getattr(r.costs, field) for r in x.layers] == \
                [getattr(r.costs, field) for r in y.layers], field
        for got, want in ((x.latency_s, y.latency_s), (x.energy_j, y.energy_j),
                          ([r.latency_s for r in x.layers], [r.latency_s for r in y.layers]),
                          ([r.energy_j for r in x.layers], [r.energy_j for r in y.layers])):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("preset", ["bitfusion_16x16", "coral_edgetpu"])
def test_lower_with_numpy_equals_the_compiled_cost_program(model_kinds, preset):
    """The layer-table program (bitfusion: precision scaling), the layer-fusion program
    (Coral: weight streaming, its scans and arg-minima) and an attention chain's layer-list
    program (the decoder on edge_transformer_16x16) agree with XLA to float64 rounding."""
    before = set(_program_cache._numpy_programs)
    # Coral's layer fusion is one program per dataflow: one dataflow is enough
    dataflows = ("ws",) if preset == "coral_edgetpu" else ("ws", "os", "is")
    cases = [(model_kinds["resnet"], load_npu_spec(preset))]
    if preset == "bitfusion_16x16":
        cases.append((model_kinds["decoder"], load_npu_spec("edge_transformer_16x16")))
    for graph, spec in cases:
        with _program_cache.numpy_evaluation(True):
            numpy_run = lower_by_dataflow(graph, spec, dataflows=dataflows)
        with _program_cache.numpy_evaluation(False):
            compiled = lower_by_dataflow(graph, spec, dataflows=dataflows)
        _schedules_close(numpy_run, compiled)
    new = [p for k, (p, _) in _program_cache._numpy_programs.items() if k not in before]
    assert new and all(p is not None for p in new)  # traced here, and none fell back to XLA
