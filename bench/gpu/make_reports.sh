#!/usr/bin/env bash
# Remakes the committed performance reports (docs/perf/h100/<benchmark>/) from the committed GPU
# results (bench/gpu/results/): one report per benchmark. CPU only; plots need matplotlib
# (.venv). Extra arguments (e.g. --no-plots) go to both report scripts; OUT_ROOT (default
# docs/perf/h100) says where the reports go.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
py="${PYTHON:-.venv/bin/python}"
r=bench/gpu/results
out="${OUT_ROOT:-docs/perf/h100}"
# ResNet50, BERT-large, FastPitch (TorchScript) and their ONNX twins: served vs the bare engine
"$py" bench/gpu/report.py --perf "$r/dense_h100/resnet50" "$r/dense_h100/bert" "$r/dense_h100/fastpitch" \
    "$r/dense_h100/onnx" --out "$out/dense" "$@"
# DLRM, DCNv2, Wide&Deep at Criteo scale against the all-in-HBM ceiling
"$py" bench/gpu/recsys_report.py --runs "$r/recommenders_h100/dlrm" "$r/recommenders_h100/dcnv2" \
    "$r/recommenders_h100/wide_deep" --out "$out/recommenders" "$@"
# AOTInductor packages: ResNet50 and BERT-large (batch 1 also through perf_analyzer's C API),
# the recommenders as one model with one and with two GPU instances
# (aoti_h100_c: packages exported at the batch they serve, DLRM's interaction as a Triton kernel)
# (aoti_h100_d: batch 1 with the bare call host-timed; DLRM 4096 over gRPC, HTTP and gRPC streaming;
# DCNv2's cross layers as a Triton kernel; each one model also under an endless stream whose
# cache hit rate is the stationary one)
# (aoti_h100_e: the instances of a model share one GPU cache of 10% (gpucache_sharing device); batch 1
# with --largest-concurrency 1, C API included; aoti_h100_e_seqlock: the shared cache with a stream per
# instance, a design measured and not kept, see its README)
# (aoti_h100_f: fp16 cache rows, each instance's miss copies on its own stream, one reset kernel per
# fill; builds per folder in its README; aoti_h100_f_prefetch: a change measured and not kept)
# (aoti_h100_g: the batch lookup's keys a warp, A/B pairs on one machine; DCNv2's cross-layer
# kernel tried further; builds per folder in its README)
# (aoti_h100_h: batch 1 step by step from the verbose timing lines, host inputs staged straight into
# the graph's; main's build served; builds per folder in its README)
# (aoti_h100_i: A/B runs in one call each (ab.sh, aoti_perf.py --capi-variants): batch 1's staging
# and scheduler, the parallel read of missed rows; builds per folder in its README)
# (aoti_h100_j: the four recommender targets on main's final build with the checks after the runs;
# reloads with CUDA graphs asked for, a failed capture's pool before and after its fix)
b="$r/aoti_h100_b"
c="$r/aoti_h100_c"
d="$r/aoti_h100_d"
e="$r/aoti_h100_e"
f="$r/aoti_h100_f"
g="$r/aoti_h100_g"
h="$r/aoti_h100_h"
i="$r/aoti_h100_i"
j="$r/aoti_h100_j"
"$py" bench/gpu/aoti_report.py --dense "$b/resnet50" "$b/resnet50_b1_timing" "$d/resnet50_b1_pinned" \
    "$e/resnet50_b1_capi" "$f/resnet50_b1_vB" "$g/resnet50_b1_gaps" \
    "$h/resnet50_b1_sys_verbose" "$h/resnet50_b1_nobatcher" "$h/resnet50_b1_sys_staged" "$h/resnet50_b1_sys_staged_b" \
    "$h/resnet50_b1_sys_raw_memcpy" "$h/resnet50_b1_sys_staged_c" "$i/resnet50_b1_capi_ab" "$b/bert_large" "$d/bert_b1_pinned" "$e/bert_b1_capi" "$h/bert_b1_main" \
    --recsys "$r/aoti_h100/recsys_dlrm" "$b/recsys_dlrm_two_instances" "$b/recsys_dlrm_two_instances_4096" \
    "$c/recsys_dlrm_triton" "$c/recsys_dlrm_triton_ens_ceiling" "$c/recsys_dlrm_triton_4096" \
    "$d/recsys_dlrm_stream" "$d/recsys_dlrm_stream_3inst" "$d/recsys_dlrm_4096_protocols" \
    "$r/aoti_h100/recsys_dcnv2_wide_deep" "$b/recsys_dcnv2_wide_deep_two_instances" \
    "$c/recsys_wide_deep_dcnv2_example_batch" "$d/recsys_dcnv2_cross" \
    "$e/recsys_dlrm_shared_3inst" "$e/recsys_dlrm_sharedq_3inst" "$e/recsys_dlrm_shared_4inst" \
    "$e/recsys_dlrm_shared_5inst" "$e/recsys_dlrm_4096_shared" \
    "$r/aoti_h100_e_seqlock/recsys_wide_deep_shared_seqlock" \
    "$f/recsys_dlrm_fp16rows_3inst" "$f/recsys_dlrm_4096_fp16rows" "$f/recsys_dlrm_fp16rows_ownstream_3inst" \
    "$f/recsys_dlrm_fp16rows_ownstream_4inst" "$f/recsys_dlrm_fp16rows_ownstream_5inst" \
    "$f/recsys_dlrm_fp16rows_ownstream_6inst" "$f/recsys_dlrm_4096_fp16rows_ownstream" \
    "$f/recsys_wide_deep_fp16rows_ownstream" "$f/recsys_wide_deep_4inst" "$f/recsys_dcnv2_fp16rows_ownstream" \
    "$f/recsys_dcnv2_cross_fp16rows_ownstream" "$r/aoti_h100_f_prefetch/recsys_dlrm_prefetch_5inst" \
    "$r/aoti_h100_f_prefetch/recsys_dlrm_prefetch_4inst" "$r/aoti_h100_f_prefetch/recsys_dlrm_4096_prefetch" \
    "$r/aoti_h100_f_prefetch/recsys_dlrm_4096_prev_ab" "$r/aoti_h100_f_prefetch/recsys_dlrm_prev_ab_5inst" \
    "$f/recsys_dlrm_5inst_prev" "$f/recsys_dlrm_5inst_vA" "$f/recsys_dlrm_5inst_vB" \
    "$f/recsys_wide_deep_4inst_vB" "$f/recsys_dlrm_4096_vB" "$f/recsys_dcnv2_cross_vB" \
    "$g/recsys_dcnv2_first_5inst" "$g/recsys_dcnv2_best" "$g/recsys_dcnv2_rows" "$g/recsys_dcnv2_warp_per_key" \
    "$g/recsys_dcnv2_halfwarp" "$g/recsys_dcnv2_halfwarp_b" "$g/recsys_dcnv2_quarterwarp" "$g/recsys_dcnv2_eighthwarp" \
    "$g/recsys_dcnv2_quarterwarp_b" "$g/recsys_dlrm_5inst_quarterwarp" "$g/recsys_dlrm_4096_quarterwarp" \
    "$g/recsys_dlrm_4096_quarterwarp_b" "$g/recsys_dlrm_4096_warp_per_key_b" "$g/recsys_dlrm_4096_quarterwarp_c" \
    "$g/recsys_wide_deep_4inst_quarterwarp" "$h/recsys_dcnv2_main" "$h/recsys_dlrm_4096_main" \
    "$h/recsys_dlrm_4096_main_b" "$i/recsys_dlrm_4096_main_1" "$i/recsys_dlrm_4096_per256_2" \
    "$i/recsys_dlrm_4096_main_3" "$i/recsys_dcnv2_per256_1" "$i/recsys_dcnv2_main_2" \
    "$i/recsys_dlrm_4096_per256_b" "$i/recsys_dcnv2_graph_input" \
    "$j/recsys_dlrm_65536" "$j/recsys_dlrm_4096" "$j/recsys_wide_deep_131072" "$j/recsys_dcnv2_65536" --out "$out/aoti" "$@"
