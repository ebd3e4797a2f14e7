"""Keras applications traced by ``npujax.trace_keras``: nodes, MACs, parameters, trace time.

Usage:  python experiments/keras_models.py [--npu edge_16x16] [MODEL ...]

Each model (``keras.applications.NAME``, random seeded weights, no network) is built, traced
at batch 1 and its default input size with the check against Keras' own output, optimized
(BN folded, activations fused) and lowered at INT8 on ``--npu``. The table gives the graph's
nodes (as traced and optimized), the MACs the latency model counts, the parameters (Keras'
``count_params``, which includes the BatchNorm statistics, as the published figures do; and
the weights of the optimized graph), the build and trace seconds and the latency. Published
figures to compare with: ResNet50 4.1 GMACs, 25.6 M parameters (He et al. 2016; Keras'
documentation); MobileNetV2 300 M MACs, 3.5 M parameters (Sandler et al. 2018, Table 4);
MobileNet 569 M MACs, 4.2 M parameters (Howard et al. 2017, Table 8); VGG16 15.5 GMACs,
138 M parameters; InceptionV3 5.7 GMACs at 299x299, 23.9 M parameters.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from npujax import load_npu_spec, lower, optimize
from npujax.frontends.keras import keras_application, trace_keras

MODELS = ["MobileNet", "MobileNetV2", "ResNet50", "ResNet50V2", "ResNet152V2", "InceptionV3",
          "InceptionResNetV2", "DenseNet121", "VGG16", "VGG19"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=MODELS,
                    help="keras.applications names, or keras:NAME:key=value specs")
    ap.add_argument("--npu", default="edge_16x16", help="preset for the MACs and latency")
    args = ap.parse_args()
    spec = load_npu_spec(args.npu)
    width = max(20, *(len(m.removeprefix("keras:")) for m in args.models))
    header = (f"{'model':<{width}} {'input':>11} {'nodes':>6} {'opt.':>5} {'GMACs':>7} "
              f"{'params (M)':>10} {'weights (M)':>11} {'build s':>7} {'trace s':>7} "
              f"{'latency ms':>10}")
    print(header)
    print("-" * len(header))
    for name in args.models:
        t0 = time.perf_counter()
        model = keras_application(name if name.startswith("keras:") else f"keras:{name}")
        t1 = time.perf_counter()
        graph, params = trace_keras(model)  # checked against Keras' own output
        t2 = time.perf_counter()
        opt, opt_params = optimize(graph, params)
        schedule = lower(opt, spec)
        weights = sum(int(np.size(a)) for p in opt_params.values() for a in p.values())
        shape = "x".join(str(d) for d in graph.tensors[graph.inputs[0]].shape[1:])
        print(f"{name.removeprefix('keras:'):<{width}} {shape:>11} {len(graph.nodes):>6} "
              f"{len(opt.nodes):>5} {schedule.macs / 1e9:>7.3f} "
              f"{model.count_params() / 1e6:>10.2f} {weights / 1e6:>11.2f} {t1 - t0:>7.1f} "
              f"{t2 - t1:>7.1f} {schedule.latency_s * 1e3:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
