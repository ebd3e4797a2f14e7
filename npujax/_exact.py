"""Exact counts: the cost model's integer arithmetic runs in 64 bits, whatever JAX's config.

Cycle, byte and MAC counts of a layer routinely exceed 2**31 (a 3x3 conv 64->64 on a 4096x4096
input takes 2.4e9 cycles on a 16x16 array), so int32 wraps and float32 rounds. JAX's default
config has 64-bit types disabled, and enabling them globally would change every user's program.
npujax instead runs the cost functions (:func:`npujax.systolic.gemm_cycles`,
:func:`npujax.systolic.gemm_memory`, :func:`npujax.plan.layer_costs`) under a *scoped*
``jax.enable_x64(True)``: counts are int64 and the other quantities float64 inside, on every
backend (CPU, GPU, TPU have int64), under ``jit``, ``vmap`` and ``grad`` (the scope applies
while tracing; the traced program keeps its 64-bit types when it later runs or is transposed).

**Gathers and gradients.** ``jax.grad`` transposes the program after the scope has closed. Most
transposes reuse the cotangent's buffers, but a gather's (``x[index]``) allocates a zero buffer of
its operand's dtype, which JAX then truncates to float32 (``lax.scatter ... float32, float64``,
issue 28). So a value that depends on the differentiated inputs is never gathered in float64:
the bit widths are indexed in the dtype the caller gave them (a selection is exact in any dtype)
and widened after (:func:`npujax.plan.costs.input_widths`); computed float64 values are indexed
by a static index through :func:`take` and scattered through :func:`put` (masked sums with a
one-hot matrix, :func:`one_hot`, whose transposes are elementwise).

Contract: these functions return int64 counts (exact to 2**63; npujax refuses layers whose MACs
or tensor elements exceed 2**53, :data:`npujax.limits.MAX_EXACT_COUNT`, so nothing near that
bound is reached) and float64 values. Read them with numpy (``np.asarray``, ``int()``), or cast
them (``x.astype(jnp.float32)``) before mixing them with 32-bit jnp code: a jnp operation run
with x64 disabled would truncate them (JAX warns). Gradients w.r.t. float32 inputs (bit widths)
come back float32.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["exact", "COUNT", "REAL", "count", "real", "one_hot", "take", "put", "computed_once",
           "computing_once", "computes_once"]

#: The dtype of exact counts (cycles, MACs, folds) and of the other cost-model quantities.
COUNT = jnp.int64
REAL = jnp.float64

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def exact(fn: F) -> F:
    """Run ``fn`` with 64-bit types enabled (for its own tracing only; the caller's config is
    restored on return)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def count(x: Any) -> jax.Array:
    """``x`` as an int64 count (call inside :func:`exact`)."""
    return jnp.asarray(x, COUNT)


def real(x: Any) -> jax.Array:
    """``x`` as a float64 value (call inside :func:`exact`)."""
    return jnp.asarray(x, REAL)


def one_hot(index: Any, length: int) -> jax.Array:
    """float64 ``[E, length]`` one-hot rows of a static integer ``index`` ``[E]`` (numpy's
    negative indices count from the end; call inside :func:`exact`).

    Traced, the rows are computed in the program (the index against an iota) rather than
    carried as an ``[E, length]`` constant: the same 0.0 and 1.0, with an ``[E]`` constant
    instead of ``E x length`` (the attention pass's four of a batch-8 Llama decode step, 128
    chains x 2,851 layers, were 12 MB of the 13 MB exported program).

    Raises:
      IndexError: an index outside ``[-length, length)``.
    """
    index = np.asarray(index, np.int64).reshape(-1)
    if index.size and not (-length <= index.min() and index.max() < length):
        raise IndexError(f"one_hot: index out of range for length {length}: "
                         f"{index.min()}..{index.max()}")
    index = np.where(index < 0, index + length, index)
    return (jax.lax.broadcasted_iota(COUNT, (index.size, length), 1)
            == jnp.asarray(index, COUNT)[:, None]).astype(REAL)


def take(onehot: jax.Array, x: jax.Array) -> jax.Array:
    """``x[index]`` of a ``[L]`` ``x``, the index given by its :func:`one_hot` matrix ``[E, L]``:
    a masked sum, differentiable after the 64-bit scope has closed (a gather is not)."""
    return jnp.sum(onehot * x[None, :], axis=1)


def put(onehot: jax.Array, x: jax.Array) -> jax.Array:
    """``zeros[L].at[index].add(x)`` of a ``[E]`` ``x``, the index given by its :func:`one_hot`
    matrix ``[E, L]`` (as :func:`take`)."""
    return jnp.sum(onehot * x[:, None], axis=0)


def _twice_reduced(x: jax.Array) -> jax.Array:
    """The maximum (``or`` for bools) of two copies of ``x``: ``x``. lax operations only, so
    JAX's config converts no dtype (the JVP below may run after the 64-bit scope closed)."""
    w = jax.lax.broadcast_in_dim(x, x.shape + (2,), tuple(range(x.ndim)))
    if x.dtype == jnp.bool_:
        return jax.lax.reduce_or(w, (x.ndim,))
    return jax.lax.reduce_max(w, (x.ndim,))


@jax.custom_jvp
def _once(x: jax.Array) -> jax.Array:
    return _twice_reduced(x)


@_once.defjvp
def _once_jvp(primals: tuple[jax.Array], tangents: tuple[Any]) -> tuple[jax.Array, Any]:
    return _twice_reduced(primals[0]), tangents[0]  # the identity's tangent


_ONCE: contextvars.ContextVar[bool] = contextvars.ContextVar("npujax_computed_once",
                                                            default=False)


@contextlib.contextmanager
def computing_once() -> Iterator[None]:
    """Trace with :func:`computed_once` in effect (read while tracing, like
    ``npujax._relax.integer_division``); outside this scope it returns its argument."""
    token = _ONCE.set(True)
    try:
        yield
    finally:
        _ONCE.reset(token)


def computes_once() -> bool:
    """Whether :func:`computed_once` is in effect (inside :func:`computing_once`)."""
    return _ONCE.get()


def computed_once(tree: T) -> T:
    """The arrays of ``tree``, the same values bit for bit, each computed once by XLA (inside
    :func:`computing_once`; elsewhere ``tree`` itself).

    XLA fuses an elementwise producer into every consumer that reads it and recomputes it
    there, unless it counts as expensive (a float division, a reduction): a cheap chain read by
    many consumers is compiled, and run, once per consumer. The cost program's DRAM-level
    mapping search (8 candidates of about 40 operations each, per dataflow) was copied into each
    of the 14 fusions that read its figures: 19,108 instructions to compile for 6,750 traced
    operations (the README's sweep, three dataflows). Each array here goes through a maximum
    (``any`` for bools) over two copies of itself, a reduction XLA computes once and stores,
    whose value is the array itself (NaN and -0.0 included; a subnormal as XLA's arithmetic
    treats it: XLA:CPU may run a program flushing them to zero, so the cost program's figures,
    results of its arithmetic, are never subnormal there). ``jax.lax.optimization_barrier``
    would not do: XLA:CPU removes it before fusion. The tangent is the identity's.

    The values passed are the same bits, but the program around them is another graph, and
    XLA's algebraic rewrites of floats (which depend on how many users a value has) may then
    round another value differently: in ``lower``'s unbatched programs of scalar hardware
    numbers, a last bit of a few dma, latency or SRAM-energy figures moved on 7 of 11 presets.
    So only the design-space sweep's vmapped program traces in the scope (its 29 columns the
    same bits on all 11 presets, 256 random configurations each).

    Args:
      tree: a pytree of arrays of any shape and dtype (call inside :func:`exact` for 64-bit
        values).

    Returns:
      The same pytree structure and values.
    """
    if not _ONCE.get():
        return tree
    return jax.tree.map(lambda x: _once(jnp.asarray(x)), tree)
