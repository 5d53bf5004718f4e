#!/usr/bin/env bash
# Runs deploy_checks.py MODE from the test's runfiles (the repository as Bazel staged it).
set -euo pipefail
root="${TEST_SRCDIR}/strata"
mode="$1"
shift
bins=()
for b in "$@"; do bins+=("$root/$b"); done
exec /usr/bin/python3 "$root/tests/deploy/deploy_checks.py" "$mode" "$root" "${bins[@]+"${bins[@]}"}"
