#!/usr/bin/env bash
# minfer-server under concurrent streaming clients on a GPU machine, from what scripts/device-pack.sh packed
# (issue 14): the 7B-shaped model (qwen2-7b Q4_K_M, synthesized and compiled as scripts/device-decode.sh does)
# served with -np NP on a free loopback port; once /health answers, minfer-server-bench drives C streaming
# clients, each sending prompts of 128 token ids with max_tokens 128 through end-of-generation (ignore_eos;
# llama-batched-bench's 128 + 128), back to back for MINFER_SERVE_SECONDS (default 40) after one warm-up
# request each, and prints requests/s, aggregate generated tokens/s, p50/p99 time to first token and
# inter-token latency. Runs "NP:C" for each pair of MINFER_SERVE_RUNS (default "32:32 64:64").
# Logs in $OUT: serve-npNP-cC.log (the bench), serve-npNP-cC.server.log, serve-npNP-cC.metrics.txt.
# MINFER_SERVE_MODEL=artifact MINFER_SERVE_DEVICE=cpu serve that artifact instead (the CPU check of this script:
# stories260K compiled without kernels).
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
RUNS=${MINFER_SERVE_RUNS:-"32:32 64:64"}
SECS=${MINFER_SERVE_SECONDS:-40}
P=${MINFER_SERVE_PROMPT:-128}
N=${MINFER_SERVE_TOKENS:-128}
DEVICE=${MINFER_SERVE_DEVICE:-cuda}
MODEL=${MINFER_SERVE_MODEL:-}

# The server needs the packed cpp-httplib and the machine's OpenSSL, zlib and libstdc++.
if ldd "$B/minfer-server" | grep "not found"; then
  echo "device-serve: minfer-server lacks the libraries above" | tee "$OUT/serve.log"; exit 1
fi
if [ -z "$MODEL" ]; then
  [ -f /tmp/q7.gguf ] || timeout 60 "$B/minfer-synth" qwen2-7b --types q4_k_m -o /tmp/q7.gguf
  [ -f /tmp/q7.mfb ] || timeout 120 "$B/minfer-compile" /tmp/q7.gguf -o /tmp/q7.mfb
  MODEL=/tmp/q7.mfb
fi

# GET http://127.0.0.1:$1$2 → stdout; fails when the server does not answer 200.
http_get() {
  python3 -c 'import sys, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:" + sys.argv[1] + sys.argv[2], timeout=5).read().decode(), end="")' "$@" 2>/dev/null
}

status=0
for run in $RUNS; do
  np=${run%%:*}; clients=${run##*:}; tag="np$np-c$clients"
  log="$OUT/serve-$tag.server.log"
  # Context per sequence: the prompt, the generation and a margin (llama-server's -c is divided among its
  # slots; minfer-server's is per sequence); the KV pool holds every sequence's whole context.
  "$B/minfer-server" "$MODEL" --device "$DEVICE" --host 127.0.0.1 --port 0 -np "$np" -c $((P + N + 64)) \
    --threads-http $((clients + 8)) > "$log" 2>&1 &
  server=$!
  port=
  for _ in $(seq 600); do  # ≤ 300 s: uploading the 7B's planes and loading its kernels
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && break
    kill -0 $server 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$port" ] || ! http_get "$port" /health | grep -q '"ok"'; then
    echo "device-serve: $tag: the server did not come up (see $log)" | tee "$OUT/serve-$tag.log"
    kill $server 2>/dev/null; wait $server 2>/dev/null; status=1; continue
  fi
  echo "== minfer-server -np $np, $clients streaming clients, prompt $P, max_tokens $N ($DEVICE, $(basename "$MODEL"))" \
    > "$OUT/serve-$tag.log"
  timeout $((SECS + 240)) "$B/minfer-server-bench" --port "$port" --clients "$clients" -p "$P" -n "$N" \
    --seconds "$SECS" --warmup 1 >> "$OUT/serve-$tag.log" 2>&1
  rc=$?; echo "rc=$rc" >> "$OUT/serve-$tag.log"; [ $rc = 0 ] || status=1
  http_get "$port" /metrics > "$OUT/serve-$tag.metrics.txt"
  kill -TERM $server; wait $server; echo "server exit $?" >> "$OUT/serve-$tag.log"
  cat "$OUT/serve-$tag.log"
done
exit $status
