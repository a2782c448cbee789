#!/usr/bin/env bash
# Issue 8 on the GPU machine: DLRM and DCNv2 at Criteo scale through the real tritonserver,
# ensemble and single model, against the all-in-HBM ceiling (bench/gpu/recsys_perf.py).
# Expects $PYT (the unpacked nvidia-pytriton wheel), .carry/ (pack.sh: the backend and
# criteo_fixture) and .carry_pa/ (the perf-analyzer 2.60.0 wheel). Extra arguments go to
# recsys_perf.py; results land in $OUT/recsys.tgz.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. bench/gpu/gpu_env.sh
if [ ! -x /tmp/pa/perf_analyzer/bin/perf_analyzer ]; then
    pip install --quiet --no-index --no-deps --target /tmp/pa .carry_pa/perf_analyzer-*.whl
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
# the host as well: runs on machines of one kind have differed by a quarter (2026-11-23)
{ nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.width.current,clocks.max.sm,clocks.max.mem --format=csv
  nvidia-smi topo -m; lscpu | grep -E "Model name|^CPU\(s\)|NUMA|Thread|MHz"; uname -r; } > "$out/host.txt" 2>&1
free -g | head -2; df -h /dev/shm /tmp | tail -2
set +e
# the machine's state through the run, timestamped (the DLRM sweep of 2026-11-23 ran slow for its
# first minutes with nothing on the console to say why): CPU, memory and steal every 5 s; the
# GPU's power, utilisation and clocks every 2 s
mkdir -p "$out/recsys"
vmstat -t 5 > "$out/recsys/vmstat.log" 2>&1 &
vm=$!
nvidia-smi dmon -s puc -d 2 -o T > "$out/recsys/gpu_dmon.log" 2>&1 &
dm=$!
# RECSYS_TIMEOUT=seconds stops the benchmark (not the packing of what it wrote) in time
${RECSYS_TIMEOUT:+timeout "$RECSYS_TIMEOUT"} python3 bench/gpu/recsys_perf.py --server "$PYT/pytriton/tritonserver/bin/tritonserver" --backends /tmp/rust_backends \
    --perf-analyzer /tmp/pa/perf_analyzer/bin/perf_analyzer --fixture-bin .carry/criteo_fixture \
    --libtorch-dir "$TORCH_DIR/lib" "$@" 2>&1 | tee "$out/recsys.log"
rc=${PIPESTATUS[0]}
kill "$vm" "$dm" 2>/dev/null
if grep -q "timing:" "$out/recsys/server.log" 2>/dev/null; then
    python3 bench/gpu/timing_summary.py "$out/recsys/server.log" | tee "$out/recsys/timing_summary.txt"
fi
# a verbose log is too big to come back whole: keep its end
if [ "$(stat -c %s "$out/recsys/server.log" 2>/dev/null || echo 0)" -gt 4000000 ]; then
    tail -c 2000000 "$out/recsys/server.log" > "$out/recsys/server_tail.log" && rm "$out/recsys/server.log"
fi
cp "$out/host.txt" "$out/recsys/" 2>/dev/null
tar -C "$out" -czf "$out/recsys.tgz" recsys && rm -rf "$out/recsys"
exit "$rc"
