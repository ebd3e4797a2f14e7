"""Shared test helpers: tolerances per dtype in one place."""

import contextlib

import numpy as np

TOLERANCES = {
    np.dtype(np.float32): {"rtol": 1e-5, "atol": 1e-6},
    np.dtype(np.float64): {"rtol": 1e-12, "atol": 1e-12},
}


def assert_close(actual, desired, dtype=np.float32, **overrides):
    """assert_allclose with the tolerance of ``dtype`` (overridable)."""
    tol = {**TOLERANCES[np.dtype(dtype)], **overrides}
    np.testing.assert_allclose(np.asarray(actual), np.asarray(desired), **tol)


def digits_cnn(seed=0):
    """The demo's DigitsCNN with non-trivial BatchNorm statistics (so folding is really tested)."""
    import jax.numpy as jnp
    from flax import nnx

    from npujax.models.cnn import DigitsCNN

    m = DigitsCNN(rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for bn in (m.bn1, m.bn2):
        n = bn.mean[...].shape[0]
        bn.mean[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
        bn.var[...] = jnp.asarray(rng.uniform(0.5, 2.0, n), jnp.float32)
        bn.scale[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
        bn.bias[...] = jnp.asarray(rng.normal(size=n), jnp.float32)
    return m


def traced_digits_cnn():
    """``(model, (graph, params))``: :func:`digits_cnn` traced (BatchNorm not folded)."""
    import jax.numpy as jnp

    from npujax.frontends.flax import trace_flax

    m = digits_cnn()
    x = jnp.asarray(np.random.default_rng(0).uniform(size=(1, 8, 8, 1)), jnp.float32)
    return m, trace_flax(m, x)



def numpy_fill(abstract, seed=0):
    """A pytree of arrays shaped like ``abstract`` (``jax.ShapeDtypeStruct`` leaves, e.g. from
    ``jax.eval_shape(net.init, ...)``), drawn by numpy: kernels and tables ``N(0, 1/fan_in)``,
    vectors (scales, biases) ``1 + N(0, 0.2^2)``, a decode KV cache ``N(0, 0.5^2)``.

    Eager ``jax.random`` initialisers compile one XLA program per parameter shape (0.1-0.3 s
    each on CPU), which made building a tiny transformer take seconds; the tests only need
    random, well-scaled weights."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise TypeError(f"numpy_fill fills float variables only, got {leaf.dtype} at "
                            f"{jax.tree_util.keystr(path)}")
        z = rng.standard_normal(leaf.shape)
        if "cache" in jax.tree_util.keystr(path):
            v = 0.5 * z
        elif len(leaf.shape) >= 2:
            v = z / np.sqrt(max(1, int(np.prod(leaf.shape[:-1]))))
        else:
            v = 1.0 + 0.2 * z
        return jax.device_put(np.asarray(v, leaf.dtype))  # (jnp.asarray compiles per shape)

    return jax.tree_util.tree_map_with_path(fill, abstract)


def numpy_init(make, seed=0):
    """The NNX model ``make()`` builds, its constructor run by ``nnx.eval_shape`` (nothing
    compiled) and its variables filled by :func:`numpy_fill`."""
    from flax import nnx

    graphdef, state = nnx.split(nnx.eval_shape(make))
    return nnx.merge(graphdef, numpy_fill(state, seed))


def jit_once(fn):
    """``jax.jit(fn)`` with the XLA options ``trace_flax`` compiles its check with (a program run
    once compiles faster at -O0), so that the same program is a persistent-cache hit."""
    import jax

    from npujax.frontends.flax import _RUN_ONCE

    return jax.jit(fn, compiler_options=_RUN_ONCE)


def jit_model(model):
    """``x -> model(x)`` for an NNX model, jitted with its state as an argument (the same XLA
    program as ``trace_flax``'s own check, so the persistent compilation cache shares it)."""
    from flax import nnx

    graphdef, state = nnx.split(model)
    run = jit_once(lambda st, inp: nnx.merge(graphdef, st)(inp))
    return lambda x: run(state, x)


def jit_execute(graph, params, x, **kw):
    """``execute(graph, params, x, **kw)`` as one jitted program (params as an argument)."""
    from npujax.ir.execute import execute

    return jit_once(lambda p, inp: execute(graph, p, inp, **kw))(params, x)



def run_cli(*args, cwd=None):
    """Run ``npujax ARGS`` in this process, as a user's shell would run it.

    Returns a :class:`subprocess.CompletedProcess` (``returncode``, ``stdout``, ``stderr``) like
    ``subprocess.run(..., capture_output=True, text=True)``, without paying a new interpreter's
    JAX import and empty compilation cache per call (about 3 s of CPU each). ``main`` is the
    console script's own entry point, so exit codes and messages are the program's; the few tests
    of process-level behaviour (signals, pipes, the installed script) still use a subprocess.
    The command runs under JAX's default (standard) promotion, as the program does: the suite's
    strict mode is for npujax's own numerics, and the program's dependencies (optax's Adam,
    Flax's layers) are not written for it. The ``npujax`` logger, which ``main`` configures, is
    restored after each test by ``tests/conftest.py``.
    """
    import contextlib
    import io
    import os
    import subprocess

    import jax

    from npujax.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_cwd = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # argparse: --help, --version, usage errors
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        os.chdir(old_cwd)
    return subprocess.CompletedProcess(["npujax", *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


#: XLA options that undo the suite's compile-time settings (tests/conftest.py: LLVM at ``-O0``,
#: XLA:CPU's legacy fusion emitters): a program compiled with them gets the code, and the bits,
#: of a user's process.
USER_OPTIONS = {"xla_backend_optimization_level": 2, "xla_cpu_use_fusion_emitters": True}


def jit_optimized(fn, **kwargs):
    """``jax.jit(fn)`` compiled as in a user's process (:data:`USER_OPTIONS`: LLVM's
    optimizations on, ``-O2``, and XLA:CPU's fusion emitters), for the programs whose run time
    or whose exact bits a test is about. The suite compiles everything else with LLVM at
    ``-O0`` (tests/conftest.py), which makes XLA:CPU's integer convolutions -- plain loops, not
    a library kernel -- about 27x slower: 7.3 s instead of 0.27 s per image of the PP-OCR
    classifier's integer path."""
    import jax

    return jax.jit(fn, compiler_options=USER_OPTIONS, **kwargs)


#: JAX's monitoring events that name an XLA program (``fun_name``): a backend compilation
#: (persistent-cache hits included) and a lowering to MLIR (every program JAX builds, even one a
#: cache then returns).
COMPILED = "/jax/core/compile/backend_compile_duration"
LOWERED = "/jax/core/compile/jaxpr_to_mlir_module_duration"


@contextlib.contextmanager
def programs(event=COMPILED):
    """Yield the list of ``fun_name`` of the programs ``event`` reports inside the block
    (:data:`COMPILED` or :data:`LOWERED`)."""
    import jax

    names: list[str] = []

    def listener(ev, duration, **kw):
        if ev == event:
            names.append(kw.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
