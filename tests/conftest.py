"""Strict JAX settings for every test (as equinox's test suite does): no silent dtype or rank
promotion, so an int8 operand can never be widened behind our back.

Flax's own layers (e.g. ``avg_pool`` dividing by an integer window size) are not written for
strict promotion, so tests that run a Flax model are marked ``flax_model`` and use JAX's standard
promotion for that part only.

Compilation dominates the suite's run time, and many tests compile the same XLA programs through
new ``jax.jit`` objects (a fixture per module, a CLI test's subprocess, a retraced lambda).
JAX's persistent compilation cache turns those repeats into cache hits: it is switched on for
the session, in a fresh temporary folder that the subprocesses the tests start share through
``JAX_COMPILATION_CACHE_DIR``, and removed at the end. A cache entry's key hashes the XLA program,
the compile options, the jax/jaxlib/XLA versions and the device, so a hit returns the executable
that compiling would; a fresh folder per session also means no entry written by another checkout,
another environment or an interrupted run is ever read.

XLA's CPU backend compiles the suite's programs with LLVM at ``-O0``
(``--xla_backend_optimization_level=0``, added to ``XLA_FLAGS`` for the session and its
subprocesses unless the caller set a level): the HLO passes (fusion, layout, the program's
arithmetic) run as in a user's process, only LLVM's code-generation optimizations are skipped,
which take longer than the suite's small programs run. ``npujax lower`` compiles its cost program
this way for users too (``npujax.plan.lower._ONCE``). LLVM at ``-O2`` may contract a multiply and
an add into an FMA where ``-O0`` does not, so a real-valued result could differ in its last bit
from a user's process; every tolerance in the suite is far above that, and bit-identity tests
compare two programs compiled alike.

XLA:CPU also emits the suite's elementwise fusions with its legacy emitters
(``--xla_cpu_use_fusion_emitters=false``), which compile in about half the time of the MLIR
fusion emitters users get (the whole suite: 15:00 -> 11:08 of CPU on 2 cores, 1,313 tests, back
to back on one machine). The two may order a float sum or contract a multiply-add differently,
so a float64 result can differ in its last bit (40 of 11,880 arrays of the cost model's program
of a static layer list did, ``experiments/bench/cost_program_options.py --program list``; the
programs ``lower`` runs, which compile with the legacy emitters for users too,
``npujax.plan.lower._cost_options``, did not). As with ``-O0``, tests that compare two programs
compile both alike, and the few claims about the bits a user's process gets (the integer path
equal to onnxruntime, the host-summed energy total) compile with a user's options
(``tests.helpers.USER_OPTIONS``). The flag is added only after a subprocess has shown that this
jaxlib knows it: XLA aborts a process whose ``XLA_FLAGS`` names an unknown flag.

MLIR locations carry the op's own source line but not the whole Python traceback
(``jax_include_full_tracebacks_in_locations`` off, for the session and its subprocesses): under
pytest every op's stack is 40-100 frames deep, and turning them into locations took about 5 %
of the suite's CPU. Locations are debug information only (JAX strips them from the compilation
cache key; the compiled code is the same).

Python's cyclic garbage collector is tuned for the session: after collection (the imported
modules, fixtures' definitions) the heap is frozen (``gc.freeze``: never scanned again) and the
collector runs less often (thresholds 10,000 / 10 / 100 instead of 700 / 10 / 10). Tracing makes
millions of short-lived objects, and every full collection scanned the whole heap of JAX's
caches: 17 of 276 s of CPU went to the collector in ``tests/plan tests/quantize tests/search``,
5 s after (243 s of CPU in all; the workers' peak memory the same, 1.9-2.1 GB). The heap is
unfrozen at the end, so the final collections (pytest's check for exceptions raised in
finalizers) see every object, as before.

Under pytest-xdist (``-n auto`` in ``pyproject.toml``) each worker has its own folder. (Sharing one
needs JAX's size-limited cache for its file lock, and that cache stats every entry and reads its
access time on every write, under the lock: quadratic in the thousands of entries a run makes.)
"""

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import pytest
from hypothesis import settings

# The suite is CI's gate: the property tests draw the same examples on every run (a random draw
# once failed a tolerance that the examples before it never reached, on unchanged code). To
# draw new examples on each run, as Hypothesis does by default: --hypothesis-profile=explore
# (with --hypothesis-seed=N to replay a draw).
settings.register_profile("gate", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("gate")

_JAX_CACHE = pytest.StashKey[tuple[str, dict[str, str | None]]]()
_CACHE_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
              "XLA_FLAGS", "JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS")
_LLVM_O0 = "--xla_backend_optimization_level=0"
_LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA accepts ``flag`` in ``XLA_FLAGS`` (a process that starts its
    CPU backend with it exits 0; an unknown flag aborts it)."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()}
    probe = "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pytest_configure(config):
    path = tempfile.mkdtemp(prefix="npujax-jax-cache-")
    saved = {k: os.environ.get(k) for k in _CACHE_ENV}
    config.stash[_JAX_CACHE] = (path, saved)
    # every program, however fast it compiled: the small ones are most of the repeats
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_include_full_tracebacks_in_locations", False)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:  # read when the backend starts, below
        flags = f"{flags} {_LLVM_O0}".strip()
    # (xdist workers inherit the controller's XLA_FLAGS with the flag, so only it probes)
    if "xla_cpu_use_fusion_emitters" not in flags and _xla_knows(_LEGACY_EMITTERS):
        flags = f"{flags} {_LEGACY_EMITTERS}"
    os.environ.update(zip(_CACHE_ENV, (path, "0", flags, "false")))  # inherited by subprocesses


#: Test modules that each wait on one long subprocess (mypy ~20 s cold, mkdocs ~6 s): run first,
#: so that one worker waits on them while the other works, instead of one being among the last
#: tests of a queue (xdist cannot steal those), with the other worker idle until it ends.
_FIRST = ("test_typecheck.py", "test_docs.py")
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.parent == _TESTS and item.path.name in _FIRST,
               reverse=True)  # stable: the rest keep their order


_GC = pytest.StashKey[tuple[int, int, int]]()


def pytest_collection_finish(session):
    session.config.stash[_GC] = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 100)


def pytest_unconfigure(config):
    if _GC in config.stash:
        gc.unfreeze()
        gc.set_threshold(*config.stash[_GC])
    path, saved = config.stash[_JAX_CACHE]
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _strict_jax(request):
    if request.node.get_closest_marker("flax_model"):
        yield
        return
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


@pytest.fixture(autouse=True)
def _npujax_logger():
    """Restore the ``npujax`` logger after each test: the CLI's ``main`` (run in-process by many
    tests) points it at the stderr of the moment and stops propagation, which would leave later
    tests of the same worker writing to a closed capture and their ``caplog`` empty."""
    import logging

    logger = logging.getLogger("npujax")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(autouse=True)
def _program_cache_folder():
    """Restore the folder of kept traced programs after each test: the CLI's ``main`` (run
    in-process) points :mod:`npujax._program_cache` at its compile cache, and later tests of the
    same worker would otherwise run the kept programs instead of the ones they check."""
    from npujax import _program_cache

    saved = _program_cache.folder()
    yield
    _program_cache._folder = saved


@pytest.fixture(scope="session")
def edge_spec():
    from npujax.hw import load_npu_spec

    return load_npu_spec("edge_16x16")


@pytest.fixture(scope="session")
def ppocr_cls():
    """``(path, graph, params)`` of the real PP-OCR direction classifier at ``[1, 3, 48, 192]``,
    imported once per session for every test that runs it (skips if PyPI is unreachable). Shared:
    read it, never change it in place (the passes return new params)."""
    from npujax.frontends.onnx import from_onnx
    from tests.onnx_models import zoo_path

    path = zoo_path("ppocr_cls")
    return path, *from_onnx(path, {"x": (1, 3, 48, 192)})


@pytest.fixture(scope="session")
def ppocr_rec():
    """``(path, graph, params)`` of the real PP-OCRv4 text recogniser (conv backbone + two
    transformer blocks) imported strictly (no CPU-fallback node) at ``[1, 3, 48, 320]`` and
    optimized, once per session (skips if PyPI is unreachable). Shared: read it, never change it
    in place."""
    from npujax.frontends.onnx import from_onnx
    from npujax.ir.passes import optimize
    from tests.onnx_models import zoo_path

    path = zoo_path("ppocr_rec")
    return path, *optimize(*from_onnx(path, {"x": (1, 3, 48, 320)}, unsupported="error"))


@pytest.fixture(scope="session")
def small_resnet():
    """``(graph, params)`` of :class:`~npujax.models.cnn.SmallResNet` (width 16, 28x28x1 input,
    random weights), traced and optimized once per session for the scheduling tests. Shared:
    read it, never change it."""
    from flax import nnx

    from npujax.models.cnn import SmallResNet
    from tests.flax_graphs import traced

    return traced(SmallResNet(rngs=nnx.Rngs(0), in_shape=(28, 28, 1), width=16), (1, 28, 28, 1))
