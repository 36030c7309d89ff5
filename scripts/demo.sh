#!/usr/bin/env bash
# Sets up the project in .venv (if needed), then trains on 2 CPU ranks, resumes on 4 and 1, and checks the batches.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -c "import zephon_titan.titan.trainer" 2>/dev/null || .venv/bin/pip install -e '.[test]'  # several GB on a fresh machine: progress shown
exec .venv/bin/python examples/demo.py "$@"
