#!/usr/bin/env bash
# The main job: installs what is missing, builds, makes a model and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
bin=build/release/bin
out=${TMPDIR:-/tmp}/minfer-demo
mkdir -p "$out"
"$bin/minfer-synth" tiny-llama --types q4_k_m --seed 1 -o "$out/tiny-llama-q4_k_m.gguf"
"$bin/minfer-inspect" "$out/tiny-llama-q4_k_m.gguf"
