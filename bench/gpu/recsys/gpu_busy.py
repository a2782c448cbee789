"""The GPU's busy share over a run: nvidia-smi's utilization (the share of each sample's time in
which a kernel ran), sampled every 100 ms while the run lasts. A crude share (one kernel on one SM
counts as busy), but the one a reader of a served rate asks for: how much of the GPU the run used.
"""
import subprocess


class GpuBusy:
    """Starts sampling GPU `gpu`; `stop()` returns the mean busy percent (None without nvidia-smi)."""

    def __init__(self, gpu=0, period_ms=100):
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", f"--id={gpu}", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", str(period_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None

    def stop(self):
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        values = []
        for line in out.splitlines():
            try:
                values.append(float(line.strip()))
            except ValueError:
                continue
        return sum(values) / len(values) if values else None
