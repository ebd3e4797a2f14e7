"""The demo's small CNN, written in Flax NNX (the current Flax API)."""

from __future__ import annotations

import jax
from flax import nnx

__all__ = ["DigitsCNN", "LeNet", "SmallResNet", "ResidualBlock"]


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


class LeNet(nnx.Module):
    """LeNet-5-style CNN: [conv5x5+BN+ReLU -> maxpool 2x2] x 2 -> dense 120 -> 84 -> 10.

    Works for any input ``(batch, H, W, C)`` with ``H, W`` divisible by 4 (8x8 digits, 28x28
    MNIST); BatchNorm after each conv, so BN folding is part of every quantization flow.
    """

    def __init__(self, *, rngs: nnx.Rngs, in_shape: tuple[int, int, int] = (28, 28, 1),
                 widths: tuple[int, int] = (6, 16)) -> None:
        h, w, c = in_shape
        self.conv1 = nnx.Conv(c, widths[0], (5, 5), padding="SAME", rngs=rngs)
        self.bn1 = nnx.BatchNorm(widths[0], rngs=rngs)
        self.conv2 = nnx.Conv(widths[0], widths[1], (5, 5), padding="SAME", rngs=rngs)
        self.bn2 = nnx.BatchNorm(widths[1], rngs=rngs)
        self.fc1 = nnx.Linear((h // 4) * (w // 4) * widths[1], 120, rngs=rngs)
        self.fc2 = nnx.Linear(120, 84, rngs=rngs)
        self.fc3 = nnx.Linear(84, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.max_pool(nnx.relu(self.bn1(self.conv1(x))), (2, 2), strides=(2, 2))
        x = nnx.max_pool(nnx.relu(self.bn2(self.conv2(x))), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nnx.relu(self.fc1(x))
        x = nnx.relu(self.fc2(x))
        return self.fc3(x)


class ResidualBlock(nnx.Module):
    """conv3x3+BN+ReLU -> conv3x3+BN, plus the identity, then ReLU (He et al. 2016)."""

    def __init__(self, width: int, *, rngs: nnx.Rngs) -> None:
        self.conv_a = nnx.Conv(width, width, (3, 3), padding="SAME", rngs=rngs)
        self.bn_a = nnx.BatchNorm(width, rngs=rngs)
        self.conv_b = nnx.Conv(width, width, (3, 3), padding="SAME", rngs=rngs)
        self.bn_b = nnx.BatchNorm(width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.bn_a(self.conv_a(x)))
        return nnx.relu(x + self.bn_b(self.conv_b(y)))


class SmallResNet(nnx.Module):
    """ResNet-style CNN: stem conv3x3 (stride 2 for 28x28) -> 2 residual blocks -> avgpool -> dense.

    Input ``(batch, H, W, C)``; output 10 logits.
    """

    def __init__(self, *, rngs: nnx.Rngs, in_shape: tuple[int, int, int] = (28, 28, 1),
                 width: int = 16) -> None:
        h, w, c = in_shape
        self.stride = 2 if h >= 16 else 1
        self.stem = nnx.Conv(c, width, (3, 3), strides=self.stride, padding="SAME", rngs=rngs)
        self.bn = nnx.BatchNorm(width, rngs=rngs)
        self.block1 = ResidualBlock(width, rngs=rngs)
        self.block2 = ResidualBlock(width, rngs=rngs)
        hs, ws = -(-h // self.stride) // 2, -(-w // self.stride) // 2
        self.head = nnx.Linear(hs * ws * width, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.bn(self.stem(x)))
        x = self.block2(self.block1(x))
        x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
        return self.head(x.reshape(x.shape[0], -1))
