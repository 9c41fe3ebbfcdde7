#!/usr/bin/env bash
# The main job: installs what is missing, builds, compiles a model into an artifact and generates text.
# Model: the real tiny model stories260K when ../shared/fixtures is present (MINFER_FIXTURES overrides),
# else a random-weight tiny-llama made by minfer-synth (its "text" is noise, but every stage runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release minfer-synth minfer-compile minfer-run
bin=build/release/bin
out=${TMPDIR:-/tmp}/minfer-demo
mkdir -p "$out"
fixtures=${MINFER_FIXTURES:-../shared/fixtures}
if [ -f "$fixtures/models/stories260K.gguf" ]; then
  gguf=$fixtures/models/stories260K.gguf
else
  echo "demo: $fixtures not found; using a synthetic tiny-llama (random weights)" >&2
  gguf=$out/tiny-llama-q4_k_m.gguf
  "$bin/minfer-synth" tiny-llama --types q4_k_m --seed 1 -o "$gguf"
fi
"$bin/minfer-compile" "$gguf" -o "$out/model.mfb"
"$bin/minfer-run" "$out/model.mfb" -p "Once upon a time" -n 64 --temp 0
