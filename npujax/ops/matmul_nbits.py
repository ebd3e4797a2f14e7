"""onnxruntime's ``com.microsoft.MatMulNBits``: a MatMul by block-quantized N-bit weights.

``Y = A @ dequant(B)ᵀ (+ bias)``, ``dequant(B)[n, k] = (q[n, k] - zero_point[n, k // block]) *
scale[n, k // block]``, as onnxruntime's contrib-operator specification states it
(``docs/ContribOperators.md``, ``com.microsoft.MatMulNBits``):

* ``B``: uint8 ``[N, k_blocks, block_size * bits / 8]``, ``k_blocks = ceil(K / block_size)``,
  the unsigned ``bits``-bit codes (2 to 8) of each block packed low bits first (for 4 bits:
  element ``2i`` in the low nibble of byte ``i``); the last block is padded when ``block_size``
  does not divide ``K``.
* ``scales``: ``[N, k_blocks]`` (or flattened), the type of ``A``.
* ``zero_points``: packed uint8 ``[N, ceil(k_blocks * bits / 8)]`` (or flattened), packed like
  ``B``, or unpacked ``[N, k_blocks]`` in the type of ``A``; absent: ``2^(bits - 1)`` (8 for
  4 bits).
* ``g_idx`` (deprecated) is refused; ``bias [N]`` is added. ``accuracy_level`` only lets
  onnxruntime compute in lower precision; npujax computes in float32, as level 0 does.

The weights are dequantized at import into a float32 ``Gemm`` kernel ``[K, N]`` (exactly: a
code minus its zero point times its scale, rounded once), so the layer is an ordinary weight
layer: executed, quantized, searched and costed as any Gemm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from npujax.errors import GraphError, UnsupportedOpError
from npujax.ops.registry import onnx_importer

__all__ = ["unpack_codes", "dequantize_nbits"]


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` unsigned ``bits``-bit codes packed low bits first along the last
    axis of the uint8 array ``packed``, as int64.

    Example:
      >>> unpack_codes(np.array([0x21, 0x03], np.uint8), 4, 3)
      array([1, 2, 3])
    """
    b = np.unpackbits(packed, axis=-1, bitorder="little")
    n = b.shape[-1] // bits
    b = b[..., :n * bits].reshape(*packed.shape[:-1], n, bits).astype(np.int64)
    return (b << np.arange(bits)).sum(-1)[..., :count]


def dequantize_nbits(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *,
                     k: int, n: int, bits: int, block_size: int, where: str) -> np.ndarray:
    """``MatMulNBits``' weights ``[N, K]`` in float32 (module docstring).

    Raises:
      GraphError: inputs whose shapes do not match ``K``, ``N``, ``bits`` and ``block_size``.
    """
    nb = -(-k // block_size)
    blob = block_size * bits // 8
    if list(b.shape) != [n, nb, blob] or b.dtype != np.uint8:
        raise GraphError(f"{where}: B is {b.dtype} {list(b.shape)}; with K={k}, N={n}, "
                         f"bits={bits}, block_size={block_size} it must be uint8 "
                         f"[{n}, {nb}, {blob}].")
    if scales.size != n * nb:
        raise GraphError(f"{where}: scales has shape {list(scales.shape)}; it must be "
                         f"[{n}, {nb}].")
    codes = unpack_codes(b, bits, block_size).reshape(n, nb * block_size)[:, :k]
    s = np.repeat(scales.reshape(n, nb).astype(np.float32), block_size, axis=1)[:, :k]
    if zero_points is None:
        zp = np.full((n, nb), 2 ** (bits - 1), np.float32)
    elif zero_points.dtype == np.uint8:
        per_row = -(-nb * bits // 8)
        if zero_points.size != n * per_row:
            raise GraphError(f"{where}: packed zero_points has shape "
                             f"{list(zero_points.shape)}; it must be [{n}, {per_row}] "
                             f"(ceil(k_blocks * bits / 8) bytes per row).")
        zp = unpack_codes(zero_points.reshape(n, per_row), bits, nb).astype(np.float32)
    else:
        if zero_points.size != n * nb:
            raise GraphError(f"{where}: zero_points has shape {list(zero_points.shape)}; "
                             f"unpacked, it must be [{n}, {nb}].")
        zp = zero_points.reshape(n, nb).astype(np.float32)
    zp = np.repeat(zp, block_size, axis=1)[:, :k]
    return ((codes.astype(np.float32) - zp) * s).astype(np.float32)


@onnx_importer("MatMulNBits", domain="com.microsoft")
def _import(ctx: Any, node: Any, a: Mapping[str, Any]) -> None:
    where = f"MatMulNBits node {ctx.node_name!r}"
    ins = list(node.input) + [""] * (6 - len(node.input))
    if ins[4]:
        raise UnsupportedOpError(f"{where} has a g_idx input (deprecated), which npujax does "
                                 "not import; requantize the model without act-order.")
    try:
        k, n, bits, block = int(a["K"]), int(a["N"]), int(a.get("bits", 4)), int(a["block_size"])
    except KeyError as e:
        raise GraphError(f"{where} lacks the required attribute {e.args[0]!r}.") from None
    if not 2 <= bits <= 8 or block < 1 or block * bits % 8:
        raise GraphError(f"{where}: bits={bits}, block_size={block}; bits must be 2 to 8 and "
                         "block_size * bits a whole number of bytes.")
    x = ctx.shape(ins[0])
    if not x or x[-1] != k:
        raise GraphError(f"{where}: its input A has shape {list(x)}; its last dimension must "
                         f"be K={k}.")
    w = dequantize_nbits(ctx.const(ins[1], "weight B"), ctx.const(ins[2], "scales"),
                         ctx.const(ins[3], "zero_points") if ins[3] else None,
                         k=k, n=n, bits=bits, block_size=block, where=where)
    params = {"kernel": w.T}
    if ins[5]:
        bias = ctx.const(ins[5], "bias")
        if bias.size != n:
            raise GraphError(f"{where}: bias has shape {list(bias.shape)}; it must be [{n}].")
        params["bias"] = bias.reshape(n).astype(np.float32)
    ctx.emit("Gemm", [ins[0]], [node.output[0]], {}, params)
