"""All dataflows in one program: ``layer_costs_by_dataflow`` and ``lower_by_dataflow`` give the
reference's numbers (int64 division, one program per dataflow), with one compilation; the ONNX
importer infers each node signature's shapes once (and, with the command line's folder, once
across processes)."""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npujax import _program_cache, _relax
from npujax.errors import ConfigError
from npujax.frontends import onnx as onnx_frontend
from npujax.frontends.onnx import from_onnx
from npujax.hw import DATAFLOWS, load_npu_spec
from npujax.hw.energy import area_breakdown
from npujax.plan import (
    layer_costs,
    layer_costs_by_dataflow,
    layer_table,
    lower,
    lower_by_dataflow,
    workloads,
)
from npujax.plan.costs import EXACT_FIELDS
from npujax.plan.passes.energy import layer_energy
from npujax.plan.table import table_length
from npujax.systolic.mapping import stacked_search


@pytest.fixture(scope="module")
def graph(small_resnet):
    return small_resnet[0]


def _configs(spec, n=48, seed=0):
    """``spec`` with [n] random array sizes, cores, SRAM sizes and DRAM bandwidths (int64 and
    float64 leaves, as the sweep builds them)."""
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


def test_fused_equals_the_reference_per_dataflow(graph):
    spec = load_npu_spec("bitserial_16x16")  # precision scaling, so the widths matter too
    layers = tuple(workloads(graph, spec))
    wb = np.asarray([4.0, 8.0, 2.0, 8.0] * len(layers), np.float32)[:len(layers)]
    ab = np.asarray([8.0, 4.0] * len(layers), np.float32)[:len(layers)]
    hw = _configs(spec)
    with jax.enable_x64(True):
        new = jax.jit(jax.vmap(lambda s: layer_costs_by_dataflow(layers, s, wb, ab)))(hw)
        with _relax.integer_division(), stacked_search():  # before: one program per dataflow
            ref = jax.jit(jax.vmap(lambda s: {df: layer_costs(layers, s, wb, ab, df)
                                              for df in DATAFLOWS}))(hw)
    assert set(new) == set(DATAFLOWS)
    for df in DATAFLOWS:
        for field in ref[df]._fields:
            got, want = (np.asarray(getattr(c[df], field)) for c in (new, ref))
            assert got.dtype == want.dtype and got.shape == (len(hw.array.rows), len(layers))
            if field in EXACT_FIELDS:  # counts: bit for bit over every configuration
                np.testing.assert_array_equal(got, want, err_msg=f"{df} {field}")
            else:  # XLA may fuse the two programs' float arithmetic differently
                np.testing.assert_allclose(got, want, rtol=1e-14, atol=0, err_msg=f"{df} {field}")


@pytest.mark.integration  # ~20 s on a loaded 2-core machine: two cost programs compiled
def test_bounded_division_and_unrolled_mapping_change_no_bit(graph, preset="bitserial_16x16"):
    """What runs (one-rounding division of the static GEMM extents, the mapping candidates
    unrolled) against the float64 program before it (corrected division everywhere, stacked
    candidates): every field, bit for bit, over random configurations."""
    spec = load_npu_spec(preset)
    layers = tuple(workloads(graph, spec))
    wb = np.asarray([4.0, 8.0, 2.0, 8.0] * len(layers), np.float32)[:len(layers)]
    ab = np.asarray([8.0, 4.0] * len(layers), np.float32)[:len(layers)]
    hw = _configs(spec, seed=1)
    run = lambda: jax.jit(jax.vmap(lambda s: {  # noqa: E731
        df: layer_costs(layers, s, wb, ab, df) for df in DATAFLOWS}))(hw)
    with jax.enable_x64(True):
        new = run()
        with _relax.corrected_division(), stacked_search():
            before = run()
    for df in DATAFLOWS:
        for field in before[df]._fields:
            np.testing.assert_array_equal(np.asarray(getattr(new[df], field)),
                                          np.asarray(getattr(before[df], field)),
                                          err_msg=f"{df} {field}")


def test_lower_by_dataflow_is_lower_at_each_dataflow_with_one_program(graph, edge_spec):
    _program_cache._numpy_programs.clear()
    by_df = lower_by_dataflow(graph, edge_spec, dataflows=("os", "ws", "is"))
    assert list(by_df) == ["output_stationary", "weight_stationary", "input_stationary"]
    assert len(_program_cache._numpy_programs) == 1  # one traced program, all dataflows
    assert [s.dataflow for s in by_df.values()] == list(by_df)
    one = lower(graph, edge_spec, dataflow="is")  # its own program: the same schedule
    assert by_df["input_stationary"].to_dict() == one.to_dict()
    # lower runs the program with numpy; the values are those of XLA's optimized program to
    # float64 rounding (npujax._jaxpr_numpy: XLA reassociates some divisions), counts exactly
    layers = workloads(graph, edge_spec)
    w = np.full(len(layers), 8.0, np.float32)
    with jax.enable_x64(True):
        optimized = jax.jit(lambda s: layer_costs_by_dataflow(layers, s, w, w))(edge_spec)
    for df, sched in by_df.items():
        for field, v in optimized[df]._asdict().items():
            got = [getattr(r.costs, field) for r in sched.layers]
            if field in EXACT_FIELDS:
                np.testing.assert_array_equal(got, np.asarray(v), err_msg=f"{df} {field}")
            else:
                np.testing.assert_allclose(got, np.asarray(v), rtol=1e-12,
                                           err_msg=f"{df} {field}")


def test_lower_by_dataflow_refuses_repeated_or_no_dataflows(graph, edge_spec):
    with pytest.raises(ConfigError, match="distinct"):
        lower_by_dataflow(graph, edge_spec, dataflows=("ws", "weight_stationary"))
    with pytest.raises(ConfigError, match="distinct"):
        lower_by_dataflow(graph, edge_spec, dataflows=())
    with pytest.raises(ConfigError, match="unknown dataflow"):
        lower_by_dataflow(graph, edge_spec, dataflows=("xs",))
    layers = workloads(graph, edge_spec)
    w = jnp.full(len(layers), 8.0)
    with pytest.raises(ConfigError, match="at least one"):
        layer_costs_by_dataflow(layers, edge_spec, w, w, ())
    with pytest.raises(ConfigError, match="twice"):
        layer_costs_by_dataflow(layers, edge_spec, w, w, ("is", "input_stationary"))


def _repeated_model() -> bytes:
    """x -> 4 x (Conv 3x3 8->8 + Relu), each conv with its own weights: 4 nodes of one
    signature per op."""
    rng = np.random.default_rng(0)
    nodes, inits, t = [], [], "x"
    for i in range(4):
        w = helper.make_tensor(f"w{i}", TensorProto.FLOAT, [8, 8, 3, 3],
                               rng.normal(size=8 * 8 * 9).astype(np.float32))
        inits.append(w)
        nodes += [helper.make_node("Conv", [t, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        t = f"r{i}"
    g = helper.make_graph(nodes, "rep", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8, 16, 16])], [helper.make_tensor_value_info(
            t, TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_onnx_import_infers_each_signature_once(monkeypatch):
    data = _repeated_model()
    calls = []
    real = jax.eval_shape
    monkeypatch.setattr(jax, "eval_shape", lambda *a, **k: calls.append(1) or real(*a, **k))
    cached, cached_params = from_onnx(data)
    n_cached = len(calls)
    monkeypatch.setattr(onnx_frontend, "_signature", lambda *a: None)  # no cache
    plain, plain_params = from_onnx(data)
    assert n_cached == 2 and len(calls) - n_cached == 8  # Conv and Relu once each, not 4 times
    assert {k: (v.shape, v.dtype) for k, v in cached.tensors.items()} == {
        k: (v.shape, v.dtype) for k, v in plain.tensors.items()}
    assert [repr(n) for n in cached.nodes] == [repr(n) for n in plain.nodes]
    assert jax.tree.all(jax.tree.map(np.array_equal, cached_params, plain_params))
    onnx.checker.check_model(onnx.load_from_string(data))


def test_signatures_shapes_are_kept_between_processes(monkeypatch, tmp_path):
    """With the command line's folder enabled, an import reads the output shapes of the
    signatures an earlier one traced (no tracing) and gets the same graph; a damaged entry is
    traced again. Without it, they are kept in JAX's compilation-cache folder where the user
    set a private one."""
    data = _repeated_model()
    calls = []
    real = jax.eval_shape
    monkeypatch.setattr(jax, "eval_shape", lambda *a, **k: calls.append(1) or real(*a, **k))
    saved = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)  # (the suite sets one)
        plain, _ = from_onnx(data)
        assert len(calls) == 2
        _program_cache.enable(tmp_path)
        first, _ = from_onnx(data)  # traced, kept
        files = sorted((tmp_path / _program_cache.SHAPES_SUBFOLDER).iterdir())
        assert len(calls) == 4 and len(files) == 2
        later, _ = from_onnx(data)  # a later process: read back
        assert len(calls) == 4
        files[0].write_bytes(b"[[[1, 8], ")
        again, _ = from_onnx(data)
        assert len(calls) == 5
        _program_cache.enable(None)
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
        from_onnx(data)
        assert len(calls) == 7
        assert len(list((tmp_path / "jax" / _program_cache.SHAPES_SUBFOLDER).iterdir())) == 2
    finally:
        _program_cache.enable(None)
        jax.config.update("jax_compilation_cache_dir", saved)
    types = {k: (v.shape, v.dtype) for k, v in plain.tensors.items()}
    for g in (first, later, again):
        assert {k: (v.shape, v.dtype) for k, v in g.tensors.items()} == types
        assert [repr(n) for n in g.nodes] == [repr(n) for n in plain.nodes]


def test_signature_keys_whole_attribute_values():
    big = np.zeros(10_000, np.int64)
    other = big.copy()
    other[5_000] = 1  # the same repr (numpy elides the middle), another value
    f = onnx_frontend._freeze
    assert f({"a": big}) != f({"a": other})
    assert f({"a": [1, 2]}) != f({"a": (1, 2)}) and f(1) != f(1.0) and f(True) != f(1)
    with pytest.raises(TypeError):
        f(object())


@pytest.fixture(scope="module")
def digits():
    from flax import nnx

    from npujax.models.cnn import DigitsCNN
    from tests.flax_graphs import traced

    return traced(DigitsCNN(rngs=nnx.Rngs(0)), (1, 8, 8, 1))[0]


def test_energy_total_summed_on_the_host_changes_no_bit(digits):
    """``lower``'s cost program leaves the energy total out and sums it on the host
    (``_with_total``): every output, the total included, bit for bit as the program with the
    total in it, at random widths (bitfusion_16x16: precision scaling). Both programs are
    compiled as ``lower``'s program was when the total moved to the host: LLVM -O0 and XLA's
    default (MLIR) fusion emitters (the suite's legacy emitters, tests/conftest.py, may sum
    the in-program total in another order)."""
    lower_module = importlib.import_module("npujax.plan.lower")
    spec = load_npu_spec("bitfusion_16x16")
    layers = workloads(digits, spec)
    table = layer_table(layers, table_length(len(layers)))
    rng = np.random.default_rng(0)
    widths = [np.full(len(table), 8.0, np.float32)] + [
        rng.choice([2.0, 3.0, 4.0, 6.0, 8.0], len(table)).astype(np.float32) for _ in range(3)]

    def before(s, w, a, t):  # the program before, energy total included
        by_df = layer_costs_by_dataflow(t, s, w, a, ("weight_stationary",))
        return by_df, {df: layer_energy(t, s, w, a, df, dram_bytes=c.dram_bytes)
                       for df, c in by_df.items()}, area_breakdown(s)

    with jax.enable_x64(True):
        options = {**lower_module._ONCE, "xla_cpu_use_fusion_emitters": True}
        ref = jax.jit(before, compiler_options=options)
        new = jax.jit(lower_module._jitted_table_costs(("weight_stationary",)).__wrapped__,
                      compiler_options=options)
        for wb, ab in zip(widths, widths[::-1]):
            want = jax.tree.map(np.asarray, ref(spec, wb, ab, table))
            by_df, energy, area, att, _ = jax.tree.map(np.asarray, new(spec, wb, ab, table))
            assert att == {} and all(e.total_j is None for e in energy.values())
            got = (by_df, {df: lower_module._with_total(e) for df, e in energy.items()}, area)
            leaves = jax.tree_util.tree_flatten_with_path(want)[0]
            assert [k for k, _ in leaves] == [k for k, _ in
                                               jax.tree_util.tree_flatten_with_path(got)[0]]
            for (path, w), g in zip(leaves, jax.tree.leaves(got)):
                assert w.dtype == g.dtype and np.array_equal(w, g), jax.tree_util.keystr(path)


def _leaves_equal(want, got, max_ulp: int = 0) -> None:
    want = jax.tree_util.tree_flatten_with_path(want)[0]
    got = jax.tree.leaves(got)
    assert len(want) == len(got)
    for (path, w), g in zip(want, got):
        w, g = np.asarray(w), np.asarray(g)
        assert w.dtype == g.dtype, jax.tree_util.keystr(path)
        if max_ulp and np.issubdtype(w.dtype, np.floating):
            np.testing.assert_array_max_ulp(w, g, maxulp=max_ulp)
        else:
            assert np.array_equal(w, g), jax.tree_util.keystr(path)


def test_cost_options_keep_lowers_numbers(digits):
    """``lower``'s cost programs compile with XLA:CPU's legacy elemental emitters where the
    jaxlib has them (``_cost_options``: about half the compile time); every output equals the
    same program compiled with XLA's default MLIR fusion emitters: the shared layer-table
    program (three dataflows) at 8 bits and at random widths on bitfusion_16x16 to 1 ulp (bit
    for bit before the instruction_stream pass joined every traced program), and a layer
    list's program with attention chains (a one-block decoder on edge_transformer_16x16, its
    dataflow) bit for bit. ``experiments/bench/cost_program_options.py``
    checks 4 models x 8 presets x 5 settings (15,720 arrays)."""
    from npujax.models.decoders import decoder_graph
    from npujax.models.transformer import DECODER_CONFIGS
    from npujax.plan.passes.attention import attention_chains

    L = importlib.import_module("npujax.plan.lower")
    options = L._cost_options()
    if options.get("xla_cpu_use_fusion_emitters") is not False:
        pytest.skip("this jaxlib (or backend) compiles the cost program with its default emitters")
    mlir = {**L._ONCE, "xla_cpu_use_fusion_emitters": True}
    rng = np.random.default_rng(1)
    cfg = dataclasses.replace(DECODER_CONFIGS["tiny"], layers=1)
    decoder = decoder_graph(cfg, phase="prefill", seq_len=64, kv_len=1, batch=1)
    with jax.enable_x64(True):
        run = L._jitted_table_costs(DATAFLOWS).__wrapped__
        legacy, default = (jax.jit(run, compiler_options=o) for o in (options, mlir))
        spec = load_npu_spec("bitfusion_16x16")  # (another preset is another program)
        layers = workloads(digits, spec)
        table = layer_table(layers, table_length(len(layers)))
        eight = np.full(len(table), 8.0, np.float32)
        mixed = rng.choice([2.0, 3.0, 4.0, 6.0, 16.0], (2, len(table))).astype(np.float32)
        for wb, ab in ((eight, eight), (mixed[0], mixed[1])):
            args = (L._program_spec(spec), wb, ab, table)
            # 1 ulp: with a traced spec the instruction_stream pass is in the program (its
            # bytes may be anything), and the two emitters then round two layers' DMA cycles
            # (input and output stationary, 8 bits) 1 ulp apart; without the pass, bit for bit
            _leaves_equal(default(*args), legacy(*args), max_ulp=1)

        spec = load_npu_spec("edge_transformer_16x16")
        layers = workloads(decoder, spec)
        chains = attention_chains(decoder, layers)
        assert chains
        run = L._jitted_costs.__wrapped__(tuple(layers), (spec.array.dataflow,), chains).__wrapped__
        wb, ab = L.layer_bits(layers, None)
        _leaves_equal(*(jax.jit(run, compiler_options=o)(spec, wb, ab) for o in (mlir, options)))
