"""Where PP-OCRv4 rec's QDQ drift starts, as ``npujax quantize``'s check sees it (issue 29).

Usage: PYTHONPATH=. python experiments/transformer_quant/ppocr_rec_tie_start.py

Calibrates W8A8 as tests/integration/test_ppocr_rec.py does (4 lines, seed 3), exports the
like-for-like QDQ model (float biases, no output requantization) and, on each of 3 lines (seed
11), runs :func:`npujax.backends.ort_check.qdq_pair_mismatches` with npujax's fake-quantized
layer inputs as the reference. Prints per line: the pairs, the values that differ
teacher-forced and the values compared, and the first pair whose output differs end to end
``(name, sorted values that differ, values, largest difference in grid steps)``: a rounding
tie shows as 1 value, 1 step (what ``npujax quantize`` accepts, ``TIE_FLIPS``). Then the CPU
seconds of the whole script.
"""

import resource

import jax
import numpy as np

from npujax.backends.onnx_export import to_onnx
from npujax.backends.ort_check import qdq_pair_mismatches
from npujax.frontends.onnx import from_onnx
from npujax.ir.execute import execute, tap
from npujax.ir.passes import optimize
from npujax.quantize.calibrate import calibrate
from npujax.quantize.spec import quant_spec
from tests.onnx_models import text_images, zoo_path


def main() -> None:
    graph, params = optimize(*from_onnx(zoo_path("ppocr_rec"), {"x": (1, 3, 48, 320)},
                                        unsupported="error"))
    q = quant_spec(graph)
    qstate = calibrate(graph, params, [text_images(48, 320, 4, seed=3, fit=True)], q)
    x = text_images(48, 320, 3, seed=11, fit=True)
    model = to_onnx(graph, params, q, qstate, int32_bias=False,
                    requantize_outputs=False).SerializeToString()
    run = jax.jit(lambda p, s, xb: execute(graph, p, xb, quant=q, qstate=s,
                                           observe=tap(list(q))))
    for i in range(len(x)):
        xi = x[i:i + 1]
        _, taps = run(params, qstate, xi)
        ref = {f"{n}/{w}_quant": np.asarray(t[j]) for n, t in taps.items()
               for j, w in ((0, "act"), (2, "operand")) if j < len(t)}
        r = qdq_pair_mismatches(model, graph, q, qstate, {"x": xi}, reference=ref)
        print(f"line {i}: {len(r.pairs)} pairs, teacher-forced {r.mismatches} of {r.values} "
              f"differ; drift starts at {r.first_divergence}", flush=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"CPU s: {ru.ru_utime + ru.ru_stime:.1f}")


if __name__ == "__main__":
    main()
