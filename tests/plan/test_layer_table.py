"""The workloads as traced columns (``LayerTable``): ``lower``'s one cost program for every
workload list gives the numbers of the program compiled for each list: the counts bit for bit,
the real-valued figures up to the last bit where XLA multiplied by the reciprocal of one of the
list's constants instead of dividing by it."""

import dataclasses
import importlib

import jax
import numpy as np
import pytest

from npujax import _program_cache
from npujax.hw import DATAFLOWS, load_npu_spec
from npujax.plan import layer_table, lower, workloads
from npujax.plan.costs import EXACT_FIELDS
from npujax.plan.table import MIN_LENGTH, table_length

lower_module = importlib.import_module("npujax.plan.lower")


@pytest.fixture(scope="module")
def digits():
    from flax import nnx

    from npujax.models.cnn import DigitsCNN
    from tests.flax_graphs import traced

    return traced(DigitsCNN(rngs=nnx.Rngs(0)), (1, 8, 8, 1))[0]


def _configs(spec, n, seed):
    """``spec`` at [n] random array sizes, cores, SRAM sizes and DRAM bandwidths."""
    rng = np.random.default_rng(seed)
    hw = jax.tree.map(lambda v: np.broadcast_to(np.asarray(v), (n,)), spec)
    pick = lambda *c: rng.choice(c, n).astype(np.int64)  # noqa: E731
    return dataclasses.replace(
        hw, array=dataclasses.replace(hw.array, rows=pick(1, 3, 8, 16, 33, 128),
                                      cols=pick(1, 5, 8, 16, 64), cores=pick(1, 2, 3, 4)),
        memory=dataclasses.replace(hw.memory, ifmap_sram_bytes=pick(512, 4096, 65536),
                                   filter_sram_bytes=pick(512, 4096, 65536),
                                   ofmap_sram_bytes=pick(256, 4096, 65536),
                                   dram_bytes_per_s=rng.uniform(1e9, 5e10, n)))


@pytest.mark.parametrize("model,preset", [
    ("small_resnet", "tpu_v1"),  # residual fusion (fused rows), layout, 4 cores x 256x256
    ("small_resnet", "gemmini_16x16"),  # a layer falling back to the CPU
    ("digits", "bitfusion_16x16"),  # precision scaling: the widths matter
])
def test_table_program_equals_the_static_program(model, preset, request):
    """Every cost and energy field, the area too, over 8 random hardware configurations and
    random widths: the traced, padded table against the program with the list's constants
    (lower's program before the table)."""
    graph = request.getfixturevalue(model)
    graph = graph[0] if isinstance(graph, tuple) else graph
    spec = load_npu_spec(preset)
    if spec.ops.fusion == "layer":  # the per-layer programs (layer fusion needs a static list)
        spec = spec.with_fields({"ops.fusion": "residual"})
    layers = workloads(graph, spec)
    n = len(layers)
    rng = np.random.default_rng(n)
    wb = rng.choice([2.0, 3.0, 4.0, 8.0], n).astype(np.float32)
    ab = rng.choice([4.0, 8.0], n).astype(np.float32)
    table = layer_table(layers, table_length(n))
    pad = np.full(len(table) - n, 8.0, np.float32)
    static = lower_module._jitted_costs.__wrapped__(tuple(layers), DATAFLOWS)
    traced = lower_module._jitted_table_costs(DATAFLOWS)  # lower's program
    hw = _configs(spec, 8, seed=n)
    want, got = [], []
    with jax.enable_x64(True):
        for i in range(8):  # (not vmapped: these are the two programs as lower compiles them)
            s = jax.tree.map(lambda v: v[i], hw)  # noqa: B023
            want.append(static(s, wb, ab))
            got.append(traced(s, np.concatenate([wb, pad]), np.concatenate([ab, pad]), table))
    want_leaves = jax.tree_util.tree_flatten_with_path(jax.tree.map(
        lambda *v: np.stack(v), *want))[0]
    got_leaves = jax.tree.leaves(jax.tree.map(lambda *v: np.stack(v), *got))
    differ = total = 0
    assert len(want_leaves) == len(got_leaves) > 3 * 21  # costs and energy per dataflow, area
    for (path, w), g in zip(want_leaves, got_leaves):
        w, g = np.asarray(w), np.asarray(g)
        if g.ndim == 2:  # [configs, rows]: the padding rows cost nothing
            assert not np.any(g[:, n:]), jax.tree_util.keystr(path)
            g = g[:, :n]
        assert w.dtype == g.dtype, jax.tree_util.keystr(path)
        if path[-1].name in EXACT_FIELDS:  # counts: bit for bit
            np.testing.assert_array_equal(g, w, err_msg=jax.tree_util.keystr(path))
        else:  # XLA multiplies by the reciprocal of a constant divisor, not of a traced one
            np.testing.assert_allclose(g, w, rtol=4e-16, atol=0,
                                       err_msg=jax.tree_util.keystr(path))
            differ += int(np.sum(g != w))
            total += g.size
    # a few values in a thousand differ in their last bit (where XLA folds a constant divisor
    # into a reciprocal in one program and divides by the traced one in the other)
    assert differ <= total // 250


def test_one_program_serves_every_model_of_its_length(digits, small_resnet, edge_spec):
    resnet = small_resnet[0]
    assert table_length(len(workloads(digits, edge_spec))) == table_length(
        len(workloads(resnet, edge_spec))) == MIN_LENGTH
    program = lower_module._jitted_table_costs(("weight_stationary",))
    before = program._cache_size()
    a = lower(digits, edge_spec, dataflow="ws")
    b = lower(resnet, edge_spec, dataflow="ws", batch=4)
    assert program._cache_size() - before <= 1  # (0 when an earlier test compiled it)
    assert [r.name for r in a.layers] == [w.name for w in workloads(digits, edge_spec)]
    assert len(b.layers) == len(workloads(resnet, edge_spec)) and b.batch == 4
    assert b.latency_s > 0 and a.latency_s > 0


def test_layer_table_columns_and_padding(small_resnet, edge_spec):
    layers = workloads(small_resnet[0], edge_spec)
    t = layer_table(layers, 32)
    assert len(t) == 32 and t.M.dtype == np.int64 and t.producer.dtype == np.int32
    assert list(t.M[:len(layers)]) == [w.M for w in layers] and not t.M[len(layers):].any()
    assert not t.npu[len(layers):].any() and (t.groups[len(layers):] == 1).all()
    assert list(t.producer[:len(layers)]) == [w.producer for w in layers]
    for i, j in enumerate(t.first_consumer):  # the first row reading each output
        readers = [k for k, w in enumerate(layers) if w.producer == i]
        assert j == (readers[0] if readers else -1)
    assert layer_table(t) is t and t.small and t.bound("M", "K") == max(
        [1] + [max(w.M, w.K) for w in layers])
    assert [table_length(r) for r in (0, 1, 16, 17, 100)] == [16, 16, 16, 32, 128]
    with pytest.raises(ValueError, match="length"):
        layer_table(layers, len(layers) - 1)


def test_specs_differing_in_fields_the_costs_do_not_read_share_the_program(digits, edge_spec):
    """A renamed copy with another default dataflow, layout and operator lists lowers through
    the program already traced, with the same costs; another precision scaling traces anew."""
    programs = _program_cache._numpy_programs
    a = lower(digits, edge_spec, dataflow="ws")
    n = len(programs)
    other = edge_spec.with_fields({"array.dataflow": "output_stationary",
                                   "ops.attention_fusion": "on_chip",
                                   "ops.fused_activations": ("Relu",)}, name="renamed")
    b = lower(digits, other, dataflow="ws")
    assert len(programs) == n and b.npu == "renamed"
    assert [r.costs for r in a.layers] == [r.costs for r in b.layers]
    lower(digits, edge_spec.with_fields({"array.precision_scaling": "bit_serial"}),
          dataflow="ws")
    assert len(programs) == n + 1
