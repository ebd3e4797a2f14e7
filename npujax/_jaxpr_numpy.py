"""Run a traced JAX program (a closed jaxpr) with numpy, operation by operation: no compilation.

The cost program of ``npujax lower`` (every dataflow's costs, energy and attention decisions of a
layer table: ~6,000 scalar and ``[L]`` operations) takes XLA about a second to compile and a
millisecond to run, and it runs once per command. This module evaluates the same traced program
with numpy instead: the program is the one :func:`jax.make_jaxpr` traces from the cost formulas
(so the formulas stay single-sourced, differentiable and jittable for sweeps and searches), and
each of its primitives is carried out by the numpy function with XLA's semantics for it
(IEEE-754 arithmetic in the operands' dtype, truncating integer division, saturating
float-to-integer conversion, NaN-propagating ``min``/``max``, clamped indices, float sums
added from the first element, ``scan`` as a loop). A program is flattened once into a list of
steps (nested ``jit`` calls inlined), each value freed after its last reader, and can be
written as plain JSON (:meth:`Program.to_json`, no pickle) and read back without JAX.

The numbers equal the compiled program's to float64 rounding, not bit for bit: XLA's algebraic
simplifier rewrites some operations the jaxpr states (``A / broadcast(B)`` as
``A * broadcast(1 / B)`` where ``B`` has one use, ``(A / B) / C`` as ``A / (B * C)``), depending
on use counts in its optimized graph, which no evaluator of the jaxpr can follow in general.

Only the primitives the cost programs use are carried out (:data:`PRIMITIVES`); a program with
any other raises :class:`Unsupported` when flattened, and the caller compiles it with XLA.

Reference: JAX documentation, "JAX internals: the jaxpr language" (``jax.make_jaxpr``);
XLA operation semantics (https://openxla.org/xla/operation_semantics) for each primitive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Unsupported", "Program", "flatten", "PRIMITIVES"]


class Unsupported(Exception):
    """The program holds a primitive (or a form of one) this module does not carry out."""


def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """XLA's integer division: the quotient rounded toward zero (numpy's ``//`` floors)."""
    q = np.floor_divide(x, y)
    fix = (np.remainder(x, y) != 0) & ((x < 0) != (y < 0))
    return q + fix.astype(q.dtype)


def _div(x: Any, y: Any) -> np.ndarray:
    if np.issubdtype(np.result_type(x), np.integer):
        return _int_div(x, y)
    return np.true_divide(x, y)


def _rem(x: Any, y: Any) -> np.ndarray:
    """XLA's remainder: the sign of the dividend (C's ``fmod``; numpy's ``%`` takes the
    divisor's)."""
    if np.issubdtype(np.result_type(x), np.integer):
        return x - _int_div(x, y) * y
    return np.fmod(x, y)


def _convert(dtype: str) -> Callable[[Any], np.ndarray]:
    """XLA's ``convert_element_type``: float to integer truncates toward zero, saturates at the
    integer's range and maps NaN to 0; to bool is ``!= 0``; the rest is numpy's ``astype``
    (round to nearest even)."""
    dst = np.dtype(dtype)

    def run(x: Any) -> np.ndarray:
        x = np.asarray(x)
        if dst == np.bool_:
            return x != 0
        if np.issubdtype(dst, np.integer) and np.issubdtype(x.dtype, np.floating):
            info = np.iinfo(dst)
            t = np.trunc(np.where(np.isnan(x), 0, x))
            hi = float(info.max)  # rounds up past the range for 64-bit integers
            out = np.clip(t, float(info.min), hi).astype(dst)
            return np.where(t >= hi, dst.type(info.max), out)
        return x.astype(dst)

    return run


def _round(method: int) -> Callable[[Any], np.ndarray]:
    """``lax.round``: to nearest even (``rounding_method`` 1) or away from zero (0)."""
    if method == 1:
        return np.rint

    def away(x: Any) -> np.ndarray:
        t = np.trunc(x)
        return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t).astype(np.result_type(x))

    return away


def _integer_pow(y: int) -> Callable[[Any], np.ndarray]:
    """``x ** y`` by squaring and multiplying, the products JAX lowers ``lax.integer_pow`` to
    (so the rounding is the same)."""
    def run(x: Any) -> np.ndarray:
        x = np.asarray(x)
        acc = None
        base, e = x, abs(y)
        while e > 0:
            if e & 1:
                acc = base if acc is None else acc * base
            e >>= 1
            if e > 0:
                base = base * base
        if acc is None:
            return np.ones_like(x)
        return np.reciprocal(acc) if y < 0 else acc

    return run


def _broadcast_in_dim(shape: Sequence[int], dims: Sequence[int]) -> Callable[[Any], np.ndarray]:
    shape, dims = tuple(shape), tuple(dims)

    def run(x: Any) -> np.ndarray:
        x = np.asarray(x)
        expanded = [1] * len(shape)
        for d, n in zip(dims, x.shape):
            expanded[d] = n
        return np.broadcast_to(x.reshape(expanded), shape)

    return run


def _iota(dtype: str, shape: Sequence[int], dimension: int) -> Callable[[], np.ndarray]:
    shape = tuple(shape)
    expanded = [1] * len(shape)
    expanded[dimension] = shape[dimension]
    value = np.broadcast_to(np.arange(shape[dimension], dtype=dtype).reshape(expanded), shape)
    return lambda: value


def _select_n(pred: Any, *cases: Any) -> np.ndarray:
    """``lax.select_n``: ``cases[pred]`` elementwise (a bool predicate picks case 1 where true)."""
    pred = np.asarray(pred)
    if len(cases) == 1:
        return np.asarray(cases[0])
    if pred.dtype == np.bool_:
        return np.where(pred, cases[1], cases[0])
    return np.choose(pred, np.broadcast_arrays(*cases))


def _gather(offset_dims: Sequence[int], collapsed_slice_dims: Sequence[int],
            start_index_map: Sequence[int], operand_batching_dims: Sequence[int],
            start_indices_batching_dims: Sequence[int],
            slice_sizes: Sequence[int]) -> Callable[..., np.ndarray]:
    """``lax.gather`` (XLA's ``Gather``, its index vector the last axis of the indices), each
    start index clamped to ``[0, dim - slice_size]`` as XLA clamps it: for an output index, its
    batch positions (those not in ``offset_dims``) pick a start vector, scattered over the
    operand's axes by ``start_index_map``, the operand's batching axes taking the matching
    batch position; the offset positions add a window offset along the operand's remaining
    axes (XLA's operation semantics, "Gather")."""
    offset, collapsed, index_map = tuple(offset_dims), set(collapsed_slice_dims), \
        tuple(start_index_map)
    batching = dict(zip(operand_batching_dims, start_indices_batching_dims))
    sizes = tuple(slice_sizes)

    def run(x: Any, idx: Any) -> np.ndarray:
        x, idx = np.asarray(x), np.asarray(idx)
        batch_shape = idx.shape[:-1]
        window = [d for d in range(x.ndim) if d not in collapsed and d not in batching]
        rank = len(batch_shape) + len(window)
        batch_pos = [p for p in range(rank) if p not in offset]

        def along(pos: int, values: np.ndarray) -> np.ndarray:  # 1-D values at output axis pos
            return values.reshape([-1 if q == pos else 1 for q in range(rank)])

        def over_batch(a: np.ndarray) -> np.ndarray:  # a [batch_shape] in the output's axes
            shape = [1] * rank
            for q, n in zip(batch_pos, batch_shape):
                shape[q] = n
            return a.reshape(shape)

        where: list[Any] = []
        for d in range(x.ndim):
            if d in index_map:
                start = np.clip(idx[..., index_map.index(d)], 0, x.shape[d] - sizes[d])
                at: Any = over_batch(start.astype(np.int64))
            elif d in batching:
                at = along(batch_pos[batching[d]], np.arange(batch_shape[batching[d]]))
            else:
                at = np.zeros([1] * rank, np.int64)
            if d in window:
                at = at + along(offset[window.index(d)], np.arange(sizes[d]))
            where.append(at)
        return x[tuple(where)]
    return run


def _pad(config: Sequence[Sequence[int]]) -> Callable[..., np.ndarray]:
    """``lax.pad``: per axis ``(low, high, interior)`` elements of ``value`` (a negative low
    or high crops)."""
    config = tuple(tuple(c) for c in config)

    def run(x: Any, value: Any) -> np.ndarray:
        x = np.asarray(x)
        spread = [d + max(d - 1, 0) * it for d, (_, _, it) in zip(x.shape, config)]
        out = np.full([max(lo, 0) + n + max(hi, 0) for n, (lo, hi, _) in zip(spread, config)],
                      value, dtype=x.dtype)
        out[tuple(slice(max(lo, 0), max(lo, 0) + n, it + 1)
                  for n, (lo, _, it) in zip(spread, config))] = x
        return out[tuple(slice(max(-lo, 0), size - max(-hi, 0))
                         for size, (lo, hi, _) in zip(out.shape, config))]
    return run


def _dynamic_slice(sizes: Sequence[int]) -> Callable[..., np.ndarray]:
    """``lax.dynamic_slice``: each start index clamped to ``[0, dim - size]`` as XLA clamps it."""
    sizes = tuple(sizes)

    def run(x: Any, *starts: Any) -> np.ndarray:
        x = np.asarray(x)
        return x[tuple(slice(b, b + n) for b, n in (
            (min(max(int(s), 0), d - n), n) for s, d, n in zip(starts, x.shape, sizes)))]

    return run


def _slice(start: Sequence[int], limit: Sequence[int],
           strides: Sequence[int] | None) -> Callable[[Any], np.ndarray]:
    steps = strides or [1] * len(start)
    index = tuple(slice(b, e, st) for b, e, st in zip(start, limit, steps))
    return lambda x: np.asarray(x)[index]


def _reduce_sum(axes: Sequence[int]) -> Callable[[Any], np.ndarray]:
    """``reduce_sum`` over ``axes``: exact for integers; floats added one at a time from the
    first element (XLA:CPU's loop order for a reduction; numpy's ``sum`` adds pairwise)."""
    axes = tuple(axes)

    def run(x: Any) -> np.ndarray:
        x = np.asarray(x)
        if not np.issubdtype(x.dtype, np.floating):
            return np.sum(x, axis=axes, dtype=x.dtype)
        keep = [d for d in range(x.ndim) if d not in axes]
        y = np.transpose(x, keep + list(axes)).reshape([x.shape[d] for d in keep] + [-1])
        y = np.concatenate([np.zeros(y.shape[:-1] + (1,), x.dtype), y], axis=-1)
        return np.add.accumulate(y, axis=-1)[..., -1]

    return run


def _reduce(fn: Callable[..., np.ndarray]) -> Callable[..., Callable[[Any], np.ndarray]]:
    return lambda axes: (lambda x: fn(x, axis=tuple(axes)))


def _arg(fn: Callable[..., np.ndarray]) -> Callable[..., Callable[[Any], np.ndarray]]:
    """``argmin``/``argmax`` along one axis: the first index of the extreme, NaN counting as
    the extreme (as ``jnp.argmin`` and numpy both do)."""
    return lambda axis, index_dtype: (lambda x: fn(x, axis=axis).astype(index_dtype))


def _cumulative(fn: Callable[..., np.ndarray]) -> Callable[..., Callable[[Any], np.ndarray]]:
    """``cumsum``-style scans along ``axis`` (``reverse``: from the end), left to right as
    XLA's ``reduce_window`` adds them."""
    def factory(axis: int, reverse: bool) -> Callable[[Any], np.ndarray]:
        def run(x: Any) -> np.ndarray:
            x = np.asarray(x)
            if reverse:
                return np.flip(fn(np.flip(x, axis), axis=axis), axis).astype(x.dtype)
            return fn(x, axis=axis).astype(x.dtype)
        return run
    return factory


def _fixed(fn: Callable[..., Any]) -> Callable[[], Callable[..., Any]]:
    """The factory of a primitive without parameters: ``fn`` itself."""
    return lambda: fn


#: Primitive name -> factory of its numpy function from the step's parameters (keywords).
PRIMITIVES: dict[str, Callable[..., Callable[..., Any]]] = {
    "add": _fixed(np.add), "sub": _fixed(np.subtract), "mul": _fixed(np.multiply),
    "div": _fixed(_div), "rem": _fixed(_rem),
    "max": _fixed(np.maximum), "min": _fixed(np.minimum),  # both propagate NaN, as XLA's
    "pow": _fixed(np.power), "integer_pow": _integer_pow,
    "sqrt": _fixed(np.sqrt), "square": _fixed(lambda x: x * x),
    "exp": _fixed(np.exp), "log": _fixed(np.log),  # (XLA:CPU's may differ in the last bit)
    "neg": _fixed(np.negative), "abs": _fixed(np.abs), "sign": _fixed(np.sign),
    "floor": _fixed(np.floor), "ceil": _fixed(np.ceil), "round": _round,
    "clamp": _fixed(lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi)),
    "is_finite": _fixed(np.isfinite),
    "eq": _fixed(np.equal), "ne": _fixed(np.not_equal), "lt": _fixed(np.less),
    "le": _fixed(np.less_equal), "gt": _fixed(np.greater), "ge": _fixed(np.greater_equal),
    "and": _fixed(np.bitwise_and), "or": _fixed(np.bitwise_or), "not": _fixed(np.invert),
    "select_n": _fixed(_select_n), "convert_element_type": _convert,
    "broadcast_in_dim": _broadcast_in_dim, "iota": _iota,
    "squeeze": lambda dimensions: (lambda x: np.squeeze(x, axis=tuple(dimensions))),
    "reshape": lambda new_sizes: (lambda x: np.reshape(x, new_sizes)),
    "transpose": lambda permutation: (lambda x: np.transpose(x, permutation)),
    "rev": lambda dimensions: (lambda x: np.flip(x, axis=tuple(dimensions))),
    "concatenate": lambda dimension: (lambda *xs: np.concatenate(xs, axis=dimension)),
    "stack": lambda axis: (lambda *xs: np.stack(xs, axis=axis)), "pad": _pad,
    "slice": _slice, "dynamic_slice": _dynamic_slice, "gather": _gather,
    "reduce_sum": _reduce_sum, "reduce_max": _reduce(np.max), "reduce_min": _reduce(np.min),
    "reduce_or": _reduce(np.bitwise_or.reduce), "reduce_and": _reduce(np.bitwise_and.reduce),
    "argmin": _arg(np.argmin), "argmax": _arg(np.argmax),
    "cumsum": _cumulative(np.cumsum), "cummax": _cumulative(np.maximum.accumulate),
    "cummin": _cumulative(np.minimum.accumulate),
    "scan": lambda **params: _scan(**params),  # a program of its own
}


def _params(prim: str, eqn: Any) -> dict[str, Any]:
    """The JSON-able keyword parameters of ``prim``'s factory, read from ``eqn``.

    Raises:
      Unsupported: a parameter outside what the factory carries out (a sharding, a reshape's
        ``dimensions``, an ``argmin`` over several axes, an extreme over an empty axis).
    """
    p = eqn.params
    if p.get("sharding") is not None or p.get("out_sharding") is not None:
        raise Unsupported(f"{prim} with a sharding")
    ints = lambda xs: [int(x) for x in xs]  # noqa: E731
    if prim == "convert_element_type":
        return {"dtype": np.dtype(p["new_dtype"]).name}
    if prim == "round":
        return {"method": int(p["rounding_method"])}
    if prim == "integer_pow":
        return {"y": int(p["y"])}
    if prim == "broadcast_in_dim":
        return {"shape": ints(p["shape"]), "dims": ints(p["broadcast_dimensions"])}
    if prim == "iota":
        return {"dtype": np.dtype(p["dtype"]).name, "shape": ints(p["shape"]),
                "dimension": int(p["dimension"])}
    if prim in ("reduce_max", "reduce_min", "argmin", "argmax"):
        shape = eqn.invars[0].aval.shape
        if any(shape[a] == 0 for a in p["axes"]):  # (numpy's has no identity; XLA's is ±inf)
            raise Unsupported(f"{prim} over an empty axis")
    if prim in ("reduce_sum", "reduce_max", "reduce_min", "reduce_or", "reduce_and"):
        return {"axes": ints(p["axes"])}
    if prim in ("argmin", "argmax"):
        if len(p["axes"]) != 1:
            raise Unsupported(f"{prim} over {len(p['axes'])} axes")
        return {"axis": int(p["axes"][0]), "index_dtype": np.dtype(p["index_dtype"]).name}
    if prim in ("cumsum", "cummax", "cummin"):
        return {"axis": int(p["axis"]), "reverse": bool(p["reverse"])}
    if prim == "squeeze":
        return {"dimensions": ints(p["dimensions"])}
    if prim == "reshape":
        if p.get("dimensions") is not None:
            raise Unsupported("reshape with dimensions")
        return {"new_sizes": ints(p["new_sizes"])}
    if prim == "transpose":
        return {"permutation": ints(p["permutation"])}
    if prim == "rev":
        return {"dimensions": ints(p["dimensions"])}
    if prim == "concatenate":
        return {"dimension": int(p["dimension"])}
    if prim == "stack":
        return {"axis": int(p["axis"])}
    if prim == "pad":
        return {"config": [ints(c) for c in p["padding_config"]]}
    if prim == "slice":
        return {"start": ints(p["start_indices"]), "limit": ints(p["limit_indices"]),
                "strides": None if p["strides"] is None else ints(p["strides"])}
    if prim == "dynamic_slice":
        return {"sizes": ints(p["slice_sizes"])}
    if prim == "gather":
        return _gather_params(eqn)
    return {}


def _gather_params(eqn: Any) -> dict[str, Any]:
    """The parameters of :func:`_gather` of a ``gather`` equation.

    Raises:
      Unsupported: a mode other than clamping the start indices (``FILL_OR_DROP`` fills
        out-of-range windows instead).
    """
    p = eqn.params
    dn = p["dimension_numbers"]
    mode = getattr(p.get("mode"), "name", None)
    if mode not in ("CLIP", "PROMISE_IN_BOUNDS"):
        raise Unsupported(f"gather in mode {mode}")
    ints = lambda xs: [int(x) for x in xs]  # noqa: E731
    return {"offset_dims": ints(dn.offset_dims),
            "collapsed_slice_dims": ints(dn.collapsed_slice_dims),
            "start_index_map": ints(dn.start_index_map),
            "operand_batching_dims": ints(dn.operand_batching_dims),
            "start_indices_batching_dims": ints(dn.start_indices_batching_dims),
            "slice_sizes": ints(p["slice_sizes"])}


@dataclass(frozen=True)
class Step:
    """One operation: ``prim(*env[ins]) -> env[outs]`` (``params``: the primitive's JSON-able
    parameters)."""

    prim: str
    params: dict[str, Any]
    ins: tuple[int, ...]
    outs: tuple[int, ...]


def _const_json(x: np.ndarray) -> dict[str, Any]:
    """A constant as JSON: its dtype, shape and values (floats as Python floats, which JSON
    writes exactly; NaN and infinities as Python's JSON does)."""
    return {"dtype": x.dtype.name, "shape": list(x.shape), "values": x.ravel().tolist()}


def _const_of(d: dict[str, Any]) -> np.ndarray:
    return np.asarray(d["values"], dtype=d["dtype"]).reshape(d["shape"])


class Program:
    """A flattened program: its arguments' dtypes, constants, steps and output slots.

    Call it with the flat arguments (numpy arrays or scalars, in the traced order; each is
    converted to its traced dtype); it returns the flat outputs as numpy arrays.
    """

    def __init__(self, in_dtypes: Sequence[str], consts: dict[int, np.ndarray],
                 steps: Sequence[Step], outs: Sequence[int], out_dtypes: Sequence[str],
                 n_slots: int):
        self.in_dtypes = tuple(in_dtypes)
        self.n_in = len(self.in_dtypes)
        self.consts = consts
        self.steps = tuple(steps)
        self.outs = tuple(outs)
        self.out_dtypes = tuple(out_dtypes)
        self.n_slots = n_slots
        # each step's function, and the slots whose last reader it is: freed after it runs, so
        # a program holds only its live values (an LLM step's [L, 129] float64 temporaries
        # would otherwise all stay: 300 MB for Llama 3.1 8B's decode step)
        last: dict[int, int] = {}
        for k, st in enumerate(self.steps):
            for i in st.ins:
                last[i] = k
        kept = set(self.outs) | set(self.consts) | set(range(self.n_in))
        self._plan = [(_function(st.prim, st.params), st.ins, st.outs,
                       tuple({i for i in st.ins if last[i] == k and i not in kept}))
                      for k, st in enumerate(self.steps)]

    def __call__(self, *args: Any) -> list[np.ndarray]:
        if len(args) != self.n_in:
            raise TypeError(f"the program takes {self.n_in} arguments, got {len(args)}")
        with np.errstate(all="ignore"):  # XLA's inf and NaN, silently, as the compiled program
            out = self.run([np.asarray(a, dtype=d) for a, d in zip(args, self.in_dtypes)])
        return [np.asarray(v, dtype=d) for v, d in zip(out, self.out_dtypes)]

    def run(self, args: Sequence[Any]) -> list[Any]:
        """The outputs for ``args`` already in their traced dtypes (a scan's body, called once
        per iteration), within the caller's ``np.errstate``."""
        env: list[Any] = [None] * self.n_slots
        env[:self.n_in] = args
        for slot, value in self.consts.items():
            env[slot] = value
        for fn, ins, outs, free in self._plan:
            if len(outs) == 1:
                env[outs[0]] = fn(*[env[i] for i in ins])
            else:
                for o, v in zip(outs, fn(*[env[i] for i in ins])):
                    env[o] = v
            for i in free:
                env[i] = None
        return [env[o] for o in self.outs]

    def to_json(self) -> dict[str, Any]:
        """The program as a JSON-able dict (read back by :meth:`from_json`)."""
        return {"in_dtypes": list(self.in_dtypes), "n_slots": self.n_slots,
                "outs": list(self.outs), "out_dtypes": list(self.out_dtypes),
                "consts": [[k, _const_json(np.asarray(v))] for k, v in sorted(self.consts.items())],
                "steps": [[s.prim, s.params, list(s.ins), list(s.outs)] for s in self.steps]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Program:
        """The program of :meth:`to_json`.

        Raises:
          ValueError: ``d`` names a primitive this module does not carry out.
        """
        steps = []
        for prim, params, ins, outs in d["steps"]:
            if prim not in PRIMITIVES:
                raise ValueError(f"unknown primitive {prim!r}")
            steps.append(Step(prim, params, tuple(int(i) for i in ins),
                              tuple(int(o) for o in outs)))
        consts = {int(k): _const_of(v) for k, v in d["consts"]}
        return cls(d["in_dtypes"], consts, steps, d["outs"], d["out_dtypes"], d["n_slots"])


def _scan(body: dict[str, Any], num_consts: int, num_carry: int, length: int,
          reverse: bool) -> Callable[..., list[np.ndarray]]:
    """``lax.scan``: the body program run ``length`` times, the carry threaded through and
    the per-iteration outputs stacked along a new first axis."""
    program = Program.from_json(body)

    def run(*args: Any) -> list[np.ndarray]:
        consts = list(args[:num_consts])
        carry = list(args[num_consts:num_consts + num_carry])
        xs = [np.asarray(x) for x in args[num_consts + num_carry:]]
        ys: list[list[np.ndarray]] = []
        order = range(length - 1, -1, -1) if reverse else range(length)
        for i in order:
            out = program.run([*consts, *carry, *[x[i] for x in xs]])
            carry, y = out[:num_carry], out[num_carry:]
            ys.append(y)
        if reverse:
            ys.reverse()
        n_y = len(program.outs) - num_carry  # (length >= 1: flatten refuses an empty scan)
        stacked = [np.stack([y[k] for y in ys]).astype(program.out_dtypes[num_carry + k])
                   for k in range(n_y)]
        carry = [np.asarray(c, dtype=d) for c, d in zip(carry, program.out_dtypes)]
        return carry + stacked

    return run


def _function(prim: str, params: dict[str, Any]) -> Callable[..., Any]:
    """The numpy function of one step."""
    return PRIMITIVES[prim](**params)


def flatten(closed: Any) -> Program:
    """The :class:`Program` of a closed jaxpr (``jax.make_jaxpr(fn)(*args)``), its nested
    ``jit`` calls inlined and ``stop_gradient`` dropped.

    Raises:
      Unsupported: the program holds a primitive not in :data:`PRIMITIVES`, a gather that
        fills out-of-range windows, a maximum, minimum or arg-extreme over an empty axis, or a
        scan of length 0.
    """
    from jax.extend import core as jcore

    consts: dict[int, np.ndarray] = {}
    steps: list[Step] = []
    counter = [0]

    def new() -> int:
        counter[0] += 1
        return counter[0] - 1

    def read(v: Any, env: dict[Any, int]) -> int:
        if isinstance(v, jcore.Literal):
            s = new()
            consts[s] = np.asarray(v.val, dtype=getattr(v.aval, "dtype", None))
            return s
        return env[v]

    def walk(jaxpr: Any, env: dict[Any, int]) -> None:
        for eqn in jaxpr.eqns:
            prim = eqn.primitive.name
            ins = [read(v, env) for v in eqn.invars]
            if prim in ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call"):
                # (a custom derivative's primal computation is its call_jaxpr)
                inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
                inner_jaxpr = getattr(inner, "jaxpr", inner)
                sub: dict[Any, int] = {}
                for v, c in zip(inner_jaxpr.constvars, getattr(inner, "consts", ())):
                    s = new()
                    consts[s] = np.asarray(c)
                    sub[v] = s
                for v, s in zip(inner_jaxpr.invars, ins):
                    sub[v] = s
                walk(inner_jaxpr, sub)
                for v, o in zip(eqn.outvars, inner_jaxpr.outvars):
                    env[v] = read(o, sub)
                continue
            if prim in ("stop_gradient", "optimization_barrier") and len(ins) == len(eqn.outvars):
                for v, s in zip(eqn.outvars, ins):
                    env[v] = s
                continue
            if prim == "scan":
                p = eqn.params
                if int(p["length"]) == 0:  # (its stacked outputs' shapes are the body's)
                    raise Unsupported("a scan of length 0")
                outs = tuple(new() for _ in eqn.outvars)
                steps.append(Step("scan", {
                    "body": flatten(p["jaxpr"]).to_json(), "num_consts": int(p["num_consts"]),
                    "num_carry": int(p["num_carry"]), "length": int(p["length"]),
                    "reverse": bool(p["reverse"])}, tuple(ins), outs))
                for v, o in zip(eqn.outvars, outs):
                    env[v] = o
                continue
            if prim not in PRIMITIVES:
                raise Unsupported(f"primitive {prim!r}")
            if len(eqn.outvars) != 1:
                raise Unsupported(f"{prim} with {len(eqn.outvars)} outputs")
            out = new()
            steps.append(Step(prim, _params(prim, eqn), tuple(ins), (out,)))
            env[eqn.outvars[0]] = out

    jaxpr = closed.jaxpr
    env: dict[Any, int] = {}
    for v in jaxpr.invars:
        env[v] = new()
    in_dtypes = [np.dtype(v.aval.dtype).name for v in jaxpr.invars]
    for v, c in zip(jaxpr.constvars, closed.consts):
        s = new()
        consts[s] = np.asarray(c)
        env[v] = s
    walk(jaxpr, env)
    outs = [read(v, env) for v in jaxpr.outvars]
    dtypes = [np.dtype(v.aval.dtype).name for v in jaxpr.outvars]
    return Program(in_dtypes, consts, steps, outs, dtypes, counter[0])
