#!/bin/bash
# Runs export_gguf_test.py with Debian's python3 (it has numpy).
# Usage: export_gguf_test.sh MAKE_MODEL EXPORT_GGUF_PY EXPORT_GGUF_TEST_PY
set -euo pipefail
exec /usr/bin/python3 "$3" "$1" "$2"
