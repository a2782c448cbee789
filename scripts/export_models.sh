#!/usr/bin/env bash
# Writes the model files of every example model in models/ (the configs are committed; the
# files are made here: real architectures, weights from a fixed seed). A model whose file is
# already there is left as it is, so running it again is quick; --force (passed on) rebuilds.
#
#   bash scripts/export_models.sh [--force]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
# Inductor's compile cache (precompiled headers and kernels, about 0.9 GB for the packages below)
# lives for this run only, unless the caller chose where it goes.
# It goes in memory (/dev/shm) where that has 2 GiB to spare, so that it takes no disk from the
# packages it builds (a CI run once stopped here with 211 MiB of disk left).
if [ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ]; then
    where="${TMPDIR:-/tmp}"
    if [ "$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')" -gt $((2 << 20)) ] 2>/dev/null; then
        where=/dev/shm
    fi
    TORCHINDUCTOR_CACHE_DIR="$(mktemp -d -p "$where" inductor-cache.XXXXXX)"
    export TORCHINDUCTOR_CACHE_DIR
    trap 'rm -rf "$TORCHINDUCTOR_CACHE_DIR"' EXIT
fi
python examples/export_models.py --repo models --models resnet50,bert_large,bert_small,identity "$@"
python examples/torch_models.py --repo models --models fastpitch,resnet50_pt,bert_small_pt,bert_large_pt "$@"
python examples/recommenders.py --repo models --models dlrm,dcnv2,wide_deep "$@"
python examples/dlrm_v3/export.py --repo models "$@"  # an AOTInductor package too (about a minute)
# AOTInductor packages (CPU; 30-60 s of compiling each on two cores)
python examples/aoti_export.py --repo models --models resnet50_aoti,bert_small_aoti,dlrm_dense_aoti,dcnv2_dense_aoti,wide_deep_dense_aoti,dlrm_aoti,fastpitch_aoti "$@"
