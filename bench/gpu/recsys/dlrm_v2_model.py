"""MLPerf DLRM-v2 as bench/gpu/dlrm_v2_perf.py serves it (examples/dlrm_v2.py): each table's keys
a pair, where each table's keys start in a request's `sparse`, the row's size, MLPerf's mean
query; and the FP8 network's calibration inputs."""
import numpy as np

import dlrm_v2

HOT = dlrm_v2.HOTNESS
WIDTH = sum(HOT)                                   # 214 keys per pair
START = [int(x) for x in np.cumsum([0] + HOT[:-1])]  # each table's first column in `sparse`
DIM = dlrm_v2.DIM
QUERY = 270                                        # MLPerf DLRM-v2's mean pairs per query
ROW_BYTES = DIM * 2                                # an fp16 row


def calibration(a):
    """The FP8 network's calibration inputs (examples/dlrm_v2.py), None for fp16."""
    return dlrm_v2.calibration_inputs() if a.network_precision == "fp8" else None
