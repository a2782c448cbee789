"""MLPerf DLRM-v2's shape as bench/gpu/dlrm_v2_fair.py needs it, the served exactness check's
number of pairs, and the console line every phase prints. Written out rather than read from
examples/dlrm_v2.py (recsys/dlrm_v2_model.py): that imports torch, and the driver, --help and
--report-only run without it."""

HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]  # dlrm_v2.HOTNESS
DIM = 128
TABLES = 26
EXACT_PAIRS = 16 * 270  # dlrm_v2_perf's exactness check: 16 requests of 270 pairs (seed 46)


def log(msg):
    print(msg, flush=True)
