"""Data parallelism for QAT and the precision search: batches sharded over a ``Mesh``.

The same mechanism as the design-space sweep (:mod:`npujax.explore.sweep`), on the batch axis
instead of the configuration axis: a one-axis ``jax.sharding.Mesh`` named ``data`` over the
chosen devices, every batch placed with ``NamedSharding(mesh, P("data"))`` (split on its
leading axis), params, optimizer and quantizer state replicated (``P()``), and the unchanged
jitted step: XLA's SPMD partitioner (GSPMD, Xu et al. 2021, arXiv:2105.04663) turns the batch
mean of the loss into per-device partial sums plus an all-reduce, so every device holds the same
updated params after each step. Nothing in the model or the loss is rewritten, and the same code
runs on one CPU, several host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``)
or several GPUs (``jax.devices()``).

The same placement serves a quantized Flax model trained in the user's own ``nnx.jit`` loop
(:func:`npujax.quantize_model`)::

    dp = data_parallel("all")
    nnx.update(qmodel, dp.replicate(nnx.state(qmodel)))
    nnx.update(optimizer, dp.replicate(nnx.state(optimizer)))
    loss = step(qmodel, optimizer, dp.shard(xb), dp.shard(yb))  # the unchanged nnx.jit step

A data-parallel step computes the same function as a one-device step on the same global batch;
the values agree to float rounding only, because the batch sum is reduced in a different order
(per-device partial sums, then across devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from npujax.errors import ConfigError

__all__ = ["Devices", "DataParallel", "data_parallel"]

T = TypeVar("T")

#: What a ``devices`` option accepts: None (one device, no mesh), ``"all"`` (every local
#: device), a count (the first N local devices) or explicit ``jax.Device`` objects.
Devices = None | str | int | Sequence[Any]


class DataParallel:
    """Places batches sharded and state replicated over a one-axis ``data`` mesh.

    Attributes:
      mesh: the ``Mesh`` with the single axis ``data``.
      size: the number of devices (the divisor every global batch must respect).
    """

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.size = int(mesh.devices.size)
        self._batch = NamedSharding(mesh, P("data"))
        self._replicated = NamedSharding(mesh, P())

    def replicate(self, tree: T) -> T:
        """Every array leaf of ``tree`` copied onto every device (``P()``)."""
        return jax.device_put(tree, self._replicated)

    def check(self, n: int, what: str = "batch") -> None:
        """Refuse a global batch of ``n`` examples that does not split evenly.

        Raises:
          ConfigError: ``n`` is not a multiple of ``size`` (names ``what``, ``n``, the
            device count and a batch that would work).
        """
        if n % self.size:
            raise ConfigError(
                f"the {what} of {n} examples does not split evenly over {self.size} devices; "
                f"use a global {what} that is a multiple of {self.size} (e.g. "
                f"{max(self.size, n - n % self.size)}) or a device count that divides {n}.")

    def shard(self, tree: T, what: str = "batch") -> T:
        """Every array leaf of ``tree`` split on its leading (batch) axis over the devices.

        Raises:
          ConfigError: a leaf whose leading dimension is not a multiple of ``size``.
        """
        for leaf in jax.tree.leaves(tree):
            self.check(int(np.shape(leaf)[0]) if np.ndim(leaf) else 0, what)
        return jax.device_put(tree, self._batch)


def data_parallel(devices: Devices) -> DataParallel | None:
    """The data-parallel placement over ``devices``, or None for the plain one-device path.

    Args:
      devices: None (one device: no mesh, the code path of a single-device run), ``"all"``
        (every ``jax.local_devices()``), a count N (the first N local devices) or a sequence of
        ``jax.Device``.

    Returns:
      A :class:`DataParallel`, or None when ``devices`` is None.

    Raises:
      ConfigError: an unknown string, a count < 1 or above the local device count, or an empty
        device list.
    """
    if devices is None:
        return None
    local = jax.local_devices()
    if isinstance(devices, str):
        if devices != "all":
            raise ConfigError(f"devices must be 'all', a count or a list of jax devices, got "
                              f"{devices!r}.")
        devs = local
    elif isinstance(devices, int) and not isinstance(devices, bool):
        if not 1 <= devices <= len(local):
            raise ConfigError(f"devices={devices} but this process has {len(local)} local "
                              f"device(s) ({local[0].platform}); use 1..{len(local)} or 'all'.")
        devs = local[:devices]
    elif isinstance(devices, Sequence):
        devs = list(devices)
        if not devs:
            raise ConfigError("devices is an empty list; pass None, 'all', a count or devices.")
    else:
        raise ConfigError(f"devices must be None, 'all', a count or a list of jax devices, got "
                          f"{devices!r}.")
    return DataParallel(Mesh(np.asarray(devs, dtype=object), ("data",)))
