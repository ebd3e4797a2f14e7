"""Leave-one-out screen of the Edge TPU's per-inference instruction stream (candidate 5).

Step 2 of 2 (``screen_instr.py`` first). Public fact: libedgetpu sends a compiled model's
instruction bitstream (its ``EXECUTION_ONLY`` executable) to the Edge TPU on **every**
inference; only the ``PARAMETER_CACHING`` executable is sent once. The bitstreams of Coral's own
files, read from the files and found as transfers of exactly their sizes in USB captures of
every inference (RingCanary/coral-usb-oxidized,
``docs/usb_executable_transport_correlation.md``, ``WORKLOG.md``):

  mobilenet_v1_1.0_224_quant_edgetpu            225,824 B  (+ input 150,528 B)
  mobilenet_v2_1.0_224_inat_bird_quant_edgetpu  261,920 + 10,224 B
  inception_v1_224_quant_edgetpu                254,656 + 103,200 B (+ 393,664 B of parameters
                                                 that are not cached and stream every inference)

One Dense layer compiles to 4,112-11,200 B (``docs/artifacts/instruction-dim-field-20260301/
dense_instruction_size_table.tsv`` there). The candidate: a model sends ``c`` bytes of
instructions per NPU operation across the host link before it runs, ``c x ops / rate`` (and,
variant ``+input``, its input's bytes too), at the same link rate as the streamed parameters
(the fitted off-chip rate). ``c`` comes from the three public executables (bytes per NPU
operation as npujax counts the same models), never from the latencies; "c fitted" fits it with
the rate instead, to see whether the table agrees.

    python3 experiments/fidelity/coral_screen/loo_instr.py [CACHE]
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
#: instruction bytes per inference of Coral's compiled files (see the docstring)
INSTR = {"MobileNet_v1": 225_824, "MobileNet_v2": 261_920 + 10_224,
         "Inception_v1": 254_656 + 103_200}
DEV_RATE = 4e8  # the Dev Board preset's link (coral_devboard.toml), as loo.py


def metrics(meas, pred):
    meas, pred = np.asarray(meas), np.asarray(pred)
    return 100 * np.mean(np.abs(pred / meas - 1)), spearmanr(meas, pred)[0]


def main() -> None:
    rates = np.load(os.path.join(CACHE, "keys_preset.npy"))
    cnt = json.load(open(os.path.join(CACHE, "counts_instr.json")))
    names = [n for n in USB if os.path.exists(os.path.join(CACHE, f"res_preset_{n}.npy"))]
    fine = np.geomspace(rates[0], rates[-1], 400)
    base = np.asarray([np.exp(np.interp(np.log(fine), np.log(rates),
                                        np.log(np.load(os.path.join(CACHE,
                                                                    f"res_preset_{n}.npy")))))
                       for n in names]) * 1e3  # ms [n, rates]
    ops = np.asarray([cnt[n]["npu_ops"] for n in names], float)
    inb = np.asarray([cnt[n]["input_bytes"] for n in names], float)
    meas = np.asarray([USB[n] for n in names])
    dm = np.asarray([DEV[n] for n in names])
    d400 = int(np.argmin(np.abs(fine - DEV_RATE)))
    print(len(names), "models")
    for n in names:
        print(f"  {n:24s} npu_ops {cnt[n]['npu_ops']:4d}  layers {cnt[n]['layers']:4d}  "
              f"input {cnt[n]['input_bytes']:7d} B"
              + (f"  instr {INSTR[n]:7d} B = {INSTR[n] / cnt[n]['npu_ops']:6.0f} B/op"
                 if n in INSTR else ""))
    per_op = {n: INSTR[n] / cnt[n]["npu_ops"] for n in INSTR if n in cnt}
    c_pub = float(np.mean(list(per_op.values()))) if per_op else 0.0
    print(f"public bytes per NPU op: {per_op}, mean {c_pub:.0f}")

    def extra(c, with_input):
        return (c * ops + (inb if with_input else 0.0))[:, None] / fine[None, :] * 1e3

    def run(label, c, with_input, show=False):
        C = base + extra(c, with_input)
        res = np.log(C / meas[:, None])
        loo = []
        for k in range(len(names)):
            o = np.delete(np.arange(len(names)), k)
            loo.append(C[k, np.argmin(np.sum(res[o] ** 2, axis=0))])
        jall = np.argmin(np.sum(res ** 2, axis=0))
        m, s = metrics(meas, loo)
        ratio = np.asarray(loo) / meas
        w = int(np.argmax(np.abs(np.log(ratio))))
        dev = C[:, d400]
        md, sd = metrics(dm, dev)
        print(f"{label:34s} USB LOO MAPE {m:5.1f} % rho {s:.3f} worst {names[w]} "
              f"{ratio[w]:.2f}x rate {fine[jall] / 1e6:.0f} MB/s | dev@400 MAPE {md:5.1f} % "
              f"rho {sd:.3f}")
        if show:
            for n, p, mm, dv, dmm in zip(names, loo, meas, dev, dm):
                print(f"   {n:24s} {mm:7.1f} {p:8.2f} {100 * (p / mm - 1):+6.1f} %   "
                      f"dev {dmm:6.1f} {dv:8.2f} {100 * (dv / dmm - 1):+6.1f} %")
        return m, md

    run("preset (no instruction stream)", 0.0, False, show=True)
    shipped = [os.path.join(CACHE, f"res_shipped_{n}.npy") for n in names]
    if all(os.path.exists(f) for f in shipped):  # the pass as shipped, in the cost program
        ship = np.asarray([np.load(f) for f in shipped])  # [n, rates] s
        scr = np.asarray([np.load(os.path.join(CACHE, f"res_preset_{n}.npy")) for n in names])
        scr = scr + (c_pub * ops)[:, None] / rates[None, :]
        print(f"shipped pass vs the screened candidate (c = {c_pub:.0f}): max relative "
              f"difference {np.max(np.abs(ship / scr - 1)):.2e}")
    run("preset + input bytes", 0.0, True)
    run(f"+ instructions, c = {c_pub:.0f} B/op", c_pub, False, show=True)
    run(f"+ instructions + input, c = {c_pub:.0f}", c_pub, True, show=True)
    for c in (2048, 4096, 6144, 8192):
        run(f"+ instructions, c = {c}", c, False)
        run(f"+ instructions + input, c = {c}", c, True)
    # c held out with the model: its own executable not used when it is held out
    for with_input in (False, True):
        C_rows, loo = [], []
        for k, n in enumerate(names):
            others = [v for m_, v in per_op.items() if m_ != n]
            ck = float(np.mean(others))
            C = base + extra(ck, with_input)
            res = np.log(C / meas[:, None])
            o = np.delete(np.arange(len(names)), k)
            loo.append(C[k, np.argmin(np.sum(res[o] ** 2, axis=0))])
            C_rows.append(C[k, d400])
        m, s = metrics(meas, loo)
        md, sd = metrics(dm, C_rows)
        print(f"c from the other executables{' + input' if with_input else '':8s}   "
              f"USB LOO MAPE {m:5.1f} % rho {s:.3f} | dev@400 MAPE {md:5.1f} %")
    # overlapped: each operation's instructions stream while the previous one runs, so an
    # operation takes at least its instructions' time on the link (a floor per NPU operation)
    print("overlapped (floor c / rate per NPU operation):")
    for c in (c_pub, 2048, 4096, 8192, 16384):
        tot = []
        for n in names:
            y = np.load(os.path.join(CACHE, f"layers_preset_{n}.npy"))  # [rates, layers] s
            mask = np.asarray(cnt[n]["npu_mask"], bool)
            floor = c / rates[:, None]
            t = np.where(mask[None, :], np.maximum(y, floor), y).sum(axis=1)
            tot.append(np.exp(np.interp(np.log(fine), np.log(rates), np.log(t))) * 1e3)
        C = np.asarray(tot)
        res = np.log(C / meas[:, None])
        loo = []
        for k in range(len(names)):
            o = np.delete(np.arange(len(names)), k)
            loo.append(C[k, np.argmin(np.sum(res[o] ** 2, axis=0))])
        m, s = metrics(meas, loo)
        ratio = np.asarray(loo) / meas
        w = int(np.argmax(np.abs(np.log(ratio))))
        md, sd = metrics(dm, C[:, d400])
        print(f"  c = {c:5.0f} B/op: USB LOO MAPE {m:5.1f} % rho {s:.3f} worst {names[w]} "
              f"{ratio[w]:.2f}x | dev@400 MAPE {md:5.1f} %")
        if c == c_pub:
            for n, p, mm in zip(names, loo, meas):
                print(f"   {n:24s} {mm:7.1f} {p:8.2f} {100 * (p / mm - 1):+6.1f} %")
    # c fitted with the rate (2-D grid), to see whether the table identifies it
    cg = np.concatenate([[0.0], np.geomspace(256, 65536, 49)])
    for with_input in (False, True):
        C = base[:, :, None] + (cg[None, None, :] * ops[:, None, None]
                                + (inb[:, None, None] if with_input else 0.0)) \
            / fine[None, :, None] * 1e3
        res = np.log(C / meas[:, None, None])
        loo, cs = [], []
        for k in range(len(names)):
            o = np.delete(np.arange(len(names)), k)
            j = np.unravel_index(np.argmin(np.sum(res[o] ** 2, axis=0)), res.shape[1:])
            loo.append(C[k][j])
            cs.append(cg[j[1]])
        ja = np.unravel_index(np.argmin(np.sum(res ** 2, axis=0)), res.shape[1:])
        m, s = metrics(meas, loo)
        print(f"c fitted{' + input' if with_input else '':8s}: USB LOO MAPE {m:5.1f} % "
              f"rho {s:.3f}; all rows: rate {fine[ja[0]] / 1e6:.0f} MB/s, c {cg[ja[1]]:.0f} "
              f"B/op; folds' c {min(cs):.0f}-{max(cs):.0f}")


if __name__ == "__main__":
    main()
