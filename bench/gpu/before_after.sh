#!/usr/bin/env bash
# Runs one bench/gpu/run.sh subcommand twice in one device call, first with the backend and
# plugin libraries of an earlier build (.carry_before/, made by `bash bench/gpu/pack.sh
# --before REV`), then with today's (.carry/), and prints both runs' throughput lines side by
# side: a change's effect measured on one machine, in one call.
#
#   run(command="bash bench/gpu/before_after.sh recommenders --scale 0.05 --models dlrm ...",
#       carry=[".carry", ".carry_pa", ".carry_before"], timeout_s=600)
#
# ORDER="after before" runs today's first (the second run of a call can differ from the first:
# run both orders before reading a difference as the change's).
# Results: $OUT/before-after/{before,after}/ (each run.sh's results folder) and summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
sub="$1"
libs="libtriton_rust.so libtriton_rust_torch.so libtriton_rust_torch_cuda.so libtriton_rust_aoti.so"
for f in $libs; do
    [ -f ".carry_before/$f" ] || { echo "before_after: .carry_before/$f missing (bash bench/gpu/pack.sh --before REV)"; exit 2; }
done
out="${OUT:-/tmp/out}/before-after"
mkdir -p "$out" /tmp/carry_after
for f in $libs; do cp ".carry/$f" /tmp/carry_after/; done
rc=0
for side in ${ORDER:-before after}; do
    src=.carry_before; [ "$side" = after ] && src=/tmp/carry_after
    for f in $libs; do cp "$src/$f" ".carry/$f"; done
    echo "== $side: $(md5sum .carry/libtriton_rust.so | cut -c1-12)"
    bash bench/gpu/run.sh "$@" > "$out/$side.log" 2>&1 || rc=1
    rm -rf "$out/$side"; mv "${OUT:-/tmp/out}/$sub" "$out/$side" 2>/dev/null
    grep -E "inf/s|M pairs/s|exactness|exit" "$out/$side.log"
done
{
    echo "run.sh $*: throughput before (left) and after (right), one machine, one call, run in the order: ${ORDER:-before after}"
    paste <(grep "inf/s" "$out/before.log" | awk '{print $1, $3, $4, $5, $6}') \
          <(grep "inf/s" "$out/after.log" | awk '{print $5, $6}')
    # dlrm-v2's run lines (pairs/s), each side's in its order
    for side in before after; do
        grep -E "^ +[a-z].* M pairs/s" "$out/$side.log" 2>/dev/null | sed "s/^ */$side: /"
    done
} | tee "$out/summary.txt"
exit $rc
