"""Every committed performance report (docs/perf/h100/<benchmark>/) is what bench/gpu/make_reports.sh makes
from the committed GPU results (bench/gpu/results/): the tables, figure for figure (the plots
are left out here; their lines are not compared)."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
REPORTS = ["aoti", "dense", "recommenders"]


def text(path):
    with open(path) as f:
        return [line for line in f.read().splitlines() if line.strip() and not line.startswith("![")]


def test_committed_reports_come_from_committed_results(tmp_path):
    env = dict(os.environ, OUT_ROOT=str(tmp_path), PYTHON=sys.executable)
    subprocess.run(["bash", os.path.join(ROOT, "bench", "gpu", "make_reports.sh"), "--no-plots"], check=True, env=env,
                   capture_output=True)
    for sub in REPORTS:
        made = text(os.path.join(tmp_path, sub, "report.md"))
        committed = text(os.path.join(ROOT, "docs", "perf", "h100", sub, "report.md"))
        assert made == committed, f"docs/perf/h100/{sub}/report.md differs from what make_reports.sh makes"
        assert any(line.startswith("| ") for line in made), sub
    committed = sorted(e for e in os.listdir(os.path.join(ROOT, "docs", "perf", "h100")))
    assert committed == sorted(REPORTS), f"docs/perf/h100 holds {committed}: only the reports make_reports.sh makes"
