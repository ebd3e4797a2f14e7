"""The package type-checks: mypy, with the settings of ``[tool.mypy]`` in pyproject.toml, reports
no error on ``npujax/``.

mypy runs in its own process (in this one, the whole analysis stays in memory and Python spends
20-55 s freeing it at exit). Its incremental cache lives in the system temp folder (one per
checkout, never in the source tree), so a repeated run rechecks only the modules that changed:
about 18 s the first time on two cores (jax, numpy, flax and onnx are analysed too), under a
second afterwards.
"""

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cache_dir() -> Path:
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"npujax-mypy-cache-{checkout}"


def test_package_type_checks():
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--cache-dir", str(_cache_dir()), str(ROOT / "npujax")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"mypy found type errors in npujax/:\n{r.stdout}{r.stderr}"
