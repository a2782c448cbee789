#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: set up, build, export the example
# models, serve them with the real tritonserver through libtriton_rust.so, and send
# sample requests to ResNet50 and BERT-large over HTTP and gRPC.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
source scripts/env.sh
bash scripts/build.sh
bash scripts/export_models.sh

export HTTP_PORT="${HTTP_PORT:-8000}" GRPC_PORT="${GRPC_PORT:-8001}" METRICS_PORT="${METRICS_PORT:-8002}"
LOG="$(mktemp -t tritonserver-demo.XXXXXX.log)"
echo "[demo] starting tritonserver (log: $LOG)"
bash scripts/tritonserver.sh --model-control-mode=explicit \
    --load-model=resnet50 --load-model=bert_large --load-model=identity --load-model=fastpitch \
    --load-model=dlrm --load-model=dcnv2 --load-model=wide_deep >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 300); do
    curl -sf "localhost:$HTTP_PORT/v2/health/ready" >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { cat "$LOG"; echo "[demo] tritonserver exited" >&2; exit 1; }
    sleep 1
done
curl -sf "localhost:$HTTP_PORT/v2/health/ready" >/dev/null || { tail -50 "$LOG"; exit 1; }
grep -E "rust backend|ONNX Runtime loaded|torch plugin|successfully loaded|store '" "$LOG" | sed 's/^/[server] /'

MODELS=resnet50,bert_large,fastpitch,dlrm,dcnv2,wide_deep
echo "[demo] HTTP requests"
python examples/client.py --url "localhost:$HTTP_PORT" --models "$MODELS"
echo "[demo] gRPC requests"
python examples/client.py --grpc --url "localhost:$GRPC_PORT" --models "$MODELS"
echo "[demo] server statistics"
curl -s "localhost:$HTTP_PORT/v2/models/resnet50/stats" | python -c \
    'import json,sys; s=json.load(sys.stdin)["model_stats"][0]; print("resnet50: inferences", s["inference_count"], "executions", s["execution_count"])'
echo "[demo] done"
