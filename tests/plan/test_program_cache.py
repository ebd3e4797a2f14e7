"""``lower``'s cost programs kept between processes (``npujax._program_cache``): the numpy
program (``npujax._jaxpr_numpy``, ``lower``'s default) and, compiled, the ``jax.export`` program,
each written by a first run and read back by a later process, give the numbers of the same
evaluation without the folder bit for bit, on the layer-table program and on the static-list
program of an attention chain."""

import dataclasses
import importlib

import numpy as np
import pytest

from npujax import _program_cache
from npujax.plan import lower

lower_module = importlib.import_module("npujax.plan.lower")


def _numbers(schedule):
    """Every per-layer cost and energy field (float64 [L]) and the attention decisions."""
    rows = [r.to_dict() for r in schedule.layers]
    return ({k: np.asarray([r[k] for r in rows], np.float64) for k in rows[0]
             if isinstance(rows[0][k], float | int) and not isinstance(rows[0][k], bool)},
            [a.to_dict() for a in schedule.attention])


def _assert_identical(a, b):
    (ca, att_a), (cb, att_b) = _numbers(a), _numbers(b)
    assert ca.keys() == cb.keys()
    for k in ca:
        np.testing.assert_array_equal(ca[k], cb[k], err_msg=k, strict=True)
    assert att_a == att_b


@pytest.fixture
def program_folder(tmp_path):
    """The program cache enabled in ``tmp_path`` for one test (and emptied of loaded
    programs before and after, as in a fresh process)."""
    _program_cache._loaded.clear()
    _program_cache._numpy_programs.clear()
    _program_cache.enable(tmp_path)
    yield tmp_path / _program_cache.SUBFOLDER
    _program_cache.enable(None)
    _program_cache._loaded.clear()
    _program_cache._numpy_programs.clear()


@pytest.mark.parametrize("kind,preset,dataflow", [
    ("resnet", "edge_16x16", "ws"),  # the layer-table program (one for every model)
    ("decoder", "edge_transformer_16x16", "os"),  # an attention chain: the static list's
])
def test_numpy_program_file_equals_the_traced_one(model_kinds, program_folder, monkeypatch,
                                                 kind, preset, dataflow):
    from npujax import _jaxpr_numpy

    graph = model_kinds[kind]
    _program_cache.enable(None)
    plain = lower(graph, preset, dataflow=dataflow)
    _program_cache.enable(program_folder.parent)
    _program_cache._numpy_programs.clear()
    first = lower(graph, preset, dataflow=dataflow)  # traced, written
    files = sorted(program_folder.iterdir())
    assert len(files) == 1 and files[0].name.startswith(
        "costs-numpy-" if kind == "decoder" else "table_costs-numpy-")
    _program_cache._numpy_programs.clear()  # a later process: read back, nothing traced
    monkeypatch.setattr(_jaxpr_numpy, "flatten", lambda *a: pytest.fail("traced again"))
    later = lower(graph, preset, dataflow=dataflow)
    assert sorted(program_folder.iterdir()) == files
    _assert_identical(plain, first)
    _assert_identical(plain, later)


@pytest.mark.parametrize("kind,preset,dataflow", [
    ("resnet", "edge_16x16", "ws"),
    ("decoder", "edge_transformer_16x16", "os"),
])
def test_exported_program_equals_the_jitted_one(model_kinds, program_folder, kind, preset,
                                                dataflow):
    """(Compiled: with numpy evaluation off, or for a program numpy cannot run.)"""
    graph = model_kinds[kind]
    with _program_cache.numpy_evaluation(False):
        _exported_equals_jitted(graph, program_folder, kind, preset, dataflow)


def _exported_equals_jitted(graph, program_folder, kind, preset, dataflow):
    plain = lower(graph, preset, dataflow=dataflow)
    first = lower(graph, preset, dataflow=dataflow)  # exported, written
    files = sorted(program_folder.iterdir())
    assert len(files) == 1 and files[0].name.startswith(
        "costs-" if kind == "decoder" else "table_costs-")
    _program_cache._loaded.clear()  # a later process: read back, nothing traced
    traced = []
    real_export = _program_cache._export
    _program_cache._export = lambda *a: traced.append(a) or real_export(*a)
    try:
        later = lower(graph, preset, dataflow=dataflow)
    finally:
        _program_cache._export = real_export
    assert not traced and sorted(program_folder.iterdir()) == files
    _assert_identical(plain, first)
    _assert_identical(plain, later)
    if kind == "decoder":
        assert plain.attention and plain.attention[0].mode != "unfused"


def test_a_damaged_program_file_is_not_loaded(tmp_path):
    """(``call`` then traces and writes the program anew, as on a first run.)"""
    import jax
    import jax.numpy as jnp

    path = tmp_path / "p"
    exported = _program_cache._export(lambda x: {"y": jnp.sin(x)}, jax.tree.structure((0,)),
                                      [np.float32(1)])
    _program_cache._write(path, exported)
    good = path.read_bytes()
    back = _program_cache._read(path)
    assert back.in_avals == exported.in_avals and back.out_tree == exported.out_tree
    for damaged in (b"not a program", good[:len(good) // 2],
                    good.replace(_program_cache._MAGIC, b"npujax-exported\x01")):
        path.write_bytes(damaged)
        assert _program_cache._read(path) is None
    assert _program_cache._read(tmp_path / "absent") is None


def test_the_key_follows_what_the_trace_reads(model_kinds):
    """Another layer count, preset structure or dataflow is another program; hardware numbers
    that stay traced are not."""
    from npujax.hw import load_npu_spec
    from npujax.plan.table import layer_table

    spec = lower_module._program_spec(load_npu_spec("edge_16x16"))
    w = np.full(16, 8.0, np.float32)
    table = layer_table([], 16)

    def key(s=spec, n=16, names=("weight_stationary",)):
        import jax

        t = layer_table([], n)
        leaves, tree = jax.tree.flatten((s, w[:1].repeat(n), w[:1].repeat(n), t))
        return _program_cache._key("table_costs", names, tree, leaves, {})

    faster = dataclasses.replace(spec, memory=dataclasses.replace(
        spec.memory, dram_bytes_per_s=2 * spec.memory.dram_bytes_per_s))
    serial = dataclasses.replace(spec, array=dataclasses.replace(
        spec.array, precision_scaling="bit_serial"))
    assert len(table) == 16 and key() == key(faster)
    assert len({key(), key(n=32), key(serial), key(names=("output_stationary",))}) == 4


def test_numpy_program_files_damaged_or_wrong_are_traced_anew(program_folder):
    """A program file whose bytes changed (its checksum), or that reads but cannot run, is
    traced again and rewritten; the answer stays right."""
    import json

    def fn(x, y):
        return {"s": x * y + 1.0}

    args = (np.arange(3.0), np.float64(2.0))
    want = np.arange(3.0) * 2.0 + 1.0

    def run():
        _program_cache._numpy_programs.clear()  # a later process
        out = _program_cache.evaluate(fn, args, lambda: pytest.fail("compiled"), name="t")
        np.testing.assert_array_equal(out["s"], want)

    run()
    (path,) = program_folder.iterdir()
    good = path.read_bytes()
    body = json.loads(good[good.index(b"\n") + 1:])
    empty = {"program": {"in_dtypes": [], "n_slots": 0, "outs": [], "out_dtypes": [],
                         "consts": [], "steps": []}, "tree": body["tree"]}
    for damaged in (good.replace(b'"mul"', b'"add"'),  # a mul become an add: the checksum
                    _program_cache._sealed(json.dumps(empty).encode(),
                                           _program_cache._NUMPY_MAGIC)):
        path.write_bytes(damaged)
        run()
        assert path.read_bytes() == good  # written anew
