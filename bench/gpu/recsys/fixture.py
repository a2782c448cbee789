"""The Criteo-scale store's tables: rows per table, the folder criteo_fixture writes them to,
and their rows recomputed from the fixture's seed (what the exactness check compares with)."""
import os
import shutil
import subprocess
import time

import numpy as np

import zipf_keys

TABLES = 26
SEED = 1  # the fixture's seed (criteo_fixture --seed)


def fixture_rows(scale):
    """Rows per table exactly as criteo_fixture computes them."""
    return [max(1, int(r * scale)) for r in zipf_keys.CRITEO_1TB_ROWS]


# ------------------------------------------------------------------ the fixture's rows

def _mix64(k):
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> np.uint64(33))


def synthetic_rows(seed, table, keys, dim):
    """The fixture's rows (triton_rust_embedding::fixture::synthetic_row) as float32."""
    with np.errstate(over="ignore"):
        base = _mix64(np.array([seed ^ (table << 40)], np.uint64))[0]
        base = base ^ (keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        r = _mix64(base[:, None] ^ np.arange((dim + 3) // 4, dtype=np.uint64)[None, :])
    bits = np.stack([(r >> np.uint64(16 * j)) & np.uint64(0xFFFF) for j in range(4)], axis=-1).reshape(len(keys), -1)[:, :dim]
    sign = (bits >> np.uint64(15)) << np.uint64(15)
    exponent = np.uint64(8) + ((bits >> np.uint64(10)) & np.uint64(3))
    v = sign | (exponent << np.uint64(10)) | (bits & np.uint64(0x3FF))
    return v.astype(np.uint16).view(np.float16).astype(np.float32)


# ------------------------------------------------------------------ the tables on disk

def available_memory():
    """MemAvailable of /proc/meminfo in bytes (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def fixture_folder(a, rows):
    """Where the tables are: --fixture, else /dev/shm/<name> if it has room, else --work/<name>."""
    fixture = a.fixture
    if not fixture:
        need = sum(rows) * (8 + 2 * a.dim) * 1.02
        # one folder per shape of rows: a fixture of another dim or scale is not reused
        name = "criteo" if (a.scale, a.dim) == (0.8, 128) else f"criteo_s{a.scale}_d{a.dim}"
        if os.path.isdir("/dev/shm") and not os.path.isdir(os.path.join("/dev/shm", name)):
            # /dev/shm is RAM: fixtures of other shapes this script wrote there go first
            for other in sorted(os.listdir("/dev/shm")):
                if other.startswith("criteo") and other != name:
                    print(f"removing /dev/shm/{other} (another fixture) to make room", flush=True)
                    shutil.rmtree(os.path.join("/dev/shm", other), ignore_errors=True)
        shm_free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
        fixture = os.path.join("/dev/shm", name) if shm_free > need + (8 << 30) else os.path.join(a.work, name)
    return fixture


def prepare(a, rows):
    """The tables written by criteo_fixture unless already there, whole; --host-memory huge_pages
    falls back to mapped (a.host_memory) where the copy would not fit. Returns (the folder, the
    time the check began: setup.json's fixture_seconds count from it)."""
    fixture = fixture_folder(a, rows)
    done = os.path.join(fixture, f"t{TABLES - 1}", "vectors.npy")
    t0 = time.time()
    # the last table's rows exactly (an npy header is under 4 KiB)
    if not os.path.exists(done) or not 0 < os.path.getsize(done) - rows[-1] * a.dim * 2 < 4096:
        subprocess.run([a.fixture_bin, "--out", fixture, "--scale", str(a.scale), "--dim", str(a.dim),
                        "--seed", str(SEED), "--cache-share", str(a.cache_share)], check=True)
    if a.host_memory == "huge_pages" and available_memory() < sum(rows) * a.dim * 2 * 1.1 + (8 << 30):
        # the copy would not fit beside what is in RAM already (the fixture in /dev/shm counts)
        print(f"host_memory: {available_memory() / 1e9:.0f} GB available, too little for a huge-page copy of the rows; "
              "serving them mapped", flush=True)
        a.host_memory = "mapped"
    return fixture, t0
