# The screening script as run (README.md); kept as run.
# ruff: noqa: E402, E501, E702, E741
import glob
import os

import numpy as np
from scipy.stats import spearmanr

exec(open("/work/coral-cache/loo.py").read().split("Y = {}")[0].split("tag = ")[0])
USB = {"DenseNet": 20, "Inception_v1": 3.4, "Inception_v4": 85, "Inception-ResNet_V2": 57,
       "MobileNet_v1": 2.4, "MobileNet_v2": 2.6, "ResNet-50_V1": 49, "ResNet-50_V2": 50,
       "ResNet-152_V2": 128, "SqueezeNet": 2.1, "VGG16": 296, "VGG19": 308,
       "EfficientNet-EdgeTpu-S": 5.1, "EfficientNet-EdgeTpu-M": 8.7}
DEV = {"DenseNet": 25, "Inception_v1": 4.1, "Inception_v4": 102, "Inception-ResNet_V2": 69,
       "MobileNet_v1": 2.4, "MobileNet_v2": 2.6, "ResNet-50_V1": 56, "ResNet-50_V2": 59,
       "ResNet-152_V2": 151, "SqueezeNet": 2.0, "VGG16": 343, "VGG19": 357,
       "EfficientNet-EdgeTpu-S": 5.5, "EfficientNet-EdgeTpu-M": 10.6}
keys = np.load("/work/coral-cache/keys_lanes.npy")
Y = {os.path.basename(f)[len("res_lanes_"):-4]: np.load(f) for f in glob.glob("/work/coral-cache/res_lanes_*.npy")}
names = [n for n in USB if n in Y]
rates = np.asarray(sorted(set(keys[:, 1]))); lanes = sorted(set(keys[:, 2])); acts = sorted(set(keys[:, 0]))
fine = np.geomspace(rates[0], rates[-1], 400)
def curve(n, mode, ln):
    def t(a): return np.asarray([Y[n][(keys[:, 0] == a) & (keys[:, 1] == r) & (keys[:, 2] == ln)][0] for r in rates])
    tt = t(-1.0) if mode == "preset" else np.min([t(a) for a in acts if a >= 0], axis=0)
    return np.exp(np.interp(np.log(fine), np.log(rates), np.log(tt)))
def metrics(meas, pred):
    return 100 * np.mean(np.abs(np.asarray(pred) / meas - 1)), spearmanr(meas, pred)[0]
meas = np.asarray([USB[n] for n in names]); dm = np.asarray([DEV[n] for n in names])
d = int(np.argmin(np.abs(fine - 4e8)))
for mode in ("preset", "min"):
    C = np.stack([np.asarray([curve(n, mode, ln) * 1e3 for n in names]) for ln in lanes], axis=-1)  # [n, rate, lanes]
    res = np.log(C / meas[:, None, None])
    for fixed in [None] + list(lanes):
        loo = []
        for k in range(len(names)):
            o = np.delete(np.arange(len(names)), k)
            ss = np.sum(res[o] ** 2, axis=0)
            if fixed is not None:
                li = lanes.index(fixed); j = (np.argmin(ss[:, li]), li)
            else:
                j = np.unravel_index(np.argmin(ss), ss.shape)
            loo.append(C[k][j])
        ss = np.sum(res ** 2, axis=0)
        ja = np.unravel_index(np.argmin(ss), ss.shape) if fixed is None else (np.argmin(ss[:, lanes.index(fixed)]), lanes.index(fixed))
        m, s = metrics(meas, loo); ratio = np.asarray(loo) / meas; w = int(np.argmax(np.abs(np.log(ratio))))
        dev = C[:, d, ja[1]]; md, sd = metrics(dm, dev)
        print(f"{mode:6s} lanes {'fit' if fixed is None else int(fixed)}: LOO MAPE {m:5.1f} % rho {s:.3f} worst {names[w]} {ratio[w]:.2f}x | all: rate {fine[ja[0]]/1e6:.0f} lanes {lanes[ja[1]]:.0f} | dev MAPE {md:.1f} rho {sd:.3f}")
        if fixed is None and mode == "min":
            for n, l, mm, dv, dmm in zip(names, loo, meas, dev, dm):
                print(f"   {n:24s} {mm:7.1f} {l:8.2f} {100*(l/mm-1):+6.1f} %   dev {dmm:6.1f} {dv:8.2f} {100*(dv/dmm-1):+6.1f} %")
