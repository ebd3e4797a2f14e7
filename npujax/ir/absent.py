"""Weights known by their shape and dtype only: what lowering from shapes needs, never allocated.

A model lowered for its latency needs the shapes of its weights, not their values: an ONNX
model whose external-data files are absent (``from_onnx(..., weights="shapes")``, ZigZag's
shipped workloads), or an LLM decoder lowered without weights. Materialising zeros for them
cost memory for nothing (a 637 MB weight peaked at 1.6 GB; an LLM's ``lm_head`` was refused by
the 1 GiB tensor limit). An :class:`AbsentArray` stands for such a weight through import,
:func:`npujax.optimize`, :func:`npujax.plan.workloads` and :func:`npujax.lower`:

* it has ``shape``, ``dtype``, ``ndim``, ``size`` and ``nbytes``, and the numpy operations
  importers and passes apply to weights (``astype``, ``reshape``, ``transpose``/``.T``,
  indexing, arithmetic, numpy functions and ufuncs) give another :class:`AbsentArray` of the
  result's shape and dtype, computed abstractly by the same ``jax.numpy`` function under
  :func:`jax.eval_shape` (64-bit types kept): no element is ever stored;
* :func:`apply` runs a JAX function of pytrees that hold absent leaves abstractly (a fold of
  BatchNormalization into its kernel);
* anything that needs values refuses with a :class:`~npujax.errors.GraphError` naming the
  weight: ``np.asarray``/``jnp.asarray``, ``float()``, ``tolist()``, :func:`npujax.execute`
  (the graph's ``source`` is :data:`~npujax.ir.graph.SHAPES_ONLY_SOURCE`), export.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from npujax.errors import GraphError

__all__ = ["AbsentArray", "is_absent", "any_absent", "apply", "bind", "shapes_only"]


class AbsentArray:
    """A weight of ``shape`` and ``dtype`` whose values are absent (see the module docstring).

    Args:
      shape: the weight's shape.
      dtype: its dtype.
      what: what it is, for messages (``"initializer 'w' (w.bin)"``).
    """

    __array_priority__ = 1000  # numpy defers binary operators to ours

    def __init__(self, shape: Any, dtype: Any, what: str = "a weight") -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.what = what

    # -- what an array's metadata says
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=object))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"AbsentArray({self.shape}, {self.dtype}, {self.what!r})"

    # -- what needs values: refused
    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise GraphError(
            f"{self.what} was imported for its shape only (its data are absent: an ONNX "
            "external-data file missing, or a model lowered without weights); this needs its "
            "values. Place the data next to the model and import it again.")

    __array__ = __float__ = __int__ = __bool__ = __index__ = __iter__ = _refuse
    tolist = item = tobytes = __jax_array__ = _refuse

    # -- shape computations: the same jax.numpy function, abstractly
    def _op(self, name: str, *args: Any, **kwargs: Any) -> AbsentArray:
        return _abstract(getattr(jnp, name), (self, *args), kwargs, self.what)

    def astype(self, dtype: Any, copy: bool = True) -> AbsentArray:
        return AbsentArray(self.shape, dtype, self.what)

    def reshape(self, *shape: Any, **kwargs: Any) -> AbsentArray:
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return self._op("reshape", tuple(shape), **kwargs)

    def transpose(self, *axes: Any) -> AbsentArray:
        axes = axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes
        return self._op("transpose", tuple(axes) if axes else None)

    @property
    def T(self) -> AbsentArray:  # noqa: N802  (numpy's name)
        return self.transpose()

    def squeeze(self, axis: Any = None) -> AbsentArray:
        return self._op("squeeze", axis)

    def swapaxes(self, a: int, b: int) -> AbsentArray:
        return self._op("swapaxes", a, b)

    def sum(self, axis: Any = None, **kwargs: Any) -> AbsentArray:
        return self._op("sum", axis, **kwargs)

    def copy(self) -> AbsentArray:
        return self

    def __neg__(self) -> AbsentArray:
        return self._op("negative")

    def __abs__(self) -> AbsentArray:
        return self._op("abs")

    def __getitem__(self, index: Any) -> AbsentArray:
        return _abstract(lambda x: x[index], (self,), {}, self.what)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        fn = getattr(jnp, ufunc.__name__, None)
        if method != "__call__" or fn is None or kwargs.get("out") is not None:
            return self._refuse()
        return _abstract(fn, inputs, kwargs, self.what)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func.__name__ in ("ascontiguousarray", "asfortranarray", "copy"):
            return args[0]  # (memory layout: nothing to do for values that are not stored)
        fn = getattr(jnp, func.__name__, None)
        if fn is None:
            return self._refuse()
        return _abstract(fn, args, kwargs, self.what)


def _binary(name: str, reflected: bool = False) -> Callable[..., AbsentArray]:
    def op(self: AbsentArray, other: Any) -> AbsentArray:
        fn = getattr(jnp, name)
        args = (other, self) if reflected else (self, other)
        return _abstract(fn, args, {}, self.what)
    return op


for _name, _fn in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                   ("truediv", "true_divide"), ("floordiv", "floor_divide"), ("pow", "power"),
                   ("matmul", "matmul"), ("mod", "remainder")):
    setattr(AbsentArray, f"__{_name}__", _binary(_fn))
    setattr(AbsentArray, f"__r{_name}__", _binary(_fn, reflected=True))


def is_absent(x: Any) -> bool:
    """Whether ``x`` is an :class:`AbsentArray`."""
    return isinstance(x, AbsentArray)


def any_absent(tree: Any) -> bool:
    """Whether a pytree (params) holds an :class:`AbsentArray` leaf."""
    return any(is_absent(v) for v in jax.tree.leaves(tree, is_leaf=is_absent))


def _spec(x: Any) -> Any:
    return jax.ShapeDtypeStruct(x.shape, x.dtype) if is_absent(x) else x


def _abstract(fn: Callable[..., Any], args: Any, kwargs: Any, what: str) -> Any:
    """``fn(*args, **kwargs)`` computed abstractly (absent leaves as shapes), as absent
    arrays."""
    args, kwargs = jax.tree.map(_spec, (tuple(args), dict(kwargs)), is_leaf=is_absent)
    leaves, tree = jax.tree.flatten((args, kwargs), is_leaf=is_absent)
    arrays = [i for i, v in enumerate(leaves) if isinstance(v, jax.ShapeDtypeStruct)]

    def run(*xs: Any) -> Any:
        full = list(leaves)
        for i, x in zip(arrays, xs):
            full[i] = x
        a, k = jax.tree.unflatten(tree, full)
        return fn(*a, **k)

    # numpy's dtypes and promotion (a float64 constant stays float64 and mixes with float32)
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        out = jax.eval_shape(run, *[leaves[i] for i in arrays])
    return jax.tree.map(lambda s: AbsentArray(s.shape, s.dtype, what), out)


def apply(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or, when an argument holds an :class:`AbsentArray` leaf, its
    result computed abstractly as absent arrays (every output leaf then absent).

    ``fn`` is a JAX function of pytrees (e.g. a jitted fold); ``kwargs`` are static.
    """
    if not any_absent(args):
        return fn(*args, **kwargs)
    what = next(v.what for v in jax.tree.leaves(args, is_leaf=is_absent) if is_absent(v))
    specs = jax.tree.map(_spec, args, is_leaf=is_absent)
    out = jax.eval_shape(lambda *a: fn(*a, **kwargs), *specs)
    return jax.tree.map(lambda s: AbsentArray(s.shape, s.dtype, what), out)


def shapes_only(params: Any) -> Any:
    """``params`` (a pytree of arrays) with every leaf an :class:`AbsentArray` of its shape and
    dtype: for passes whose result is used for its structure only (lowering), which then fold
    the weights abstractly (:func:`apply`) instead of computing them."""
    def absent(x: Any) -> AbsentArray:
        if is_absent(x):
            return x
        dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        return AbsentArray(np.shape(x), dtype, "a weight imported for its shape only (lowering)")

    return jax.tree.map(absent, params, is_leaf=is_absent)


def bind(prim: Any, args: list[Any], params: dict[str, Any], what: str) -> list[AbsentArray]:
    """The outputs of the JAX primitive ``prim`` on ``args`` (some absent), as absent arrays
    (a traced model's constant folding: :mod:`npujax.frontends.flax`)."""
    specs = [_spec(a) for a in args]
    out = jax.eval_shape(lambda *a: prim.bind(*a, **params), *specs)
    out = out if prim.multiple_results else [out]
    return [AbsentArray(o.shape, o.dtype, what) for o in out]
