# The loss screen as run (README.md, "The fit's loss"); only this header added and the import
# path made the script's own folder (it ran with /work/main's copy of this folder).
# ruff: noqa: E401, E402, E501, E701, E702, E731, E741, I001, F401
"""Leave-one-out screen of the table fit's loss: least squares against robust losses.

The rate-only screen of ``loo_instr.py`` on the shipped preset's per-rate totals
(``res_shipped_*.npy`` of ``screen_instr.py ... shipped``): each model is predicted at the
off-chip rate that minimises a loss ``rho`` of the other 13 models' log errors (400 rates,
interpolated), for scipy ``least_squares``'s losses at several scales ``f`` in log ratio.

    python3 experiments/fidelity/coral_screen/loo_loss.py > results_loss.txt
"""
import os, numpy as np, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loo_instr import USB, DEV, metrics
CACHE="/work/coral-cache"
rates=np.load(f"{CACHE}/keys_preset.npy")
names=[n for n in USB if os.path.exists(f"{CACHE}/res_shipped_{n}.npy")]
fine=np.geomspace(rates[0],rates[-1],400)
C=np.asarray([np.exp(np.interp(np.log(fine),np.log(rates),np.log(np.load(f"{CACHE}/res_shipped_{n}.npy")))) for n in names])*1e3
meas=np.asarray([USB[n] for n in names])
res=np.log(C/meas[:,None])
def rho(r,f,kind):
    z=(r/f)**2
    if kind=="sq": return z
    if kind=="soft_l1": return 2*((1+z)**.5-1)
    if kind=="huber": return np.where(z<=1,z,2*z**.5-1)
    if kind=="cauchy": return np.log1p(z)
    if kind=="abs": return np.abs(r)
for kind in ["sq","abs","soft_l1","huber","cauchy"]:
  for f in ([1] if kind in("sq","abs") else [0.05,0.1,0.2,0.3,0.5]):
    loo=[]
    for k in range(len(names)):
        o=np.delete(np.arange(len(names)),k)
        loo.append(C[k,np.argmin(np.sum(rho(res[o],f,kind),axis=0))])
    m,s=metrics(meas,loo); r=np.asarray(loo)/meas
    print(f"{kind:8s} f={f:4}: LOO MAPE {m:5.1f} rho {s:.3f} worst {r.max():.2f}/{r.min():.2f}")
for kind,f in [("sq",1),("soft_l1",0.1)]:
    loo=[]
    for k in range(len(names)):
        o=np.delete(np.arange(len(names)),k)
        loo.append(C[k,np.argmin(np.sum(rho(res[o],f,kind),axis=0))])
    print(kind, " ".join(f"{n[:10]}:{100*(p/m-1):+.0f}" for n,p,m in zip(names,loo,meas)))
    j=np.argmin(np.sum(rho(res,f,kind),axis=0)); print("rate", fine[j]/1e6)
