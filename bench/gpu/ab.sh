#!/usr/bin/env bash
# Builds of libtriton_rust.so (or of a plugin) served in turn by one run.sh subcommand, in one
# device call, so that an A/B is not confounded by the machine: machines and their hosts drift
# from call to call and within minutes (docs/performance.md). Each run's folder is
# $OUT/<name>_<k>_<label>; every folder is packed into $OUT/<name>.tgz and its consoles
# are kept beside it (a device call returns at most eight files).
#
#   bash bench/gpu/ab.sh NAME FILE ORDER DEADLINE_S LABEL=BUILD... -- SUBCOMMAND ARGS...
#
#   FILE      the .carry file each build replaces (libtriton_rust.so, libtriton_rust_aoti.so)
#   ORDER     labels in the order they run, e.g. ABAB (one letter per run; A is the first
#             LABEL=BUILD, B the second, ...)
#   DEADLINE  no run starts after this many seconds (a device call has 600)
#
# e.g. bash bench/gpu/ab.sh dlrm4096 libtriton_rust.so ABAB 420 main=.carry/libtriton_rust.so \
#        per256=.carry/variants/libtriton_rust_per256.so -- aoti-recsys --models dlrm ...
set -u
name="$1" file="$2" order="$3" deadline="$4"; shift 4
# every build is copied aside first: one of them may be the .carry file itself
snap="$(mktemp -d)"
labels=(); builds=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    labels+=("${1%%=*}"); builds+=("$snap/${#labels[@]}"); cp "${1#*=}" "${builds[-1]}" || exit 2; shift
done
[ "${1:-}" = "--" ] || { echo "ab.sh: LABEL=BUILD ... -- SUBCOMMAND ARGS" >&2; exit 2; }
shift
out="${OUT:-/tmp/out}"
kept="$(mktemp)"
cp ".carry/$file" "$kept"
start=$SECONDS
k=0
for letter in $(echo "$order" | grep -o .); do
    i=$(( $(printf '%d' "'$letter") - 65 ))
    [ "$i" -ge 0 ] && [ "$i" -lt "${#labels[@]}" ] || { echo "ab.sh: no build for '$letter'" >&2; continue; }
    if [ $((SECONDS - start)) -ge "$deadline" ]; then
        echo "ab.sh: run $((k + 1)) (${labels[$i]}) not started: past ${deadline} s"; break
    fi
    k=$((k + 1))
    cp "${builds[$i]}" ".carry/$file"
    echo "=== ab.sh run $k: ${labels[$i]} ($file md5 $(md5sum ".carry/$file" | cut -c1-12)) at $((SECONDS - start)) s"
    bash bench/gpu/run.sh --results "$out/${name}_${k}_${labels[$i]}" "$@" 2>&1 | tail -12
done
cp "$kept" ".carry/$file"
rm -rf "$kept" "$snap"
cd "$out" || exit 1
for d in "${name}"_*/; do
    [ -f "$d/console.log" ] && cp "$d/console.log" "${d%/}.console.log"
done
tar czf "${name}.tgz" "${name}"_*/ && rm -rf "${name}"_*/
echo "ab.sh: $k runs in $((SECONDS - start)) s; $out/${name}.tgz"
