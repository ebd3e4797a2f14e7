"""Leave-one-out over screened preset variants: squared and robust (soft L1) log loss.

Step 2 of a screen: ``res_TAG_NAME.npy`` (each row's seconds at the 13 rates of
``screen_instr.py``), for each TAG given, as ``loo.py`` does it: the leave-one-out fit is the
off-chip rate minimising the loss of the other rows' log ratios (on 400 interpolated rates);
the loss is squared (``fit --table``'s until 2026-12-03) or scipy's ``soft_l1`` at a scale of
0.1 (10 % in the log ratio). Printed with the Dev Board at its preset's 400 MB/s.

    python3 experiments/fidelity/coral_screen/loo_tag.py CACHE TAG [TAG...]
"""

from __future__ import annotations

import os
import sys

import numpy as np
from loo_instr import DEV, USB, metrics


def loss(r: np.ndarray, kind: str) -> np.ndarray:
    """Per-row loss of log ratios ``r``: squared, or soft L1 at scale 0.1 (scipy's form)."""
    z = (r / 0.1) ** 2
    return r ** 2 if kind == "squared" else 2.0 * (np.sqrt(1.0 + z) - 1.0)


def main() -> None:
    cache = sys.argv[1]
    rates = np.load(os.path.join(cache, "keys_preset.npy"))
    fine = np.geomspace(rates[0], rates[-1], 400)
    d400 = int(np.argmin(np.abs(fine - 4e8)))
    for tag in sys.argv[2:]:
        names = [n for n in USB if os.path.exists(os.path.join(cache, f"res_{tag}_{n}.npy"))]
        t = np.asarray([np.exp(np.interp(np.log(fine), np.log(rates), np.log(
            np.load(os.path.join(cache, f"res_{tag}_{n}.npy"))))) for n in names]) * 1e3
        meas = np.asarray([USB[n] for n in names])
        dev = np.asarray([DEV[n] for n in names])
        res = np.log(t / meas[:, None])
        for kind in ("squared", "soft_l1"):
            loo = []
            for k in range(len(names)):
                others = np.delete(np.arange(len(names)), k)
                loo.append(t[k, np.argmin(np.sum(loss(res[others], kind), axis=0))])
            m, s = metrics(meas, loo)
            ratio = np.asarray(loo) / meas
            rate = fine[np.argmin(np.sum(loss(res, kind), axis=0))]
            md, _ = metrics(dev, t[:, d400])
            print(f"{tag:8s} {kind:7s} {len(names)} rows: USB LOO MAPE {m:4.1f} % rho {s:.3f} "
                  f"rate {rate / 1e6:.0f} MB/s | Dev Board @400 MAPE {md:4.1f} %")
            print("   " + " ".join(f"{n}:{100 * (x - 1):+.0f}" for n, x in zip(names, ratio)))


if __name__ == "__main__":
    main()
