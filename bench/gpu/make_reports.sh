#!/usr/bin/env bash
# Regenerates every committed performance report (docs/perf/h100/) from the committed GPU
# results (bench/gpu/results/): the dense models served vs the bare engine (TorchScript and
# ONNX Runtime) and the recommenders at Criteo scale. CPU only; plots need matplotlib
# (.venv). Extra arguments (e.g. --no-plots) go to every report script; OUT_ROOT (default
# docs/perf/h100) says where the reports go.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
py="${PYTHON:-.venv/bin/python}"
r=bench/gpu/results
out="${OUT_ROOT:-docs/perf/h100}"
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/resnet50" "$r/dense_perf_h100/bert_fastpitch" --out "$out" "$@"
# 2026-11-24 and 25, every CPU kept polling: the dense models' offline and online sweeps
# (TorchScript, ONNX Runtime; one machine) and the recommenders' whole sweeps with their ceilings
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/nov25_resnet50" "$r/dense_perf_h100/nov25_bert" \
    "$r/dense_perf_h100/nov25_fastpitch" "$r/dense_perf_h100/nov25_onnx" --out "$out/dense_nov25" "$@"
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov25_dlrm" "$r/recsys_h100/nov25_dcnv2" "$r/recsys_h100/nov25_wide_deep_sweep" \
    --out "$out/recsys_nov25" "$@"
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/issue9_resnet50" "$r/dense_perf_h100/issue9_bert_fastpitch" \
    --out "$out/served_vs_bare" "$@"
# issue 9, 2026-11-23 fourth session: CUDA graphs, gRPC and HTTP, TORCH_FUSION_STRATEGY=STATIC:20;
# one machine for the final run (TorchScript, ONNX Runtime, FastPitch, online), another for the rerun
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/nov23d_final_resnet50_onnx_fastpitch" "$r/dense_perf_h100/nov23d_final_bert" \
    --out "$out/served_vs_bare_nov23d" "$@"
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/nov23d_rerun" --out "$out/served_vs_bare_nov23d_rerun" "$@"
# 2026-11-24: the build with graph-staged inputs and pinned host outputs (ResNet50, its ONNX twin, FastPitch; BERT not run)
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/nov24_final_attempt" --out "$out/served_vs_bare_nov24" "$@"
# 2026-11-24, later: every CPU kept polling for the run (--cpu-poll-idle yield), the final run's two
# commands on one machine (issue 9's targets), and the same on the machine before with bare spinning loops
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/nov24b_final_resnet50_onnx_fastpitch" "$r/dense_perf_h100/nov24b_final_bert" \
    --out "$out/served_vs_bare_nov24b" "$@"
"$py" bench/gpu/report.py --perf "$r/dense_perf_h100/nov24b_spin_resnet50_onnx_fastpitch" "$r/dense_perf_h100/nov24b_spin_bert" \
    --out "$out/served_vs_bare_nov24b_spin" "$@"
# the latest sweeps: the inputs in CUDA shared memory (keys and dense features already on the GPU,
# as the ceiling has them), 2026-11-23 third session
# DLRM and DCNv2 at 4096 and 65536 with their ceilings, every CPU kept polling, 2026-11-24
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov24b_targets_poll" --out "$out/recsys_poll" "$@"
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov23c_dlrm_cuda" "$r/recsys_h100/nov23c_dcnv2_cuda" \
    --out "$out/recsys_cuda" "$@"
# batch 4096 and 65536 alone, two single-model instances of a 5% cache each, CUDA shared memory
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov23c_two_inst_cuda" --out "$out/recsys_two_inst" "$@"
# the sweeps with system shared memory (fp16 rows into the networks, split interaction, graphs at <= 16384 rows)
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov23b_dlrm" "$r/recsys_h100/nov23b_dcnv2" "$r/recsys_h100/nov23b_wide_deep" \
    --out "$out/recsys" "$@"
# the same build's DLRM at batch 4096 and 65536 alone (the sweep's first minutes ran slow)
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov23b_dlrm_fp16" --out "$out/recsys_c1" "$@"
# the sweeps before (fp32 rows, cat interaction, eager networks)
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov23_dlrm" "$r/recsys_h100/nov23_dcnv2" "$r/recsys_h100/nov23_wide_deep_room" \
    --out "$out/recsys_nov23a" "$@"
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/nov23_dlrm_room" --out "$out/recsys_room" "$@"
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/dlrm" "$r/recsys_h100/dcnv2" --out "$out/recsys_first" "$@"
"$py" bench/gpu/recsys_report.py --runs "$r/recsys_h100/dlrm_graphs" --out "$out/recsys_graphs" "$@"
