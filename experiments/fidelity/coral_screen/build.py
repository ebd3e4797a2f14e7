# The screening script as run (README.md); kept as run.
# ruff: noqa: E402, E501, E702, E741
"""Build each Coral row's optimized graph once and pickle its workloads (screening cache)."""
import os
import pickle
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
from pathlib import Path

HERE = Path("/work/wt-coral-fit/experiments/fidelity")
from npujax.hw import load_npu_spec
from npujax.plan import network
from npujax.plan.fit_table import read_table
from npujax.workflows.fit_table import table_graph

spec = load_npu_spec("coral_edgetpu")
rows = read_table(HERE / "coral_edgetpu_table1.csv")
only = sys.argv[1]  # keras or onnx
for r in rows:
    if not r.source or r.group != "usb_accelerator_desktop":
        continue
    if (only == "keras") != r.source.startswith("keras:"):
        continue
    f = Path("/work/coral-cache") / (r.model.replace(" ", "_") + ".pkl")
    if f.exists():
        continue
    t = time.time()
    g = table_graph(r, spec.layout.activation_layout)
    net = network(g, spec)
    f.write_bytes(pickle.dumps({"row": r, "graph": g, "layers": net.layers, "chains": net.chains}))
    print(r.model, len(net.layers), f"{time.time()-t:.0f}s", flush=True)
