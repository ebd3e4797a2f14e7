"""The demo's small CNN, written in Flax NNX (the current Flax API)."""

from __future__ import annotations

import jax
from flax import nnx

__all__ = ["DigitsCNN"]


class DigitsCNN(nnx.Module):
    """conv3x3(16)+BN+ReLU -> conv3x3(32)+BN+ReLU -> avgpool 2x2 -> dense(128)+ReLU -> dense(10).

    Input: float32 ``(batch, 8, 8, 1)`` NHWC. Output: float32 ``(batch, 10)`` logits.
    The 512x128 dense layer dominates the weight bytes, so on a bandwidth-limited NPU it is the
    layer where lower weight precision pays off.
    """

    def __init__(self, *, rngs: nnx.Rngs, width: int = 16, hidden: int = 128) -> None:
        self.conv1 = nnx.Conv(1, width, (3, 3), padding="SAME", rngs=rngs)
        self.bn1 = nnx.BatchNorm(width, rngs=rngs)
        self.conv2 = nnx.Conv(width, 2 * width, (3, 3), padding="SAME", rngs=rngs)
        self.bn2 = nnx.BatchNorm(2 * width, rngs=rngs)
        self.fc1 = nnx.Linear(4 * 4 * 2 * width, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.bn1(self.conv1(x)))
        x = nnx.relu(self.bn2(self.conv2(x)))
        x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nnx.relu(self.fc1(x))
        return self.fc2(x)
