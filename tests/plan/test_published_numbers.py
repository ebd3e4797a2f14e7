"""The numbers ``lower`` and the search's latency table published before the one cost program are
unchanged, bit for bit.

``published_numbers.npz`` was recorded on main before that work (commit 22f61bb) by
``experiments/published_numbers.py --record``: 2,356 arrays over four model kinds, every shipped
preset, every fusion level and dataflow (per-layer latency, compute, DRAM bytes and energy; the
schedules' totals; the latency tables; the sweep at each preset's own point; fit's predictions
and a 3-step fit). The script's ``--check`` compares all of them (a few minutes); this test
compares a sample.

Of the 2,356 arrays, 2,340 are the same bit for bit; 16 latency arrays of ``layer``-fusion
schedules differ in one row by one unit in the last place (e.g. a host-CPU layer's
``cpu_ops / cpu_ops_per_s x clock``: 800.0 -> 800.0000000000001 cycles): XLA compiles the
restructured program of a static layer list with its divisions and products in another order.
Counts are compared exactly, real-valued figures to one ulp.

Since then ``tpu_v1`` double-buffers its weight tiles (``array.stationary_buffering =
"double"``, Jouppi et al. 2017, section 2), a change of the preset, not of the program: the
sample is compared with that field at the recorded ``"single"``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npujax.hw import load_npu_spec
from npujax.plan.lower import lower_by_dataflow
from npujax.search import latency_table

pytestmark = pytest.mark.flax_model

RECORDED = Path(__file__).with_name("published_numbers.npz")

#: One model and preset in the suite (its time is short on 2 cores): cross-layer placement
#: with residual epilogues at all three dataflows, and the latency table.
SAMPLE = [("resnet", "tpu_v1", "layer")]


@pytest.fixture(scope="module")
def recorded():
    with np.load(RECORDED) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("model,preset,fusion", SAMPLE)
def test_lower_and_table_unchanged(recorded, model_kinds, model, preset, fusion):
    graph = model_kinds[model]
    spec = load_npu_spec(preset).with_fields({"ops.fusion": fusion,
                                               "array.stationary_buffering": "single"})
    key = f"{model}/{preset}/{fusion}"
    for df, s in lower_by_dataflow(graph, spec).items():
        k = f"lower/{key}/{df}"
        now = {"latency_cycles": [r.costs.latency_cycles for r in s.layers],
               "compute_cycles": [r.costs.compute_cycles for r in s.layers],
               "dram_bytes": [r.costs.dram_bytes for r in s.layers],
               "energy_j": [r.energy_j for r in s.layers],
               "totals": [s.latency_s, s.energy_j, s.dram_bytes]}
        for field, v in now.items():
            want = recorded[f"{k}/{field}"]
            if want.dtype.kind == "i":
                np.testing.assert_array_equal(np.asarray(v), want, err_msg=f"{k}/{field}")
            else:
                np.testing.assert_array_max_ulp(np.asarray(v, np.float64), want, maxulp=1)
    t = latency_table(graph, spec, (4, 8))
    np.testing.assert_array_equal(np.asarray(t.seconds), recorded[f"table/{key}/seconds"])
    assert t.fixed_s == recorded[f"table/{key}/fixed_s"][0]
