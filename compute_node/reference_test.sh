#!/bin/bash
# Generates a tiny model and checks strata's forward pass against the numpy reference.
# Usage: reference_test.sh MAKE_MODEL FORWARD_DUMP COMPARE_PY SHAPE DTYPE [forward_dump flags]
set -euo pipefail
make_model=$1 dump=$2 compare=$3 shape=$4 dtype=$5
shift 5
echo "kernels capped at: ${STRATA_CPU_ISA:-none (the best the CPU has)}"
work="${TEST_TMPDIR:-/tmp}/ref-$shape-$dtype"
rm -rf "$work" && mkdir -p "$work"
"$make_model" --shape="$shape" --dtype="$dtype" --seed=3 --out="$work/model" >/dev/null
/usr/bin/python3 "$compare" "$dump" "$work/model" "$work" "$@"
