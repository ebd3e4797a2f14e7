"""npujax.explore and the sweep workflow: grids, samples, agreement with lower(), the Pareto
front, chunked files and resumption."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from npujax.errors import ConfigError, OutputError
from npujax.explore import Grid, configurations, pareto_front, parse_grid_axis, sweep
from npujax.frontends.flax import trace_flax
from npujax.hw import load_npu_spec
from npujax.ir.passes import optimize
from npujax.models.cnn import DigitsCNN
from npujax.plan import lower
from npujax.quantize import quant_spec
from npujax.workflows.sweep import run_sweep

GRID = {"array.rows": [8, 16, 32], "memory.dram_bytes_per_s": [3.2e9, 12.8e9], "bits": [4, 8]}


@pytest.fixture(scope="module")
def graph():
    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(DigitsCNN(rngs=nnx.Rngs(0)), jnp.zeros((1, 8, 8, 1), jnp.float32))
    return optimize(g, p)[0]


@pytest.fixture(scope="module")
def edge():
    return load_npu_spec("edge_16x16")


def test_parse_grid_axis():
    assert parse_grid_axis("array.rows=8,16") == ("array.rows", (8, 16))
    assert parse_grid_axis("memory.dram_bytes_per_s=3.2e9") == ("memory.dram_bytes_per_s",
                                                                (3.2e9,))
    assert parse_grid_axis("dataflow=ws,os") == ("dataflow", ("ws", "os"))
    with pytest.raises(ConfigError, match="section.key=v1"):
        parse_grid_axis("array.rows")
    for text in ("array.rows=8:16", "array.rows=8..32"):  # a range: list the values
        with pytest.raises(ConfigError, match=r"looks like a range.*array\.rows=8,16,32"):
            parse_grid_axis(text)


@pytest.mark.parametrize("axes,message", [
    ({}, "at least one"),
    ({"array.rowz": [8]}, "unknown hardware field"),
    ({"array.rows": [0, 8]}, "array"),
    ({"array.rows": [8, 8]}, "repeats"),
    ({"dataflow": ["diagonal"]}, "unknown dataflow"),
    ({"bits": [1, 8]}, "outside"),
])
def test_grid_rejects_bad_axes(edge, axes, message):
    with pytest.raises(ConfigError, match=message):
        Grid.build(axes, edge)


def test_configurations_product_and_samples(edge):
    g = Grid.build({"array.rows": [8, 16, 32], "array.cols": [4, 8], "dataflow": ["ws", "os"]},
                   edge)
    full = configurations(g)
    assert full.tolist() == [list(t) for t in itertools.product(range(3), range(2), range(2))]
    r = configurations(g, 5, "random", seed=1)
    assert len({tuple(x) for x in r.tolist()}) == 5  # without replacement
    assert r.tolist() == configurations(g, 5, "random", seed=1).tolist()  # reproducible
    lhs = configurations(g, 6, "lhs", seed=3)
    assert sorted(np.bincount(lhs[:, 0], minlength=3)) == [2, 2, 2]  # every value evenly
    assert sorted(np.bincount(lhs[:, 1], minlength=2)) == [3, 3]
    with pytest.raises(ConfigError, match="exceeds"):
        configurations(g, 13, "random")
    with pytest.raises(ConfigError, match="sampling method"):
        configurations(g, 2, "sobol")


def test_pareto_front_matches_brute_force():
    rng = np.random.default_rng(0)
    obj = rng.integers(0, 6, (200, 2)).astype(float)
    front = set(pareto_front(obj).tolist())
    for i, p in enumerate(obj):
        dominated = np.any(np.all(obj <= p, 1) & np.any(obj < p, 1))
        assert (i in front) == (not dominated)


def test_sweep_equals_lower_per_configuration(graph, edge):
    r = sweep(graph, edge, GRID)
    assert len(r) == 12 and r.layers > 0
    table = r.table(edge)
    for i in (0, 5, 11):
        rows, bw, bits = (table[k][i] for k in ("array.rows", "memory.dram_bytes_per_s", "bits"))
        spec = edge.with_fields({"array.rows": int(rows), "memory.dram_bytes_per_s": float(bw)})
        s = lower(graph, spec, None if bits == 8 else quant_spec(graph, int(bits), int(bits)))
        assert table["compute_cycles"][i] == sum(x.costs.compute_cycles for x in s.layers)
        assert table["latency_cycles"][i] == pytest.approx(s.latency_cycles, rel=1e-12)
        assert table["pes"][i] == rows * 16
        # energy and area: the same model as lower's report (issue 13, section 3)
        assert table["energy_j"][i] == pytest.approx(s.energy_j, rel=1e-9)
        assert table["edp_js"][i] == pytest.approx(s.edp_js, rel=1e-9)
        assert table["area_mm2"][i] == pytest.approx(s.area_mm2, rel=1e-12)
    # narrower operands move fewer bytes; more bandwidth never slows a configuration down
    assert np.all(table["dram_bytes"][table["bits"] == 4] < table["dram_bytes"][table["bits"] == 8])
    lat = table["latency_s"].reshape(3, 2, 2)
    assert np.all(lat[:, 1] <= lat[:, 0])
    assert set(table["gemm_bound"]) <= {"compute", "memory"}
    # more rows: more area; narrower operands: less energy
    area = table["area_mm2"].reshape(3, 2, 2)
    assert np.all(area[1:] > area[:-1])
    assert np.all(table["energy_j"][table["bits"] == 4] < table["energy_j"][table["bits"] == 8])


@pytest.fixture
def compiled(monkeypatch):
    """Sweeps of any size compile their program (a small one otherwise runs with numpy)."""
    import importlib

    sw = importlib.import_module("npujax.explore.sweep")
    monkeypatch.setattr(sw, "NUMPY_MAX_CONFIGS", 0)
    return sw


@pytest.fixture
def user_compiled(monkeypatch, compiled):
    """The sweep's program compiled as in a user's process (LLVM at -O2, the sweep's own
    choice of XLA:CPU emitters), not with the suite's -O0 (tests/conftest.py)."""
    sw = compiled
    monkeypatch.setattr(sw, "_CPU_OPTIONS", {**sw._CPU_OPTIONS,
                                             "xla_backend_optimization_level": 2})
    caches = (sw._compiler_options, sw._program, sw._table_program)
    for cache in caches:
        cache.cache_clear()
    yield sw
    for cache in caches:
        cache.cache_clear()


def test_dataflows_are_data_in_one_program(graph, edge, user_compiled):
    """A grid over dataflows compiles ONE program (issue 30, item 4), and each configuration's
    figures equal, bit for bit, those of the program of its dataflow alone (the per-dataflow
    programs the sweep compiled before), for every column, as a user's process compiles them
    (checked for input stationary, the third, whose streamed operand is the weights; the
    formulas take the dataflow as data, npujax.systolic.dataflow.Roles, and
    tests/systolic/test_roles.py checks every dataflow's figures; each -O2 compile costs a
    second).
    (With the suite's -O0 and legacy emitters XLA rounded DigitsCNN's energy total of 2 of 12
    configurations differently in the two programs: that the bits hold is a claim about the
    options the sweep compiles with.)"""
    from npujax.explore.sweep import COLUMNS, evaluate
    from npujax.plan import network

    sw = user_compiled
    grid = {"array.rows": [8, 32], "bits": [4, 8], "dataflow": ["ws", "os", "is"]}
    r = sweep(graph, edge, grid)
    assert sw._table_program.cache_info().misses == 1  # one program for the three dataflows
    table = r.table(edge)
    layers, chains = network(graph, edge)
    rows = np.flatnonzero(table["array.dataflow"] == "input_stationary")
    alone = evaluate(layers, edge.with_fields({"array.dataflow": "input_stationary"}),
                     {"array.rows": table["array.rows"][rows]},
                     table["bits"][rows].astype(np.float64), None, chains)
    for k in COLUMNS:
        np.testing.assert_array_equal(r.columns[k][rows], alone[k], err_msg=k)
    assert not np.array_equal(r.columns["latency_s"][::2], r.columns["latency_s"][1::2])
    # a sweep this small runs the same traced program with numpy, nothing compiled: the
    # integers the same, the floats within float64 rounding (XLA reassociates some divisions)
    from npujax import _program_cache
    from npujax.explore.sweep import INT_COLUMNS

    fallbacks, programs = len(_program_cache.numpy_fallbacks), sw._table_program.cache_info()
    sw.NUMPY_MAX_CONFIGS = len(r)
    small = sweep(graph, edge, grid).columns
    assert sw._table_program.cache_info() == programs  # (nothing new compiled)
    assert len(_program_cache.numpy_fallbacks) == fallbacks  # (nor left to XLA)
    for k in COLUMNS:
        if k in INT_COLUMNS:
            np.testing.assert_array_equal(small[k], r.columns[k], err_msg=k)
        else:
            np.testing.assert_allclose(small[k], r.columns[k], rtol=1e-14, atol=0, err_msg=k)
    with pytest.raises(ConfigError, match="indices into the 2 dataflows"):
        evaluate(layers, edge, {}, np.full(2, 8.0), dataflows=("ws", "os"),
                 dataflow=np.array([0, 2]))


def test_layer_table_program_equals_the_layer_list_program(graph, edge, compiled):
    """The sweep evaluates a traced, padded layer table (one program for every model of the
    padded length) with the figures of the program with the layers as constants, bit for bit,
    for every column (the padding rows cost exactly 0)."""
    import importlib

    from npujax.explore.sweep import COLUMNS
    from npujax.plan import network

    sw = importlib.import_module("npujax.explore.sweep")
    layers, chains = network(graph, edge)
    assert sw._table_length(len(layers)) > len(layers)  # (padding rows are evaluated)
    r = sweep(graph, edge, GRID)  # (the program of test_sweep_equals_lower_per_configuration)
    values = r.axis_values()
    changes = {k: np.append(values[k], values[k][-4:]) for k in GRID if k != "bits"}
    bits = np.append(values["bits"], values["bits"][-4:]).astype(np.float64)
    with jax.enable_x64(True):
        static = sw._program(tuple(layers), (edge.array.dataflow,), sw._mesh(None),
                             tuple(chains))(sw.fields.stack(edge, changes, 16), bits,
                                            np.zeros(16, np.int32))
    for k in COLUMNS:
        np.testing.assert_array_equal(r.columns[k], np.asarray(static[k])[:12], err_msg=k)


def test_sweep_program_is_kept_between_processes(graph, edge, tmp_path, monkeypatch, compiled):
    """Where the command line keeps programs (``npujax._program_cache``), the sweep's traced
    program is written once and read back by a later process, which traces nothing; the
    figures are those of the plain jitted program."""
    from npujax import _program_cache

    plain = sweep(graph, edge, GRID).columns  # (compiled by the tests above)
    monkeypatch.setattr(_program_cache, "_loaded", {})
    _program_cache.enable(tmp_path)
    try:
        kept = sweep(graph, edge, GRID).columns
        assert [p.name.split("-")[0] for p in (tmp_path / _program_cache.SUBFOLDER).iterdir()
                ] == ["sweep_table"]
        monkeypatch.setattr(_program_cache, "_loaded", {})  # a new process: read, not traced
        monkeypatch.setattr(_program_cache, "_export", lambda *a: pytest.fail("traced again"))
        again = sweep(graph, edge, GRID).columns
    finally:
        _program_cache.enable(None)
    for k in plain:
        np.testing.assert_array_equal(kept[k], plain[k], err_msg=k)
        np.testing.assert_array_equal(again[k], plain[k], err_msg=k)


def test_run_sweep_writes_chunks_and_resumes(graph, edge, tmp_path):
    grid = Grid.build(GRID, edge)
    out = tmp_path / "s"
    first = run_sweep(graph, edge, grid, out, model="cnn", chunk_size=4, progress=False)
    assert (first.evaluated, first.skipped) == (3, 0)  # 4 + 4 + 4
    names = sorted(p.name for p in out.iterdir())
    assert {"results.csv", "pareto.csv", "pareto.png", "axes.png", "sweep.json"} <= set(names)
    csv = (out / "results.csv").read_text().splitlines()
    assert len(csv) == 13 and csv[0].startswith("array.rows,memory.dram_bytes_per_s,bits,")
    # an interruption lost one chunk: the rerun evaluates only that one, same results
    (out / "chunks" / "chunk-000001.npz").unlink()
    again = run_sweep(graph, edge, grid, out, model="cnn", chunk_size=4, progress=False)
    assert (again.evaluated, again.skipped) == (1, 2)
    for k, v in first.result.columns.items():
        np.testing.assert_array_equal(again.result.columns[k], v)
    assert (out / "results.csv").read_text().splitlines() == csv
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["sweep"]["configs"] == 12 and meta["pareto_size"] >= 1
    with pytest.raises(ConfigError, match="different sweep"):
        run_sweep(graph, edge, grid, out, model="cnn", chunk_size=6, progress=False)


def test_resumption_is_keyed_by_content(graph, edge, tmp_path, monkeypatch):
    """A rerun into the same folder resumes only the same inputs: another model under the same
    name, a preset of the same name with other numbers, another npujax version are each a
    one-line error naming what changed (issue 28, item 8: it served the old model's results)."""
    from npujax.ir.passes import rebatch

    grid = Grid.build({"array.rows": [8, 16]}, edge)
    out = tmp_path / "s"
    first = run_sweep(graph, edge, grid, out, model="m.onnx", chunk_size=1, progress=False)
    cases = [(rebatch(graph, 2), edge, "the model's layers"),
             (graph, edge.with_fields({"memory.dram_bytes_per_s": 1.0e10}), "the NPU spec")]
    for g, spec, what in cases:
        with pytest.raises(ConfigError, match=f"holds a different sweep: {what} changed") as e:
            run_sweep(g, spec, grid, out, model="m.onnx", chunk_size=1, progress=False)
        assert "\n" not in str(e.value)
    # a grid that differs in a later axis: the message shows that axis, not the common prefix
    wide = Grid.build({"array.rows": [8, 16], "array.cols": [8, 16, 32, 64]}, edge)
    with pytest.raises(ConfigError, match="the grid") as e:
        run_sweep(graph, edge, wide, out, model="m.onnx", chunk_size=1, progress=False)
    assert "'array.cols': [8, 16, 32, 64]" in str(e.value) and "array.rows" not in str(e.value)
    # an axis one grid lacks is named so, the values whole (a trial saw "'array.cols': No now")
    other = Grid.build({"array.cols": [8, 16, 32]}, edge)
    with pytest.raises(ConfigError, match="the grid") as e:
        run_sweep(graph, edge, other, out, model="m.onnx", chunk_size=1, progress=False)
    assert ("{'array.rows': [8, 16], 'array.cols': (absent)} then, {'array.rows': (absent), "
            "'array.cols': [8, 16, 32]} now") in str(e.value)
    import npujax.workflows.sweep as workflow

    monkeypatch.setattr(workflow, "__version__", "9.9.9")
    with pytest.raises(ConfigError, match="the npujax version changed.*9.9.9"):
        run_sweep(graph, edge, grid, out, model="m.onnx", chunk_size=1, progress=False)
    monkeypatch.undo()
    rate = json.loads((out / "sweep.json").read_text())["evaluations_per_s"]
    again = run_sweep(graph, edge, grid, out, model="m.onnx", chunk_size=1, progress=False)
    assert (again.evaluated, again.skipped) == (0, 2)
    # nothing evaluated: the recorded rate stays the evaluating run's (it was overwritten by 0)
    assert json.loads((out / "sweep.json").read_text())["evaluations_per_s"] == rate > 0
    np.testing.assert_array_equal(again.result.columns["latency_s"],
                                  first.result.columns["latency_s"])


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_run_sweep_keeps_the_users_files_and_publishes_all_or_nothing(graph, edge, tmp_path,
                                                                       monkeypatch):
    """Issue 28, item 7, for the sweep: a user's file is kept, one named like a sweep output is
    refused before the work (never replaced); a crash leaves the visible folder as it was, and
    the rerun resumes from npujax's work folder."""
    import npujax.workflows.sweep as workflow

    grid = Grid.build(GRID, edge)
    out = tmp_path / "s"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "pareto.csv").write_text("my own front")
    before = _tree(out)
    with pytest.raises(OutputError, match="'pareto.csv', which npujax did not write"):
        run_sweep(graph, edge, grid, out, chunk_size=4, progress=False)
    assert _tree(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before)
    (out / "pareto.csv").unlink()
    real, calls = workflow.evaluate_configs, []

    def crash_on_the_second_chunk(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(workflow, "evaluate_configs", crash_on_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(graph, edge, grid, out, chunk_size=4, progress=False)
    assert {n for n in _tree(out) if not n.startswith(".npujax-work/")} == {"notes.txt"}
    assert workflow.kept_chunks(out) == 1
    monkeypatch.undo()
    again = run_sweep(graph, edge, grid, out, chunk_size=4, progress=False)
    assert (again.evaluated, again.skipped) == (2, 1)
    after = _tree(out)
    assert after["notes.txt"] == b"mine" and not any(n.startswith(".npujax") for n in after)
    assert {"results.csv", "pareto.csv", "sweep.json", "chunks/chunk-000002.npz",
            "npujax-manifest.json"} <= set(after)


def test_four_slices_merged_are_byte_identical_to_one_run(graph, edge, tmp_path):
    """``--shard I/N`` slices (no coordinator) joined by ``--merge``: the same files, byte for
    byte, as one run (sweep.json differs only in the measured rate and process count); slices
    of another sweep, a slice twice or missing, a whole sweep are refused by name."""
    from npujax.workflows.sweep import merge_sweeps, parse_shard

    grid = Grid.build(GRID, edge)
    one = run_sweep(graph, edge, grid, tmp_path / "one", model="cnn", chunk_size=3,
                    progress=False)  # 4 chunks (of 3, padded to the batch of 4 compiled above)
    slices = [tmp_path / f"slice{i}" for i in (2, 0, 3, 1)]
    for d in slices:
        part = run_sweep(graph, edge, grid, d, model="cnn", chunk_size=3, progress=False,
                         shard=(int(d.name[-1]), 4))
        assert part.result is None and part.evaluated == 1
    merged = merge_sweeps(slices, tmp_path / "merged")
    assert merged.result is not None and len(merged.result) == len(one.result) == 12
    a, b = _tree(tmp_path / "one"), _tree(tmp_path / "merged")
    assert set(a) == set(b) and {"results.csv", "pareto.png", "chunks/chunk-000003.npz"} <= set(a)
    for name in sorted(set(a) - {"sweep.json", "npujax-manifest.json"}):
        assert a[name] == b[name], name
    ja, jb = (json.loads(x["sweep.json"]) for x in (a, b))
    for j in (ja, jb):
        del j["evaluations_per_s"], j["processes"]
    assert ja == jb

    other = edge.with_fields({"memory.dram_bytes_per_s": 1.0e10})
    run_sweep(graph, other, Grid.build(GRID, other), tmp_path / "other", model="cnn",
              chunk_size=3, progress=False, shard=(1, 4))
    s0, s1, s2, s3 = (tmp_path / f"slice{i}" for i in range(4))
    cases = [([s0, tmp_path / "other", s2, s3],
              "slices of different sweeps, which differ in the NPU spec"),
             ([s0, s0, s2, s3], "slice 0/4 is given twice"),
             ([s0, s1, s3], r"slice\(s\) 2/4 missing"),
             ([s0, tmp_path / "one"], "a whole sweep, not a slice"),
             ([s0, tmp_path / "nothing"], "holds no sweep slice")]
    for folders, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            merge_sweeps(folders, tmp_path / "m")
        assert "\n" not in str(e.value)
    assert not (tmp_path / "m").exists()
    with pytest.raises(ConfigError, match="holds slice 1/4 of this sweep, not slice 0/4"):
        run_sweep(graph, edge, grid, s1, model="cnn", chunk_size=3, progress=False, shard=(0, 4))
    for bad in ("4/4", "1", "a/b", "-1/2"):
        with pytest.raises(ConfigError, match="--shard takes I/N"):
            parse_shard(bad)


def test_mapping_axis_is_static_and_equals_lower(graph, edge):
    """``memory.mapping`` is a name (it picks the mapper's formulas), so the sweep compiles one
    program per value; each row equals lower() with that mapping (it was once taken as a traced
    number and silently ignored)."""
    small = edge.with_fields({"memory.ifmap_sram_bytes": 1024, "memory.filter_sram_bytes": 1024,
                              "memory.ofmap_sram_bytes": 1024})
    grid = Grid.build({"memory.mapping": ["scalesim", "best"]}, small)
    assert grid.is_static("memory.mapping")
    table = sweep(graph, small, {"memory.mapping": ["scalesim", "best"]}).table(small)
    for i, mp in enumerate(table["memory.mapping"]):
        s = lower(graph, small, mapping=str(mp))
        assert table["latency_cycles"][i] == pytest.approx(s.latency_cycles, rel=1e-12)
        assert table["dram_bytes"][i] == pytest.approx(s.dram_bytes, rel=1e-12)
    assert table["dram_bytes"][1] < table["dram_bytes"][0]  # the mapper moves fewer bytes here


def test_figures_do_not_depend_on_the_batch(graph, edge):
    """A configuration's figures are the same bits whether it is evaluated alone, in a small
    batch or in a large one (a sweep's chunk size and each device's share of a batch change the
    batch): the layer sums are one fixed tree of additions (``_layer_sums``), not XLA's vmapped
    reduction, whose order changed with the batch (the PP-OCR classifier's totals differed in
    their last bit between 8 and 64 configurations). 120 layers: DigitsCNN's 5, repeated."""
    from npujax.explore.sweep import evaluate
    from npujax.plan import workloads

    layers = workloads(graph, edge) * 24
    rng = np.random.default_rng(0)
    n = 40
    changes = {"array.rows": rng.choice([8, 16, 32], n).astype(np.int64),
               "memory.dram_bytes_per_s": rng.choice([3.2e9, 6.4e9, 12.8e9], n)}
    bits = rng.choice([4.0, 8.0], n)
    many = evaluate(layers, edge, changes, bits)  # one batch of 64 (padded)
    few = evaluate(layers, edge, {k: v[:5] for k, v in changes.items()}, bits[:5])  # of 8
    for k, v in few.items():
        np.testing.assert_array_equal(v, many[k][:5], err_msg=k)


def test_sweep_sustained_latency_agrees_with_lower(graph, edge):
    """The sweep's sustained_latency_s (the thermal model in its vmapped program) is the one
    lower --sustained reports: the same cost program at each DVFS clock."""
    from npujax.plan.thermal import sustained, thermal_state

    spec = edge.with_fields({"thermal.junction_to_ambient_k_per_w": 10.0,
                             "thermal.static_power_w": 4.0,
                             "thermal.dvfs_thresholds_c": [40.0],
                             "thermal.dvfs_clock_scales": [0.5]})
    res = sweep(graph, spec, {"array.rows": [16]})
    rep = sustained(spec, 1e6, lambda s: ((x := lower(graph, s)).latency_s, x.energy_j))
    assert rep.state.first_throttle_s < 1e6  # it does throttle
    col = res.columns
    assert col["sustained_latency_s"][0] == pytest.approx(rep.state.steady_latency_s, rel=1e-9)
    assert col["sustained_latency_s"][0] > col["latency_s"][0]
    assert col["steady_temperature_c"][0] == pytest.approx(rep.state.steady_temperature_c,
                                                           rel=1e-9)
    assert thermal_state  # the model both consumers call
