"""How far the QDQ file `npujax quantize` writes is from npujax's fake-quant, in onnxruntime.

For the digits CNN of `npujax demo` (its model.npz), at W8A8, W4A4 and W3A3 (min-max calibration
on 256 training images, bias correction), the file is run at the four graph optimization levels
on the 360 held-out digits, and the largest |onnxruntime - fake-quant| is printed against:

* fake-quant with the float biases (what `execute` computes from the calibrated params);
* fake-quant with the file's int32 biases (`exported_biases`), the reference `npujax quantize`
  checks against (`npujax.workflows.quantize.ORT_TOLERANCE`);

each without and with `requantize_outputs`. The figures quoted in docs/quant.md come from this
script.

    npujax demo --out runs/demo
    python experiments/quantize_ort_check.py runs/demo/model.npz
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from npujax.backends.onnx_export import exported_biases, to_onnx
from npujax.backends.ort_check import run_onnxruntime_levels
from npujax.ir.execute import execute
from npujax.quantize.ptq import ptq
from npujax.quantize.spec import quant_spec
from npujax.workflows.inputs import load_model_and_data


def main(model: str) -> None:
    m = load_model_and_data(model, data="digits", calibrate_act_bits=None)
    g, p, x = m.graph, m.params, m.x_test
    batches = [m.x_train[i:i + 64] for i in range(0, 256, 64)]
    print(f"{len(x)} held-out digits; max |float logit| "
          f"{float(np.abs(np.asarray(execute(g, p, x))).max()):.1f}")
    print("bits  requant  reference        max|ORT - fake-quant| per level (DISABLE, BASIC, "
          "EXTENDED, ALL)   top-1 agreement")
    for bits in (8, 4, 3):
        q = quant_spec(g, bits, bits)
        params, qstate = ptq(g, p, batches, q)
        run = jax.jit(lambda pp, s: execute(g, pp, x, quant=q, qstate=s))  # noqa: B023
        for requant in (False, True):
            model_bytes = to_onnx(g, params, q, qstate, requantize_outputs=requant
                                  ).SerializeToString()
            outs = run_onnxruntime_levels(model_bytes, {g.inputs[0]: x})
            biases = exported_biases(model_bytes)
            written = {k: ({**v, "bias": jnp.asarray(biases[k])} if k in biases else v)
                       for k, v in params.items()}
            for label, pp in (("float biases", params), ("file's biases", written)):
                want = np.asarray(run(pp, qstate))
                diffs = [float(np.abs(y[0] - want).max()) for y in outs.values()]
                agree = min(float(np.mean(y[0].argmax(1) == want.argmax(1)))
                            for y in outs.values())
                print(f"W{bits}A{bits}  {str(requant):7s}  {label:15s}  "
                      + ", ".join(f"{d:.2g}" for d in diffs) + f"   {100 * agree:.1f} %")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo/model.npz")
