"""YOLOv8n's architecture in Flax NNX, for the pipeline example (random weights: the latency
model needs only shapes).

Layer by layer as ultralytics' ``yolov8.yaml`` at the ``n`` scale (depth 0.33, width 0.25, max
channels 1024; Jocher, Chaurasia and Qiu, "Ultralytics YOLOv8", 2023): the CSP backbone of
Conv (3x3, stride 2) and C2f blocks, SPPF, the PAN neck (nearest upsampling, concatenation,
C2f) and the decoupled Detect head at strides 8, 16 and 32. Every Conv is conv + BatchNorm +
SiLU. The output is the head's raw ``[1, 4 x 16 + 80, 8400]`` (the DFL box bins and the class
logits of 80 x 80 + 40 x 40 + 20 x 20 anchors at 640 x 640); the DFL decoding and the sigmoid
run with NMS on the host here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class Conv(nnx.Module):
    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(cin, cout, (k, k), strides=(s, s), padding="SAME", use_bias=False,
                             rngs=rngs)
        self.bn = nnx.BatchNorm(cout, rngs=rngs)

    def __call__(self, x):
        return nnx.silu(self.bn(self.conv(x)))


class Bottleneck(nnx.Module):
    def __init__(self, c: int, shortcut: bool, *, rngs: nnx.Rngs):
        self.cv1, self.cv2, self.add = Conv(c, c, 3, rngs=rngs), Conv(c, c, 3, rngs=rngs), shortcut

    def __call__(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nnx.Module):
    def __init__(self, cin: int, cout: int, n: int, shortcut: bool, *, rngs: nnx.Rngs):
        self.c = cout // 2
        self.cv1 = Conv(cin, 2 * self.c, rngs=rngs)
        self.cv2 = Conv((2 + n) * self.c, cout, rngs=rngs)
        self.m = nnx.List([Bottleneck(self.c, shortcut, rngs=rngs) for _ in range(n)])

    def __call__(self, x):
        y = self.cv1(x)
        ys = [y[..., :self.c], y[..., self.c:]]
        for b in self.m:
            ys.append(b(ys[-1]))
        return self.cv2(jnp.concatenate(ys, axis=-1))


class SPPF(nnx.Module):
    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs):
        self.cv1, self.cv2 = Conv(cin, cin // 2, rngs=rngs), Conv(cin * 2, cout, rngs=rngs)

    def __call__(self, x):
        x = self.cv1(x)
        pool = lambda t: nnx.max_pool(t, (5, 5), strides=(1, 1), padding="SAME")  # noqa: E731
        y1 = pool(x)
        y2 = pool(y1)
        return self.cv2(jnp.concatenate([x, y1, y2, pool(y2)], axis=-1))


def _up(x):
    """Nearest 2x upsampling (as a broadcast and a reshape: the traced graph's Resize)."""
    n, h, w, c = x.shape
    y = jnp.broadcast_to(x[:, :, None, :, None, :], (n, h, 2, w, 2, c))
    return y.reshape(n, 2 * h, 2 * w, c)


class YOLOv8n(nnx.Module):
    """Input float32 ``(1, 640, 640, 3)`` NHWC; output ``(1, 144, 8400)``."""

    def __init__(self, *, rngs: nnx.Rngs, classes: int = 80, reg_max: int = 16):
        r = rngs
        self.b0, self.b1 = Conv(3, 16, 3, 2, rngs=r), Conv(16, 32, 3, 2, rngs=r)
        self.b2, self.b3 = C2f(32, 32, 1, True, rngs=r), Conv(32, 64, 3, 2, rngs=r)
        self.b4, self.b5 = C2f(64, 64, 2, True, rngs=r), Conv(64, 128, 3, 2, rngs=r)
        self.b6, self.b7 = C2f(128, 128, 2, True, rngs=r), Conv(128, 256, 3, 2, rngs=r)
        self.b8, self.b9 = C2f(256, 256, 1, True, rngs=r), SPPF(256, 256, rngs=r)
        self.h12 = C2f(384, 128, 1, False, rngs=r)
        self.h15 = C2f(192, 64, 1, False, rngs=r)
        self.h16, self.h18 = Conv(64, 64, 3, 2, rngs=r), C2f(192, 128, 1, False, rngs=r)
        self.h19, self.h21 = Conv(128, 128, 3, 2, rngs=r), C2f(384, 256, 1, False, rngs=r)
        c2, c3 = max(16, 64 // 4, 4 * reg_max), max(64, min(classes, 100))
        self.box = nnx.List([nnx.Sequential(Conv(c, c2, 3, rngs=r), Conv(c2, c2, 3, rngs=r),
                                            nnx.Conv(c2, 4 * reg_max, (1, 1), rngs=r))
                             for c in (64, 128, 256)])
        self.cls = nnx.List([nnx.Sequential(Conv(c, c3, 3, rngs=r), Conv(c3, c3, 3, rngs=r),
                                            nnx.Conv(c3, classes, (1, 1), rngs=r))
                             for c in (64, 128, 256)])

    def __call__(self, x):
        x = self.b1(self.b0(x))
        p3 = self.b4(self.b3(self.b2(x)))
        p4 = self.b6(self.b5(p3))
        p5 = self.b9(self.b8(self.b7(p4)))
        n4 = self.h12(jnp.concatenate([_up(p5), p4], axis=-1))
        n3 = self.h15(jnp.concatenate([_up(n4), p3], axis=-1))
        n4 = self.h18(jnp.concatenate([self.h16(n3), n4], axis=-1))
        n5 = self.h21(jnp.concatenate([self.h19(n4), p5], axis=-1))
        outs = []
        for f, bx, cl in zip((n3, n4, n5), self.box, self.cls):
            y = jnp.concatenate([bx(f), cl(f)], axis=-1)
            outs.append(y.reshape(y.shape[0], -1, y.shape[-1]))
        return jnp.transpose(jnp.concatenate(outs, axis=1), (0, 2, 1))


def yolov8n_graph(size: int = 640):
    """The optimized npujax graph of :class:`YOLOv8n` at ``size x size``."""
    from npujax.frontends.flax import trace_flax
    from npujax.ir.passes import optimize

    with jax.numpy_dtype_promotion("standard"):
        g, p = trace_flax(YOLOv8n(rngs=nnx.Rngs(0)), jnp.zeros((1, size, size, 3), jnp.float32))
    return optimize(g, p)[0]
