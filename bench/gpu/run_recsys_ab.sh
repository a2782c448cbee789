#!/usr/bin/env bash
# Several recsys_perf.py runs in one device call, for A/Bs: each line of the plan file is
# "<label> <arguments to run_recsys.sh>" (blank lines and # comments skipped). Each run's
# results are unpacked into $OUT/ab/<label>/ (console in recsys.log there); everything comes
# back as one $OUT/ab.tgz plus $OUT/ab_summary.log (a device call returns at most eight files).
# The fixture stays in /dev/shm between runs of one dim, so only the first run writes it.
# With BENCH=1 the plan starts with .carry/batch_lookup_bench (the lookup alone).
#   PYT=/tmp/pyt bash bench/gpu/run_recsys_ab.sh bench/gpu/ab/next.txt
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
plan="$1"
out="${OUT:-/tmp/out}"
mkdir -p "$out/ab"
summary="$out/ab_summary.log"
: > "$summary"
if [ "${BENCH:-0}" = 1 ]; then
    . bench/gpu/gpu_env.sh
    timeout 120 .carry/batch_lookup_bench --iters 15 2>&1 | tee "$out/ab/batch_lookup_bench.log" | tee -a "$summary"
fi
while read -r label args; do
    case "$label" in ''|'#'*) continue ;; esac
    echo "== $label: $args" | tee -a "$summary"
    # shellcheck disable=SC2086
    OUT="$out/run" bash bench/gpu/run_recsys.sh $args > "$out/ab/$label.console" 2>&1
    echo "   exit $?" | tee -a "$summary"
    mkdir -p "$out/ab/$label"
    if [ -f "$out/run/recsys.tgz" ]; then
        tar -xzf "$out/run/recsys.tgz" -C "$out/ab/$label" --strip-components=1
        rm -rf "$out/ab/$label/raw"
        cp "$out/run/recsys.log" "$out/run/gpu.txt" "$out/ab/$label/" 2>/dev/null
        grep -h "inf/s\|exactness\|no figure\|per execution" "$out/run/recsys.log" | tee -a "$summary"
    fi
    rm -rf "$out/run"
done < "$plan"
tar -C "$out" -czf "$out/ab.tgz" ab && rm -rf "$out/ab"
