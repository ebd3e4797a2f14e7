"""The differentiable mode of the cost model: exact forward values, useful gradients.

The cost model's counts are step functions of the hardware and of the bit widths (``ceil`` of
folds, passes and bursts; a buffer either holds what a fold reuses or not; a layer takes the
larger of its compute and memory time), so their true derivative is zero or undefined almost
everywhere: ``jax.grad`` of a bit-serial layer's latency w.r.t. its weight width gave 0.31
cycles/bit where one bit less saves ~9,216 cycles. Inside :func:`relaxed` (what
``layer_costs(..., relaxed=True)`` uses) the few helpers below keep the *forward value bit for bit*
and replace only the gradient (straight-through estimators, Bengio et al., arXiv:1308.3432):

=====================  =======================  =============================================
helper                 forward (both modes)     gradient in the relaxed mode
=====================  =======================  =============================================
:func:`ceil`           ``ceil(x)``              1 where ``x > 1``, 0 where ``x <= 1`` (a
                                                quantity that is at least one fold is flat
                                                there)
:func:`ceil_div`       ``ceil(a / b)``          w.r.t. ``a``: ``1 / b`` where ``a / b > 1``
                                                (as :func:`ceil`); w.r.t. ``b``: the forward
                                                difference ``ceil(a / (b + 1)) - ceil(a /
                                                b)``, or with ``slope="mean"`` that of
                                                :func:`ceil` (see below; the division is
                                                exact, see further below)
:func:`select`         ``where(take, x, y)``    of ``where(grad_take, x, y)``: a discrete
                                                choice whose gradient follows the choice a
                                                step would make (at a tie)
:func:`smooth_max`     ``max(a, b)``            ``s da + (1 - s) db``, ``s = clip(1/2 + (a -
                                                b) / 2T, 0, 1)``, ``T = temperature x max(|a|,
                                                |b|)``: the two sides blend within ``T`` of
                                                balance, the exact max's slope elsewhere
:func:`select_step`    ``where(fits, x, y)``    of ``s x + (1 - s) y``, ``s = clip(1/2 +
                                                log(capacity / need) / 2 temperature, 0, 1)``
:func:`count`          int64 (exact) / float64  float64 keeps the gradient (values are whole
                                                numbers below 2**53, so still exact)
=====================  =======================  =============================================

**Denominators: one unit more.** Every denominator of :func:`ceil_div` in the cost model is an
integer hardware count (array rows or columns, cores, lanes x cores), and a count changes by
whole units. The straight-through slope of ``ceil(a / b)`` w.r.t. ``b``, ``-a / b**2``, is the
staircase's mean slope; at a given ``b`` the change of one unit more is known exactly,
``ceil(a / (b + 1)) - ceil(a / b)``: 0 on a plateau (one more row saves no fold of ``a``, so
the layer only pays the longer fill and drain), minus whole folds where it crosses a step. The
relaxed gradient w.r.t. ``b`` is that forward difference (per unit of ``b``), so ``gradient x
1`` predicts what one more row, column, core or lane does, including its sign on plateaus
(measured: ``docs/npu_model.md``). It is myopic by design, and no single slope serves both
questions at a plateau: one more row costs fill and drain there (a positive change), while
the trend over several rows is fewer folds (a negative one). A descent that moves over many
units needs the trend, so :func:`relaxed` takes ``slope="mean"`` (``layer_costs(...,
count_slope="mean")``): the straight-through ``-a / b**2`` of before.
:func:`npujax.search.codesign.codesign` uses it; with the one-unit slope its descent stalled at
plateaus (the digits CNN's EDP on ``edge_16x16``: 26.8 pJ s against 17.5; averaging the
one-unit slope over sub-unit offsets of the shape recovered only 21.1, as plateaus span several
rows). The numerators (workload extents, bit widths, and counts derived from other hardware
fields) keep the straight-through slope in both.

Outside :func:`relaxed` every helper is the plain exact operation, so the exact mode's jaxpr and
values are unchanged. The mode is read while tracing (like :func:`npujax._exact.exact`), so a
``jit`` traced in one mode stays in it.

**Exact division.** x86 has no vector integer divide, so int64 ``(a + b - 1) // b`` runs one
scalar division (tens of cycles) per element and bound the vmapped cost model. In the exact mode
:func:`ceil_div` estimates the quotient in float64 (vector instructions) and corrects it in int64:

1. ``q = ceil(fl(a) / fl(b))`` in float64. XLA may compile the division as ``a * (1 / b)`` (its
   algebraic simplifier does so when ``b`` is broadcast from a smaller array, as a hardware field
   is under ``vmap``), so ``q`` is only an estimate: ``a`` and ``b`` convert exactly (integers
   up to 2**53), each of the reciprocal and the product rounds by at most 2**-53 relative, so
   the estimate of ``a / b`` is within ``2**-52 a / b`` of it. That is below 1 for ``a <= 2**53``
   and ``b >= 3``; for ``b`` = 1 or 2 (powers of two) everything is exact. So ``q`` is the
   ceiling, or one more or one less.
2. ``q += 1`` where ``q b < a``; then ``q -= 1`` where ``(q - 1) b >= a``. Afterwards ``(q - 1)
   b < a <= q b``: ``q = ceil(a / b)`` exactly. The tests run in float64 too (no int64
   multiply, which x86 vectorizes only with AVX-512DQ): a product below ``a <= 2**53`` is an
   integer below 2**53, so exact, and a product at or above ``a`` rounds to at least ``a``
   (rounding is monotonic), so each comparison has its exact outcome; ``q + 1`` is taken only
   below the ceiling (at most 2**53) and is exact.

This holds for every ``0 <= a <= 2**53`` and ``1 <= b <= 2**53``
(:data:`npujax.limits.MAX_EXACT_COUNT`, the largest count npujax accepts), whether XLA divides
or multiplies by the reciprocal. With ``wide=True`` numerators up to 2**62 (``b <= 2**52``): the
first estimate ``q0`` is within ``2**-51 a / b + 1 <= 2**11 + 1`` of ``a / b`` (``a`` itself
rounds when converted), so the int64 remainder ``e = a - q0 b`` has ``|e| <= 2**-51 a + b <
2**53`` (exact in float64) and ``|e / b| <= 2**11 + 1``; ``q0 + ceil(e / b)`` (equal to ``ceil(a
/ b)``) is estimated and corrected as above, in int64 (all products below 2**63).
**One rounding, for bounded numerators.** Where a static bound ``a <= 2**50`` is known (the
GEMM extents of a layer list, ``ceil_div(..., bound=)``), ``ceil(a / b) = ceil((a - 1/2) / b)``
needs no correction: for integers ``a >= 0``, ``b >= 1`` with ``n = ceil(a / b)``, ``(a - 1/2)
/ b`` lies in ``[n - 1 + 1/(2b), n - 1/(2b)]`` (``(n - 1) b < a <= n b``; for ``a = 0`` at
``-1/(2b)``), at least ``1/(2b)`` from the integers on either side. ``a - 1/2`` is exact (``a <
2**52``); the quotient, divided once or multiplied by a rounded reciprocal (two roundings of at
most 2**-53 relative), is within ``2**-51.9 (a - 1/2) / b < 2**-1.9 / b`` of it, so its ceiling
is ``n``: three vector operations (subtract, divide or multiply, ceil) instead of eleven. (At
2**51 the margin would be gone.)

``tests/plan/test_exact_division.py`` checks both against int64 division, exhaustively for small
operands and at the boundaries where the estimate could cross an integer, under ``jit`` and
``vmap`` (the reciprocal rewrite). Inside :func:`integer_division` (the reference for
benchmarks and equality tests) :func:`ceil_div` is the int64 division again.

Sources: the relaxed-simulator idea of DiffTune (Renda et al., MICRO 2020, arXiv:1912.00103),
which needed a learned surrogate, and DOSA (Hong et al., MICRO 2023, arXiv:2310.04436), which
differentiates an analytical model with relaxed ceilings; here the exact model itself is
differentiated, with its values kept.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from npujax._exact import COUNT, REAL
from npujax.errors import ConfigError

__all__ = ["relaxed", "is_relaxed", "temperature", "count_slope", "ceil", "ceil_div",
           "smooth_max", "select_step", "select", "count", "integer_division",
           "corrected_division", "DEFAULT_TEMPERATURE", "COUNT_SLOPES", "ONE_ROUNDING_BOUND"]

#: Default relative temperature of :func:`smooth_max` and :func:`select_step`.
DEFAULT_TEMPERATURE = 0.05

#: Numerators up to this (given as ``ceil_div(..., bound=)``) take the one-rounding form.
ONE_ROUNDING_BOUND = 2**50

_MODE: contextvars.ContextVar[float | None] = contextvars.ContextVar("npujax_relaxed",
                                                                      default=None)
#: How :func:`ceil_div`'s gradient w.r.t. its denominator (a hardware count) is estimated:
#: ``unit``, the change for one unit more (the default); ``mean``, the staircase's mean slope.
COUNT_SLOPES = ("unit", "mean")

_SLOPE: contextvars.ContextVar[str] = contextvars.ContextVar("npujax_count_slope",
                                                             default="unit")
_INT_DIVISION: contextvars.ContextVar[bool] = contextvars.ContextVar("npujax_int_division",
                                                                     default=False)
_CORRECTED: contextvars.ContextVar[bool] = contextvars.ContextVar("npujax_corrected_division",
                                                                  default=False)


@contextlib.contextmanager
def relaxed(temp: float = DEFAULT_TEMPERATURE, slope: str = "unit") -> Iterator[None]:
    """Trace the cost functions in the differentiable mode (see the module docstring).

    Args:
      temp: relative temperature (> 0, at most 10) of the smooth maximum and of the buffer
        residency steps: the gradient blends the two sides within ``temp`` of their size.
      slope: the gradient of a fold count w.r.t. the hardware count that divides it
        (:data:`COUNT_SLOPES`): ``unit``, the exact change for one unit more (what one more
        row does); ``mean``, the staircase's mean slope (the trend over many units, for a
        descent that must cross plateaus; module docstring).

    Raises:
      ConfigError: ``temp`` not a finite number in (0, 10], or an unknown ``slope``.
    """
    t = float(temp)
    if not 0.0 < t <= 10.0:
        raise ConfigError(f"relaxation temperature {temp!r} is out of range; use a number in "
                          f"(0, 10], e.g. the default {DEFAULT_TEMPERATURE}.")
    if slope not in COUNT_SLOPES:
        raise ConfigError(f"unknown count slope {slope!r}; use one of {', '.join(COUNT_SLOPES)} "
                          "('unit': the change for one unit more; 'mean': the staircase's mean "
                          "slope).")
    token, token_s = _MODE.set(t), _SLOPE.set(slope)
    try:
        yield
    finally:
        _SLOPE.reset(token_s)
        _MODE.reset(token)


@contextlib.contextmanager
def integer_division() -> Iterator[None]:
    """Trace :func:`ceil_div` as int64 ``(a + b - 1) // b`` (the implementation before the
    float64 one; see the module docstring): the reference that benchmarks and equality tests
    compare the float64 division against. Read while tracing, like :func:`relaxed`."""
    token = _INT_DIVISION.set(True)
    try:
        yield
    finally:
        _INT_DIVISION.reset(token)


@contextlib.contextmanager
def corrected_division() -> Iterator[None]:
    """Trace :func:`ceil_div` with the float64 estimate and its correction everywhere, ignoring
    ``bound`` (the implementation before the one-rounding form): a reference for benchmarks
    and equality tests. Read while tracing, like :func:`relaxed`."""
    token = _CORRECTED.set(True)
    try:
        yield
    finally:
        _CORRECTED.reset(token)


def is_relaxed() -> bool:
    """Whether the cost functions are being traced in the differentiable mode."""
    return _MODE.get() is not None


def temperature() -> float:
    """The relative temperature of the current :func:`relaxed` scope (default outside)."""
    t = _MODE.get()
    return DEFAULT_TEMPERATURE if t is None else t


def count_slope() -> str:
    """The :data:`COUNT_SLOPES` entry of the current :func:`relaxed` scope."""
    return _SLOPE.get()


def _ste(value: jax.Array, surrogate: jax.Array) -> jax.Array:
    """``value`` forward (bit for bit: ``s - s == 0``), the gradient of ``surrogate``."""
    return jax.lax.stop_gradient(value) + (surrogate - jax.lax.stop_gradient(surrogate))


def count(x: Any) -> jax.Array:
    """``x`` as a count: int64 in the exact mode, float64 (differentiable) in the relaxed one."""
    return jnp.asarray(x, REAL if is_relaxed() else COUNT)


def ceil(x: jax.Array) -> jax.Array:
    """``ceil(x)``; relaxed, with gradient 1 where ``x > 1`` (0 where ``x <= 1``)."""
    c = jnp.ceil(x)
    if not is_relaxed():
        return c
    return _ste(c, jnp.where(x > 1.0, x, 1.0))  # not jnp.maximum: slope 0 (not 1/2) at x == 1


def ceil_div(a: Any, b: Any, *, wide: bool = False, bound: int | None = None) -> jax.Array:
    """``ceil(a / b)`` of counts ``a >= 0``, ``b >= 1``: exact int64, or relaxed :func:`ceil`.

    Args:
      a: the numerator: int64 counts (call inside :func:`npujax._exact.exact`), at most 2**53
        (2**62 with ``wide``).
      b: the denominator: int64 counts >= 1, at most 2**53 (2**52 with ``wide``).
      wide: allow numerators up to 2**62 (one correction step more).
      bound: a static upper bound of ``a`` (a Python int, e.g. the largest GEMM extent of the
        layers), or None. At most :data:`ONE_ROUNDING_BOUND` (2**50), the quotient takes the
        one-rounding form ``ceil((a - 1/2) / b)`` (3 vector operations instead of 11; module
        docstring). A bound below the true ``a`` gives wrong counts: give one only where it is
        known.

    Returns:
      int64 ``ceil(a / b)`` (float64 in the relaxed mode), broadcast over the inputs, equal to
      the int64 ``(a + b - 1) // b`` within the ranges above (module docstring).
    """
    if is_relaxed():
        a, b = jnp.asarray(a, REAL), jnp.asarray(b, REAL)
        return _ceil_ratio(a, b) if count_slope() == "unit" else ceil(a / b)
    if _INT_DIVISION.get():
        return (a + b - 1) // b
    if (bound is not None and not wide and int(bound) <= ONE_ROUNDING_BOUND
            and not _CORRECTED.get()):
        # a - 1/2 is exact (a < 2**52) and lies at least 1/(2b) from a multiple of b: one
        # rounded division (or product with a rounded reciprocal) cannot cross it
        return jnp.ceil((jnp.asarray(a, REAL) - 0.5) / jnp.asarray(b, REAL)).astype(COUNT)
    a, b = jnp.asarray(a, COUNT), jnp.asarray(b, COUNT)
    fa, fb = a.astype(REAL), b.astype(REAL)
    if not wide:  # all in float64: the products below are exact or compare correctly
        q = jnp.ceil(fa / fb)  # within one of ceil(a / b)
        q = jnp.where(q * fb < fa, q + 1.0, q)
        return jnp.where((q - 1.0) * fb >= fa, q - 1.0, q).astype(COUNT)
    q = jnp.ceil(fa / fb).astype(COUNT)  # within 2**11 + 1 of a / b
    q = q + jnp.ceil((a - q * b).astype(REAL) / fb).astype(COUNT)  # the remainder's quotient
    q = jnp.where(q * b < a, q + 1, q)
    return jnp.where((q - 1) * b >= a, q - 1, q)


def _ceil_ratio(a: jax.Array, b: jax.Array) -> jax.Array:
    """``ceil(a / b)`` (float64) with the relaxed gradients of :func:`ceil_div`: w.r.t. ``a``
    the straight-through slope ``1 / b`` where ``a / b > 1`` (0 where one fold stays one
    fold); w.r.t. ``b`` the forward difference ``ceil(a / (b + 1)) - ceil(a / b)`` per unit of
    ``b`` (the exact change of the count for one more row, column, core or lane)."""
    sg = jax.lax.stop_gradient
    c = jnp.ceil(a / b)
    sa, sb = sg(a), sg(b)
    unit = jnp.ceil(sa / (sb + 1.0)) - sg(c)  # <= 0: one more unit of b never adds a fold
    numerator = jnp.where(sa / sb > 1.0, a / sb, 1.0)
    return _ste(c, numerator + unit * b)


def select(take: jax.Array, grad_take: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    """``where(take, x, y)``; relaxed, with the gradient of ``where(grad_take, x, y)`` (a
    discrete choice whose gradient follows another choice, e.g. the one a step would make at a
    tie). Outside the relaxed mode ``grad_take`` is ignored."""
    v = jnp.where(take, x, y)
    if not is_relaxed():
        return v
    return _ste(v, jnp.where(grad_take, x, y))


def smooth_max(a: jax.Array, b: jax.Array) -> jax.Array:
    """``max(a, b)``; relaxed, with the gradient of a log-sum-exp at the current temperature."""
    m = jnp.maximum(a, b)
    if not is_relaxed():
        return m
    t = jax.lax.stop_gradient(temperature() * jnp.maximum(jnp.maximum(jnp.abs(a), jnp.abs(b)),
                                                          1e-30))
    s = jax.lax.stop_gradient(_blend((a - b) / t))  # weight of a in d max / d(a, b)
    return _ste(m, s * a + (1.0 - s) * b)


def _blend(z: jax.Array) -> jax.Array:
    """The weight of one side: a hard sigmoid, 1/2 at ``z = 0``, linear over ``|z| <= 1``, and
    exactly 0 or 1 beyond, so far from a threshold the gradient is the exact one (no bleed of
    a branch that is 10x smaller into the gradient)."""
    return jnp.clip(0.5 + 0.5 * z, 0.0, 1.0)


def select_step(fits: jax.Array, need: jax.Array, capacity: jax.Array, x: jax.Array,
                y: jax.Array) -> jax.Array:
    """``where(fits, x, y)`` for ``fits = need <= capacity``; relaxed, with the gradient of
    ``s x + (1 - s) y``, ``s = sigmoid(log(capacity / need) / temperature)``, so a buffer's size
    and a tensor's bytes get a gradient near the threshold."""
    v = jnp.where(fits, x, y)
    if not is_relaxed():
        return v
    tiny = 1e-30
    s = _blend(jnp.log(jnp.maximum(capacity, tiny) / jnp.maximum(need, tiny)) / temperature())
    return _ste(v, s * x + (1.0 - s) * y)

