# The screening script as run (README.md); kept as run.
# ruff: noqa: E402, E501, E702, E741
import glob
import os
import sys

import numpy as np
from scipy.stats import spearmanr

tag = sys.argv[1] if len(sys.argv) > 1 else "split"
keys = np.load(f"/work/coral-cache/keys_{tag}.npy") if os.path.exists(f"/work/coral-cache/keys_{tag}.npy") else None
USB = {"DenseNet": 20, "Inception_v1": 3.4, "Inception_v4": 85, "Inception-ResNet_V2": 57,
       "MobileNet_v1": 2.4, "MobileNet_v2": 2.6, "ResNet-50_V1": 49, "ResNet-50_V2": 50,
       "ResNet-152_V2": 128, "SqueezeNet": 2.1, "VGG16": 296, "VGG19": 308,
       "EfficientNet-EdgeTpu-S": 5.1, "EfficientNet-EdgeTpu-M": 8.7}
DEV = {"DenseNet": 25, "Inception_v1": 4.1, "Inception_v4": 102, "Inception-ResNet_V2": 69,
       "MobileNet_v1": 2.4, "MobileNet_v2": 2.6, "ResNet-50_V1": 56, "ResNet-50_V2": 59,
       "ResNet-152_V2": 151, "SqueezeNet": 2.0, "VGG16": 343, "VGG19": 357,
       "EfficientNet-EdgeTpu-S": 5.5, "EfficientNet-EdgeTpu-M": 10.6}
Y = {}
for f in glob.glob(f"/work/coral-cache/res_{tag}_*.npy"):
    Y[os.path.basename(f)[len(f"res_{tag}_"):-4]] = np.load(f)
names = [n for n in USB if n in Y]
acts = sorted(set(keys[:, 0])); rates = np.asarray(sorted(set(keys[:, 1])))
def table(n, a):
    return np.asarray([Y[n][(keys[:, 0] == a) & (keys[:, 1] == r)][0] for r in rates])
fine = np.geomspace(rates[0], rates[-1], 400)
def curve(n, choice):
    if choice == "preset":
        t = table(n, -1.0)
    elif choice == "min":
        t = np.min([table(n, a) for a in acts if a >= 0], axis=0)
    else:
        t = table(n, choice)
    return np.exp(np.interp(np.log(fine), np.log(rates), np.log(t)))
def metrics(meas, pred):
    meas, pred = np.asarray(meas), np.asarray(pred)
    return 100 * np.mean(np.abs(pred / meas - 1)), spearmanr(meas, pred)[0]
def run(choice, extra=None, show=False):
    C = np.asarray([curve(n, choice) * 1e3 for n in names])  # ms [n, rates]
    meas = np.asarray([USB[n] for n in names])
    res = np.log(C / meas[:, None])
    loo = []
    for k in range(len(names)):
        o = np.delete(np.arange(len(names)), k)
        j = np.argmin(np.sum(res[o] ** 2, axis=0))
        loo.append(C[k, j])
    jall = np.argmin(np.sum(res ** 2, axis=0))
    m, s = metrics(meas, loo)
    ratio = np.asarray(loo) / meas
    w = int(np.argmax(np.abs(np.log(ratio))))
    d = int(np.argmin(np.abs(fine - 4e8)))
    dev = C[:, d]; dm = np.asarray([DEV[n] for n in names])
    md, sd = metrics(dm, dev)
    print(f"{str(choice):8s} USB LOO MAPE {m:5.1f} % rho {s:.3f} worst {names[w]} {ratio[w]:.2f}x  "
          f"rate {fine[jall]/1e6:.0f} MB/s | dev@400 MAPE {md:5.1f} % rho {sd:.3f}")
    if show:
        for n, l, mm, dv, dmm in zip(names, loo, meas, dev, dm):
            print(f"   {n:24s} {mm:7.1f} {l:8.2f} {100*(l/mm-1):+6.1f} %   dev {dmm:6.1f} {dv:8.2f} {100*(dv/dmm-1):+6.1f} %")
print(len(names), "models:", names)
for c in ["preset", *[a for a in acts if a >= 0], "min"]:
    run(c, show=c in ("preset", "min"))

import json

counts = json.load(open("/work/coral-cache/counts.json"))
def run2(choice, what, cgrid):
    C0 = np.asarray([curve(n, choice) * 1e3 for n in names])
    cnt = np.asarray([counts[n][what] for n in names], float)
    meas = np.asarray([USB[n] for n in names])
    # [n, rates, c]
    C = C0[:, :, None] + cnt[:, None, None] * cgrid[None, None, :] * 1e3
    res = np.log(C / meas[:, None, None])
    loo = []
    for k in range(len(names)):
        o = np.delete(np.arange(len(names)), k)
        j = np.unravel_index(np.argmin(np.sum(res[o] ** 2, axis=0)), res.shape[1:])
        loo.append(C[k][j])
    ja = np.unravel_index(np.argmin(np.sum(res ** 2, axis=0)), res.shape[1:])
    m, s = metrics(meas, loo)
    ratio = np.asarray(loo) / meas; w = int(np.argmax(np.abs(np.log(ratio))))
    print(f"{choice} + c*{what}: LOO MAPE {m:.1f} % rho {s:.3f} worst {names[w]} {ratio[w]:.2f}x, all: rate {fine[ja[0]]/1e6:.0f} c {cgrid[ja[1]]*1e6:.1f} us")
cg = np.concatenate([[0], np.geomspace(1e-7, 2e-4, 60)])
for ch in ("preset", "min"):
    for what in ("npu", "concat", "gemm"):
        run2(ch, what, cg)
cg2 = np.concatenate([[0], np.geomspace(1e-12, 1e-7, 60)])
for ch in ("preset", "min"):
    for what in ("concat_elems", "vector_ops", "act_elems"):
        run2(ch, what, cg2)
