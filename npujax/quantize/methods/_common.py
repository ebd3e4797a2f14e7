"""What the PTQ methods share: checked calibration batches, config validation, and a layer's
inputs and outputs on the calibration data (float model, or the partly quantized model)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from npujax.errors import CalibrationError, ConfigError
from npujax.ir.execute import execute, tap
from npujax.ir.graph import Graph, Params

__all__ = ["check_batches", "require", "layer_taps", "copy_params", "waves"]


def check_batches(batches: Sequence[ArrayLike], method: str) -> list[np.ndarray]:
    """The calibration batches as float32 numpy arrays.

    Raises:
      CalibrationError: no batch, an empty batch, or a batch holding NaN or inf.
    """
    out = []
    for i, x in enumerate(batches):
        a = np.asarray(x, np.float32)
        if a.ndim == 0 or a.shape[0] == 0:
            raise CalibrationError(f"{method}: calibration batch {i} is empty (shape "
                                   f"{a.shape}); pass non-empty (batch, ...) arrays.")
        if not np.all(np.isfinite(a)):
            raise CalibrationError(f"{method}: calibration batch {i} holds NaN or inf; clean "
                                   "the data before quantizing.")
        out.append(a)
    if not out:
        raise CalibrationError(f"{method} needs at least one calibration batch; got none.")
    return out


def require(ok: bool, cls: str, field: str, value: Any, rule: str) -> None:
    """Raise ``ConfigError("<cls>.<field> must be <rule>, got <value>.")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{cls}.{field} must be {rule}, got {value!r}.")


def is_number(v: Any) -> bool:
    """A real Python/numpy number that is not a bool."""
    return isinstance(v, int | float | np.floating | np.integer) and not isinstance(v, bool) \
        and bool(np.isfinite(v))


def is_int(v: Any) -> bool:
    """A Python/numpy integer that is not a bool."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def layer_taps(graph: Graph, params: Params, batches: Sequence[np.ndarray], names: Sequence[str],
               quant: Mapping[str, Any] | None = None, qstate: Mapping[str, Any] | None = None
               ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{layer: (input, output)}`` of each layer in ``names`` over all batches (concatenated
    along the batch axis, float32 numpy): the input as the layer reads it (after its own input
    fake-quant where ``quant`` quantizes it), the output after its fused activation.

    Runs the model with ``quant``/``qstate`` (None: the float model), one compiled program.
    """
    names = list(names)
    fn = jax.jit(lambda p, x: execute(graph, p, x, quant=quant, qstate=qstate,
                                      observe=tap(names))[1])
    ins: dict[str, list[np.ndarray]] = {n: [] for n in names}
    outs: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for x in batches:
        rec = jax.device_get(fn(params, jnp.asarray(x)))
        for n in names:
            ins[n].append(np.asarray(rec[n][0], np.float32))
            outs[n].append(np.asarray(rec[n][1], np.float32))
    return {n: (np.concatenate(ins[n]), np.concatenate(outs[n])) for n in names}


def copy_params(params: Params) -> Params:
    """A copy of the params tree (new dicts; arrays shared)."""
    return {k: dict(v) for k, v in params.items()}


def waves(graph: Graph, names: Sequence[str]) -> list[list[str]]:
    """``names`` grouped for a sequential layer-by-layer method: wave ``k`` holds the layers
    whose inputs depend on layers of ``names`` in waves ``< k`` only (Q, K and V projections,
    which read one tensor, share a wave), in graph order. One run of the model then gives the
    inputs of a whole wave, with every earlier wave quantized."""
    wanted = set(names)
    producer = {t: n for n in graph.nodes for t in n.outputs}
    level: dict[str, int] = {}  # node -> 1 + the wave of the latest wanted layer upstream
    for n in graph.nodes:
        up = 0
        for t in n.inputs:
            p = producer.get(t)
            if p is not None:
                up = max(up, level[p.name] + (1 if p.name in wanted else 0))
        level[n.name] = up
    out: dict[int, list[str]] = {}
    for n in graph.nodes:
        if n.name in wanted:
            out.setdefault(level[n.name], []).append(n.name)
    return [out[k] for k in sorted(out)]
