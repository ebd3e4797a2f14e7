"""One runtime alone in its own process (issue 30, target 5's cross-check of
``experiments/bench/execution.py``): the CPU time per call of the JAX forward pass
(:func:`npujax.ir.execute.inference`) or of onnxruntime over N calls after a warm-up, no other
runtime in the process, so nothing of one is charged to the other and neither evicts the
other's caches.

Usage (alternate the two sides, several rounds; the thread settings as in execution.py):
    python experiments/bench/execution_alone.py ppocr_cls ort 1000
    python experiments/bench/execution_alone.py ppocr_cls jax 1000
    PJRT_NPROC=1 XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python ... (one thread each)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import execution as bench  # noqa: E402
import jax  # noqa: E402


def main() -> None:
    name, side, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    path, input_name, graph, params, x = bench._model(name)
    if side == "ort":
        sess = bench._session(path)

        def f():
            return sess.run(None, {input_name: x})
    else:
        import npujax.ir.execute as ex

        g = ex.inference(graph, params)

        def f():
            return jax.block_until_ready(g(x))
    for _ in range(5):
        f()
    t, w = time.process_time(), time.perf_counter()
    for _ in range(n):
        f()
    print(f"{name} {side}: {(time.process_time() - t) / n * 1e3:.3f} ms CPU/call, "
          f"{(time.perf_counter() - w) / n * 1e3:.3f} ms wall/call")


if __name__ == "__main__":
    main()
