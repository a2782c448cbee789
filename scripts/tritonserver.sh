#!/usr/bin/env bash
# Runs the real tritonserver with this backend and the example model repository.
#
#   bash scripts/tritonserver.sh [extra tritonserver flags...]
#
# HTTP_PORT/GRPC_PORT/METRICS_PORT (default 8000/8001/8002) and MODEL_REPOSITORY
# (default ./models) can be set in the environment.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$TRITONSERVER" \
    --model-repository="${MODEL_REPOSITORY:-$REPO_ROOT/models}" \
    --backend-directory="$REPO_ROOT/install/backends" \
    --backend-config=rust,onnxruntime-library="$ORT_LIB" \
    ${LIBTORCH_DIR:+--backend-config=rust,libtorch-dir="$LIBTORCH_DIR"} \
    --http-port="${HTTP_PORT:-8000}" --grpc-port="${GRPC_PORT:-8001}" --metrics-port="${METRICS_PORT:-8002}" \
    "$@"
