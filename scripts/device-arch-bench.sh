#!/usr/bin/env bash
# The 7B-class synthetic models of the newer architectures on a GPU machine (issue 16), from what
# scripts/device-pack.sh packed: minfer-synth <model> --types q4_k_m, compile (sm of this GPU), then
# minfer-bench pp512 / tg128. Models: $MINFER_ARCH_MODELS (default "phi3-mini qwen3-30b-a3b gemma2-9b gemma3-12b").
# Logs in $OUT/arch-bench.log.
set -uo pipefail
. "$(dirname "$0")/device-common.sh"
{
  for m in ${MINFER_ARCH_MODELS:-phi3-mini qwen3-30b-a3b gemma2-9b gemma3-12b}; do
    echo "== $m"
    rm -f /tmp/arch.gguf /tmp/arch.mfb
    timeout 200 "$B/minfer-synth" "$m" --types q4_k_m -o /tmp/arch.gguf &&
      measure compile timeout 200 "$B/minfer-compile" /tmp/arch.gguf -o /tmp/arch.mfb &&
      ls -la /tmp/arch.gguf /tmp/arch.mfb &&
      timeout 200 "$B/minfer-bench" /tmp/arch.mfb -p 512 -n 128 -r 3
    echo "rc($m)=$?"
  done
} > "$OUT/arch-bench.log" 2>&1
grep -H "rc(" "$OUT/arch-bench.log"
