#!/usr/bin/env bash
# Several recsys_perf.py runs in one device call (bench/gpu/run_ab.sh with run_recsys.sh):
# each line of the plan file is "<label> <arguments to run_recsys.sh>"; results in $OUT/ab.tgz
# and $OUT/ab_summary.log. The fixture stays in /dev/shm between runs of one dim, so only the
# first run writes it. With BENCH=1 the plan starts with .carry/batch_lookup_bench.
#   PYT=/tmp/pyt bash bench/gpu/run_recsys_ab.sh bench/gpu/ab/next.txt
exec bash "$(dirname "${BASH_SOURCE[0]}")/run_ab.sh" run_recsys.sh "$1"
