#!/usr/bin/env bash
# Several recsys_perf.py runs in one device call, for A/Bs: each line of the plan file is
# "<label> <arguments to run_recsys.sh>" (blank lines and # comments skipped). Each run's
# results are unpacked into $OUT/ab/<label>/ (console in recsys.log there); everything comes
# back as one $OUT/ab.tgz plus $OUT/ab_summary.log (a device call returns at most eight files).
# The fixture stays in /dev/shm between runs of one dim, so only the first run writes it.
# With BENCH=1 the plan starts with .carry/batch_lookup_bench (the lookup alone).
# Each run is stopped after AB_RUN_TIMEOUT seconds (default 300) and the archive is rewritten
# after every run, so a device call that runs out of time still brings back the runs it finished.
#   PYT=/tmp/pyt bash bench/gpu/run_recsys_ab.sh bench/gpu/ab/next.txt
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
plan="$1"
out="${OUT:-/tmp/out}"
work="$(mktemp -d /tmp/ab.XXXX)"
mkdir -p "$out" "$work/ab"
summary="$out/ab_summary.log"
: > "$summary"
if [ "${BENCH:-0}" = 1 ]; then
    . bench/gpu/gpu_env.sh
    timeout 120 .carry/batch_lookup_bench --iters 15 2>&1 | tee "$work/ab/batch_lookup_bench.log" | tee -a "$summary"
fi
while read -r label args; do
    case "$label" in ''|'#'*) continue ;; esac
    echo "== $label: $args" | tee -a "$summary"
    # shellcheck disable=SC2086
    OUT="$work/run" RECSYS_TIMEOUT="${AB_RUN_TIMEOUT:-300}" bash bench/gpu/run_recsys.sh $args > "$work/ab/$label.console" 2>&1
    echo "   exit $?" | tee -a "$summary"
    # a run stopped by its timeout can leave its server or client behind, holding the ports
    pkill -9 -f 'tritonserver|perf_analyzer' 2>/dev/null
    mkdir -p "$work/ab/$label"
    if [ -f "$work/run/recsys.tgz" ]; then
        tar -xzf "$work/run/recsys.tgz" -C "$work/ab/$label" --strip-components=1
        rm -rf "$work/ab/$label/raw"
        cp "$work/run/recsys.log" "$work/run/gpu.txt" "$work/ab/$label/" 2>/dev/null
        grep -h "inf/s\|exactness\|no figure\|per execution" "$work/run/recsys.log" | tee -a "$summary"
    fi
    rm -rf "$work/run"
    tar -C "$work" -czf "$out/ab.tgz" ab
done < "$plan"
tar -C "$work" -czf "$out/ab.tgz" ab && rm -rf "$work"
