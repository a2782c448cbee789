#!/usr/bin/env bash
# Remakes the committed performance reports (docs/perf/h100/<report>/) from the committed GPU
# results: one folder per benchmark under bench/gpu/results/ (its README), each replaced whole by
# a re-run. CPU only; plots need matplotlib (.venv). Extra arguments (e.g. --no-plots) go to every
# report script; OUT_ROOT (default docs/perf/h100) says where the reports go.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
py="${PYTHON:-.venv/bin/python}"
r=bench/gpu/results
out="${OUT_ROOT:-docs/perf/h100}"
# ResNet50, BERT-large, FastPitch (TorchScript) and their ONNX twins served vs the bare engine
# (run.sh dense: each folder keeps perf_analyzer's CSVs and the bare figures in its perf.tgz)
"$py" bench/gpu/report.py --perf "$r/dense/resnet50" "$r/dense/bert" "$r/dense/fastpitch" "$r/dense/onnx" \
    --out "$out/dense" "$@"
# DLRM, DCNv2, Wide&Deep at Criteo scale against the all-in-HBM ceiling (run.sh recommenders:
# each folder keeps recsys_perf.py's files in its recsys.tgz)
"$py" bench/gpu/recsys_report.py --runs "$r/recommenders/dlrm" "$r/recommenders/dcnv2" "$r/recommenders/wide_deep" \
    --out "$out/recommenders" "$@"
# AOTInductor packages (run.sh aoti MODEL): ResNet50 and BERT-large swept, then at batch 1 (also
# through perf_analyzer's C API); the recommenders as one model on an AOTInductor network
# (run.sh aoti-recsys): the four targets, then Merlin HPS's four points with system shared memory
a="$r/aoti"
s="$r/aoti-recsys"
"$py" bench/gpu/aoti_report.py \
    --dense "$a/resnet50" "$a/resnet50_b1" "$a/resnet50_b1_variants" "$a/resnet50_b1_gaps" "$a/bert" "$a/bert_b1" \
    --recsys "$s/dlrm_65536" "$s/dlrm_4096" "$s/wide_deep_131072" "$s/dcnv2_65536" "$s/hps_points_system_shm" \
    --out "$out/aoti" "$@"
