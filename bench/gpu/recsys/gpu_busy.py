"""The GPU's busy share over a run: nvidia-smi's utilization (the share of each sample's time in
which a kernel ran), sampled every 100 ms while the run lasts. A crude share (one kernel on one SM
counts as busy), but the one a reader of a served rate asks for: how much of the GPU the run used.
Each sample carries nvidia-smi's clock, so a run made of several timed spans (an endless stream's
passes, with keys drawn on the GPU between them) counts the samples inside its spans only.
"""
import subprocess
from datetime import datetime


def sample_time(text):
    """nvidia-smi's timestamp ('2026/11/29 12:00:00.123', local time) as seconds since the epoch."""
    return datetime.strptime(text.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()


def mean_busy(lines, spans=None):
    """The mean utilization of nvidia-smi's 'timestamp, utilization' lines; with `spans`
    ([(start, end)] in time.time()'s seconds) only of the samples inside one of them."""
    values = []
    for line in lines:
        try:
            stamp, value = line.split(",")
            t, v = sample_time(stamp), float(value)
        except ValueError:
            continue
        if spans is None or any(s <= t <= e for s, e in spans):
            values.append(v)
    return sum(values) / len(values) if values else None


class GpuBusy:
    """Starts sampling GPU `gpu`; `stop(spans)` returns the mean busy percent (None without nvidia-smi)."""

    def __init__(self, gpu=0, period_ms=100):
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", f"--id={gpu}", "--query-gpu=timestamp,utilization.gpu",
                 "--format=csv,noheader,nounits", "-lms", str(period_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None

    def stop(self, spans=None):
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return mean_busy(out.splitlines(), spans)
