"""Writing model files: room on the disk first, and never a half-written file under the real name.

The export scripts skip a model whose file is already there, so a file cut short (a full disk,
a killed process) must never be left under its final name. Each writer writes ``<path>.tmp`` and
renames it; before that it checks the file system has room for it, so a full disk is one clear
message naming the file, the bytes it needs and the bytes free, not a library's abort halfway.

A file may be written elsewhere when its disk runs short (``placed``): where the environment
names a spill folder (``TRITON_RUST_MODEL_SPILL``; the test command sets it to a folder of
/dev/shm, in memory, which it removes at its end), a file that would leave its disk less than
``SPILL_RESERVE`` free goes there and ``path`` becomes a link to it: the disk keeps room for
what the run writes after the models (the tests' tables and logs). A link whose file is gone
counts as no file: the next export writes it again. Without the variable, a full disk is the
message above, as before.
"""

from __future__ import annotations

import os
import shutil
import sys

# Room kept beyond the file itself: the rest of a run writes more (the next models, logs).
MARGIN = 256 << 20
# A spill folder keeps this much more free: it is memory the server and the tests need too.
SPILL_MARGIN = 2 << 30
# With a spill folder, the disk keeps this much free after a model file.
SPILL_RESERVE = 2 << 30
SPILL_ENV = "TRITON_RUST_MODEL_SPILL"


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


def placed(path: str, need: int, what: str) -> str:
    """Where to write ``path``'s ``need`` bytes (at ``tmp_path`` of it, then ``finish``): ``path``
    itself when its file system has room (with a spill folder named: room and SPILL_RESERVE
    more), else the same path under the spill folder when it has room (a line on stderr says
    so), else SystemExit as ``ensure_free_space``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    spill = os.environ.get(SPILL_ENV, "")
    if not spill or shutil.disk_usage(folder).free >= need + SPILL_RESERVE:
        ensure_free_space(path, need, what)
        return path
    there = os.path.join(spill, os.path.abspath(path).lstrip(os.sep))
    os.makedirs(os.path.dirname(there), exist_ok=True)
    room = shutil.disk_usage(os.path.dirname(there)).free
    if room < need + SPILL_MARGIN:
        ensure_free_space(path, need, what)  # the disk's message: it is the disk that lacks room
    print(f"{what}: {shutil.disk_usage(folder).free >> 20} MiB free beside {path}, too few for its "
          f"{need >> 20} MiB and {SPILL_RESERVE >> 20} MiB kept: written to {there} ({SPILL_ENV}) and linked",
          file=sys.stderr)
    return there


def finish(path: str, written: str) -> None:
    """``written``'s temporary file renamed to ``written``; when that is not ``path`` (spilled),
    ``path`` made a link to it (replacing whatever was there)."""
    os.replace(tmp_path(written), written)
    link_spilled(path, written)


def link_spilled(path: str, written: str) -> None:
    """``path`` made a link to ``written`` (replacing whatever was there) when they differ."""
    if written != path:
        link = tmp_path(path)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(written, link)
        os.replace(link, path)
