#!/usr/bin/env bash
# Regenerate SCALE-Sim reference figures stored as test data in tests/systolic/data/.
#
# SCALE-Sim 3.0.0 needs numpy < 2.4 (newer numpy crashes its memory model), so it runs in its own
# virtual environment, created here (default: experiments/scalesim_reference/.venv, git-ignored).
# The GEMM, ResNet-18, depthwise and small-SRAM report runs go in parallel; the conv run takes ~10-20 minutes on one core
# (SCALE-Sim steps its memory model cycle by cycle in Python).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SCALESIM_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet scalesim==3.0.0 'numpy<2.4'
fi
out="$repo/tests/systolic/data"
mkdir -p "$out"
"$venv/bin/python" "$here/run_scalesim.py" "$out/scalesim_gemm.json" --kinds gemm &
"$venv/bin/python" "$here/run_scalesim.py" "$out/scalesim_resnet18.json" --kinds conv --jobs 2 &
"$venv/bin/python" "$here/run_scalesim.py" "$out/scalesim_depthwise.json" --kinds depthwise &
"$venv/bin/python" "$here/run_reports.py" "$out/scalesim_reports.json" &
wait
echo "wrote $out/scalesim_{gemm,resnet18,depthwise,reports}.json"
