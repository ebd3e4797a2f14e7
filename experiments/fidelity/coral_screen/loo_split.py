"""Leave-one-out screen of candidate 6, activations first (step 2 of 2; ``screen_split.py``).

The same leave-one-out as ``loo.py`` and ``loo_instr.py``: each model predicted at the off-chip
rate (13 rates, 250-800 MB/s, interpolated on 400) that minimises the squared log errors of the
other 13 models; the Dev Board at the preset's 400 MB/s. Variants (``screen_split.py``): the
shipped split (the fastest of eight per model), and the activation reserve ``k x`` the peak
live activation bytes with the cache filled in whole layers (``prefix``) or to the byte
(``fill``). Also prints each variant's cached and streamed parameter bytes against the three
public compiled files.

    python3 experiments/fidelity/coral_screen/loo_split.py [CACHE]
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from scipy.stats import spearmanr

CACHE = sys.argv[1] if len(sys.argv) > 1 else "/work/coral-cache"
USB = {"DenseNet": 20, "Inception_v1": 3.4, "Inception_v4": 85, "Inception-ResNet_V2": 57,
       "MobileNet_v1": 2.4, "MobileNet_v2": 2.6, "ResNet-50_V1": 49, "ResNet-50_V2": 50,
       "ResNet-152_V2": 128, "SqueezeNet": 2.1, "VGG16": 296, "VGG19": 308,
       "EfficientNet-EdgeTpu-S": 5.1, "EfficientNet-EdgeTpu-M": 8.7}
DEV = {"DenseNet": 25, "Inception_v1": 4.1, "Inception_v4": 102, "Inception-ResNet_V2": 69,
       "MobileNet_v1": 2.4, "MobileNet_v2": 2.6, "ResNet-50_V1": 56, "ResNet-50_V2": 59,
       "ResNet-152_V2": 151, "SqueezeNet": 2.0, "VGG16": 343, "VGG19": 357,
       "EfficientNet-EdgeTpu-S": 5.5, "EfficientNet-EdgeTpu-M": 10.6}
#: Coral's compiled files (fidelity.md): parameters cached, streamed per inference (bytes)
PUBLIC = {"MobileNet_v1": (4_464_000, 0), "MobileNet_v2": (3_947_392, 0),
          "Inception_v1": (6_581_440, 393_664)}
TAGS = ("shipped", "1x_prefix", "2x_prefix", "1x_fill", "2x_fill", "2xT_prefix", "2xT_fill",
        "max_fill")
RATES = np.geomspace(2.5e8, 8e8, 13)
DEV_RATE = 4e8


def metrics(meas, pred):
    meas, pred = np.asarray(meas), np.asarray(pred)
    return 100 * np.mean(np.abs(pred / meas - 1)), spearmanr(meas, pred)[0]


def main() -> None:
    names = list(USB)
    facts = json.load(open(os.path.join(CACHE, "split_facts.json")))
    fine = np.geomspace(RATES[0], RATES[-1], 400)
    meas = np.asarray([USB[n] for n in names])
    dm = np.asarray([DEV[n] for n in names])
    d400 = int(np.argmin(np.abs(fine - DEV_RATE)))

    def load(tag):
        pre = "res_shipped_" if tag == "shipped_as_recorded" else f"res_split_{tag}_"
        return np.asarray([np.exp(np.interp(np.log(fine), np.log(RATES), np.log(
            np.load(os.path.join(CACHE, pre + n + ".npy"))))) for n in names]) * 1e3

    a, b = load("shipped_as_recorded"), load("shipped")
    print(f"shipped preset now vs res_shipped (recorded with candidate 5): max relative "
          f"difference {np.max(np.abs(b / a - 1)):.2e}")
    print("public compiled files: cached / streamed bytes, and what each variant gives (npujax's "
          "parameter bytes: weights int8 + biases int32)")
    for n, (cached, streamed) in PUBLIC.items():
        f = facts[n]
        print(f"  {n:14s} Coral: {cached:9,d} cached {streamed:7,d} streamed (total "
              f"{cached + streamed:9,d}) | npujax params {f['params']:9,.0f}, peak live "
              f"{f['peak_live']:9,.0f}, largest tensor {f['largest_tensor']:9,.0f}")
        for tag in TAGS[1:]:
            v = f[tag]
            print(f"      {tag:10s} reserve {v['reserve']:9,.0f} cache {v['cache']:9,.0f} "
                  f"streams {v['streamed']:9,.0f}")
    for tag in TAGS:
        C = load(tag)
        res = np.log(C / meas[:, None])
        loo, rate = [], []
        for k in range(len(names)):
            o = np.delete(np.arange(len(names)), k)
            j = np.argmin(np.sum(res[o] ** 2, axis=0))
            loo.append(C[k, j])
            rate.append(fine[j])
        m, s = metrics(meas, loo)
        ratio = np.asarray(loo) / meas
        w = int(np.argmax(np.abs(np.log(ratio))))
        keep = [i for i, n in enumerate(names) if n not in ("DenseNet", "Inception-ResNet_V2")]
        m12 = 100 * np.mean(np.abs(ratio[keep] - 1))
        md, sd = metrics(dm, C[:, d400])
        print(f"{tag:10s} USB LOO MAPE {m:5.1f} % rho {s:.3f} worst {names[w]} {ratio[w]:.2f}x "
              f"(12 models {m12:4.1f} %) rates {min(rate) / 1e6:.0f}-{max(rate) / 1e6:.0f} MB/s | "
              f"dev@400 MAPE {md:5.1f} % rho {sd:.3f}")
        for n, p, mm, dv, dmm in zip(names, loo, meas, C[:, d400], dm):
            st = facts[n].get(tag, {}).get("streamed")
            print(f"   {n:24s} {mm:7.1f} {p:8.2f} {100 * (p / mm - 1):+6.1f} %   dev {dmm:6.1f} "
                  f"{dv:8.2f} {100 * (dv / dmm - 1):+6.1f} %"
                  + ("" if st is None else f"   streams {st / 1e6:6.2f} MB"))


if __name__ == "__main__":
    main()
