"""Export the Coral table's architectures that keras.applications lacks, once, to ONNX.

Runs in its own virtual environment, never inside npujax (torch is no dependency of npujax)::

    python3 -m venv /tmp/venv-export
    /tmp/venv-export/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/venv-export/bin/pip install timm onnx
    /tmp/venv-export/bin/python experiments/fidelity/export_onnx.py

Each model is built by its library's own constructor with random weights (``pretrained=False``,
``torch.manual_seed(0)``: nothing is downloaded), batch 1, float32, NCHW, opset 17 (TorchScript
exporter), and written to ``experiments/fidelity/onnx/`` (ignored by git). Its parameter count
and multiply-accumulates (convolutions and fully connected layers, counted by forward hooks)
are checked against the figures published for the architecture (``PUBLISHED`` below, with
sources) to within 2 %; the script fails if one is off. ``onnx_manifest.json`` beside this file
records the library versions, each file's sha256 and the counts; ``coral.py`` refuses a file
whose sha256 differs from it (``--check`` re-hashes the exported files against it here).

Which constructor for which row of Table 1 (coral.ai/docs/edgetpu/benchmarks), and why:

* **Inception v1**: torchvision ``googlenet(aux_logits=False, transform_input=False)``. Coral's
  model is TF-slim's ``inception_v1_224_quant`` (the file name in Coral's own tests and model
  lists). torchvision's GoogLeNet is that network (BatchNorm after every convolution, the
  "5x5" branch as a 3x3 convolution, as TF-slim's ``Conv2d_0b_3x3``), 1000 classes where
  TF-slim has 1001.
* **Inception v4**: timm ``inception_v4`` (a port of TF-slim's ``inception_v4``, Coral's
  ``inception_v4_299_quant``), 1000 classes.
* **SqueezeNet**: torchvision ``squeezenet1_0``. Coral does not name its SqueezeNet file;
  Google's TF Lite hosted-models list has one, ``squeezenet_2018_04_27`` (beside a DenseNet and
  an Inception-ResNet V2, the table's other rows without a TF-slim file); that list cites the
  SqueezeNet paper (arXiv 1602.07360),
  which defines v1.0 (v1.1 exists only in the authors' repository), and gives the float file as
  5.0 MB: 1,248,424 float32 parameters are 4.99 MB (v1.0), v1.1's 1,235,496 are 4.94 MB.
  ``squeezenet1_1`` is exported too, for the sensitivity the results page reports; the table
  uses v1.0.
* **EfficientNet-EdgeTPU S / M**: timm ``efficientnet_es`` (224) / ``efficientnet_em`` (240),
  timm's definitions of Google's EfficientNet-EdgeTPU-S/M (Gupta and Tan, 2019; arXiv
  2003.02838). They differ from the ``tf_`` variants (and Google's TFLite files) only in
  padding: symmetric, where TensorFlow pads ``SAME`` (one more row/column at the bottom/right
  of a stride-2 convolution); the layers, channels and kernels are the same.

Not built (no constructor of the exact architecture in torchvision or timm): MobileNet v1/v2
SSD (TF Object Detection API models; torchvision has only SSDlite with MobileNet V3), DeepLab V3
with a MobileNet v2 backbone at 513x513 (torchvision's DeepLab V3 uses MobileNet V3 or ResNet
backbones) and U-Net with a MobileNet v2 encoder (a TensorFlow tutorial's model, in no package).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "onnx"
MANIFEST = HERE / "onnx_manifest.json"
OPSET = 17

#: name -> (library, constructor, kwargs, input (C, H, W))
MODELS = {
    "inception_v1": ("torchvision", "googlenet",
                     {"weights": None, "aux_logits": False, "transform_input": False,
                      "init_weights": True}, (3, 224, 224)),
    "inception_v4": ("timm", "inception_v4", {"pretrained": False}, (3, 299, 299)),
    "squeezenet1_0": ("torchvision", "squeezenet1_0", {"weights": None}, (3, 224, 224)),
    "squeezenet1_1": ("torchvision", "squeezenet1_1", {"weights": None}, (3, 224, 224)),
    "efficientnet_edgetpu_s": ("timm", "efficientnet_es", {"pretrained": False}, (3, 224, 224)),
    "efficientnet_edgetpu_m": ("timm", "efficientnet_em", {"pretrained": False}, (3, 240, 240)),
}

#: name -> (parameters, multiply-accumulates, source of both)
PUBLISHED = {
    "inception_v1": (6_624_904, 1.50e9,
                     "torchvision model docs, GoogLeNet_Weights.IMAGENET1K_V1: 6,624,904 params, "
                     "1.50 GFLOPS (multiply-adds); Szegedy et al., CVPR 2015 (arXiv 1409.4842), "
                     "Sec. 5: 1.5 billion multiply-adds"),
    "inception_v4": (42.7e6, 12.3e9,
                     "timm model card inception_v4.tf_in1k: 42.7 M params, 12.3 GMACs"),
    "squeezenet1_0": (1_248_424, 0.82e9,
                      "Iandola et al. 2016 (arXiv 1602.07360), Table 1: 1,248,424 params; "
                      "torchvision model docs, SqueezeNet1_0_Weights: 0.82 GFLOPS"),
    "squeezenet1_1": (1_235_496, 0.35e9,
                      "torchvision model docs, SqueezeNet1_1_Weights: 1,235,496 params, "
                      "0.35 GFLOPS"),
    "efficientnet_edgetpu_s": (5.44e6, 1.8e9,
                               "timm model card efficientnet_es.ra_in1k: 5.4 M params, "
                               "1.8 GMACs at 224x224"),
    "efficientnet_edgetpu_m": (6.9e6, 3.0e9,
                               "timm model card efficientnet_em.ra2_in1k: 6.9 M params, "
                               "3.0 GMACs at 240x240"),
}
#: relative tolerance of the check against the published figures (cards round to 0.1 M / G)
TOL = 0.02


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def count_macs(model, x) -> int:
    """Multiply-accumulates of one forward pass: Conv2d and Linear layers (forward hooks)."""
    import torch

    total = 0

    def conv(m, inp, out):
        nonlocal total
        k = m.weight.shape[1] * m.weight.shape[2] * m.weight.shape[3]  # Cin/groups * kh * kw
        total += out.numel() * k

    def lin(m, inp, out):
        nonlocal total
        total += out.numel() * m.in_features

    hooks = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d):
            hooks.append(mod.register_forward_hook(conv))
        elif isinstance(mod, torch.nn.Linear):
            hooks.append(mod.register_forward_hook(lin))
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return total


def build(name: str):
    import torch

    lib, ctor, kwargs, chw = MODELS[name]
    torch.manual_seed(0)
    if lib == "torchvision":
        import torchvision.models as tvm

        model = getattr(tvm, ctor)(**kwargs)
    else:
        import timm

        model = timm.create_model(ctor, **kwargs)
    return model.eval(), torch.zeros(1, *chw)


def export(names: list[str]) -> int:
    import onnx
    import torch

    OUT.mkdir(exist_ok=True)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"models": {}}
    manifest["versions"] = {p: md.version(p) for p in ("torch", "torchvision", "timm", "onnx")}
    manifest["versions"]["python"] = platform.python_version()
    manifest["opset"] = OPSET
    manifest["how"] = ("experiments/fidelity/export_onnx.py: random weights (torch.manual_seed(0), "
                       "pretrained=False), batch 1, float32, NCHW, TorchScript exporter")
    bad = []
    for name in names:
        lib, ctor, kwargs, chw = MODELS[name]
        model, x = build(name)
        params = sum(p.numel() for p in model.parameters())
        macs = count_macs(model, x)
        p_pub, m_pub, src = PUBLISHED[name]
        dp, dm = params / p_pub - 1, macs / m_pub - 1
        ok = abs(dp) <= TOL and abs(dm) <= TOL
        print(f"{name:24s} params {params:>11,d} ({dp:+.2%} vs {p_pub:,.0f})  "
              f"MACs {macs / 1e9:6.3f} G ({dm:+.2%} vs {m_pub / 1e9:.2f} G)  "
              f"{'ok' if ok else 'OFF'}", flush=True)
        if not ok:
            bad.append(name)
        path = OUT / f"{name}.onnx"
        torch.onnx.export(model, (x,), str(path), input_names=["input"],
                          output_names=["logits"], opset_version=OPSET, dynamo=False,
                          do_constant_folding=True)
        onnx.checker.check_model(str(path))
        manifest["models"][name] = {
            "file": f"onnx/{path.name}",
            "constructor": f"{lib}.{ctor}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})",
            "input_nchw": [1, *chw],
            "params": params,
            "macs": macs,
            "published": {"params": p_pub, "macs": m_pub, "source": src},
            "sha256": sha256(path),
            "bytes": path.stat().st_size,
        }
    manifest["models"] = dict(sorted(manifest["models"].items()))
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {MANIFEST}")
    if bad:
        print(f"off the published figures by more than {TOL:.0%}: {bad}", file=sys.stderr)
        return 1
    return 0


def check() -> int:
    manifest = json.loads(MANIFEST.read_text())
    bad = 0
    for name, m in manifest["models"].items():
        path = HERE / m["file"]
        got = sha256(path) if path.exists() else "missing"
        print(f"{name:24s} {'ok' if got == m['sha256'] else 'DIFFERS: ' + got}")
        bad += got != m["sha256"]
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models (default all: {', '.join(MODELS)})")
    ap.add_argument("--check", action="store_true",
                    help="only re-hash the exported files against the manifest")
    args = ap.parse_args()
    if args.check:
        return check()
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    return export(args.names or list(MODELS))


if __name__ == "__main__":
    sys.exit(main())
