#!/usr/bin/env bash
# Several runs of one bench/gpu runner in one device call, for A/Bs on one machine (machines
# of a kind differ by more than the settings compared):
#   PYT=/tmp/pyt bash bench/gpu/run_ab.sh run_dense.sh bench/gpu/ab/dense1.txt
#   PYT=/tmp/pyt bash bench/gpu/run_ab.sh run_recsys.sh bench/gpu/ab/next.txt
# Each line of the plan is "<label> [VAR=value ...] <arguments to the runner>" (blank lines and
# # comments skipped; leading VAR=value words are the run's environment, e.g. CARRY=.carry_before
# to serve an earlier build, see gpu_env.sh). A run's archives (*.tgz) are unpacked into $OUT/ab/<label>/ with its logs and
# console; everything comes back as one $OUT/ab.tgz plus $OUT/ab_summary.log (a device call
# returns at most eight files). Each run is stopped after AB_RUN_TIMEOUT seconds (default
# 300) and the archive is rewritten after every run, so a device call that runs out of time
# still brings back the runs it finished. AB_GREP: the console lines copied into the summary.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
runner="$1"
plan="$2"
case "$runner" in
    run_recsys.sh) grep_default='inf/s\|exactness\|no figure\|per execution' ;;
    *) grep_default='^backend: \|^GPU\|^bare \|^check \|served/bare\|^ResNet50\|^BERT\|^FastPitch\|no figure\|backend timing\|fusion strategy' ;;
esac
pattern="${AB_GREP:-$grep_default}"
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
    envs=()
    read -r -a words <<< "$args"
    while [ "${#words[@]}" -gt 0 ] && [[ "${words[0]}" =~ ^[A-Z_][A-Z0-9_]*= ]]; do
        envs+=("${words[0]}")
        words=("${words[@]:1}")
    done
    # (each runner stops its own python under its *_TIMEOUT)
    env "${envs[@]}" OUT="$work/run" RECSYS_TIMEOUT="${AB_RUN_TIMEOUT:-300}" DENSE_TIMEOUT="${AB_RUN_TIMEOUT:-300}" \
        bash "bench/gpu/$runner" "${words[@]}" > "$work/ab/$label.console" 2>&1
    echo "   exit $?" | tee -a "$summary"
    # a run stopped by its timeout can leave its server or client behind, holding the ports
    pkill -9 -f 'tritonserver|perf_analyzer' 2>/dev/null
    mkdir -p "$work/ab/$label"
    for archive in "$work"/run/*.tgz; do
        [ -f "$archive" ] && tar -xzf "$archive" -C "$work/ab/$label" --strip-components=1
    done
    rm -rf "$work/ab/$label/raw"
    cp "$work"/run/*.log "$work"/run/*.txt "$work/ab/$label/" 2>/dev/null
    grep -h "$pattern" "$work/ab/$label.console" | tee -a "$summary"
    rm -rf "$work/run"
    tar -C "$work" -czf "$out/ab.tgz" ab
done < "$plan"
tar -C "$work" -czf "$out/ab.tgz" ab && rm -rf "$work"
