#!/usr/bin/env bash
# Installs minfer's build dependencies from Debian packages, only those missing. Idempotent; quiet when
# everything is present. Needs root (or sudo) when something must be installed.
set -euo pipefail

packages=(cmake g++ make pkg-config libflatbuffers-dev flatbuffers-compiler doctest-dev llvm-dev
          libpcre2-dev libxxhash-dev nlohmann-json3-dev zlib1g-dev libtinfo-dev libzstd-dev libssl-dev
          libcpp-httplib-dev  # minfer-server
          clang libclang-rt-14-dev)  # clang + libFuzzer: scripts/fuzz.sh
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "setup: note: CUDA toolkit not found at /usr/local/cuda; GPU kernel images will not be built" >&2
fi
# The npm `openai` client that tests/serve drives minfer-server with, into .node/ (git-ignored). Node
# comes with the machine (nodesource's nodejs bundles npm; Debian's npm package would conflict with it).
root=$(cd "$(dirname "$0")/.." && pwd)
openai_version=6.49.0
if command -v npm >/dev/null; then
  if [ "$(node -p "require('$root/.node/node_modules/openai/package.json').version" 2>/dev/null)" != "$openai_version" ]; then
    echo "setup: installing the npm openai client $openai_version into .node/"
    npm install --prefix "$root/.node" --no-audit --no-fund --silent "openai@$openai_version" >/dev/null ||
      echo "setup: note: npm install openai failed; the test_server_openai suite will skip" >&2
  fi
else
  echo "setup: note: node/npm not found; the test_server_openai suite will skip" >&2
fi
