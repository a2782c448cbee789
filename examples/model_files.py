"""Writing model files: room on the disk first, and never a half-written file under the real name.

The export scripts skip a model whose file is already there, so a file cut short (a full disk,
a killed process) must never be left under its final name. Each writer writes ``<path>.tmp`` and
renames it; before that it checks the file system has room for it, so a full disk is one clear
message naming the file, the bytes it needs and the bytes free, not a library's abort halfway.
"""

from __future__ import annotations

import os
import shutil

# Room kept beyond the file itself: the rest of a run writes more (the next models, logs).
MARGIN = 256 << 20


def ensure_free_space(path: str, need: int, what: str) -> None:
    """Raise SystemExit naming ``what`` when ``path``'s file system has less than ``need`` bytes
    (plus a margin) free."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need + MARGIN:
        raise SystemExit(f"{what}: not enough disk space for {path}: it needs about "
                         f"{need / 2**20:.0f} MiB (and {MARGIN >> 20} MiB to spare), "
                         f"{free / 2**20:.0f} MiB are free on that file system")


def tmp_path(path: str) -> str:
    """Where a writer writes ``path`` before ``os.replace(tmp_path(path), path)``."""
    return path + ".tmp"
