#!/usr/bin/env bash
# Checks that every C++ source in the repository conforms to .clang-format.
#
# Runs outside the sandbox (tag "local"): it follows the runfiles link of .clang-format
# back to the source tree and checks the files git tracks there, so that a new file is
# covered without being listed anywhere.
set -euo pipefail
config=$(readlink -f "$TEST_SRCDIR/$TEST_WORKSPACE/.clang-format")
root=$(dirname "$config")
cd "$root"
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
[ ${#files[@]} -gt 0 ] || { echo "no sources found under $root"; exit 1; }
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "FAIL: run clang-format -i on the files above"
  exit 1
fi
echo "${#files[@]} files conform to .clang-format"
