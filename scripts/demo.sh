#!/usr/bin/env bash
# Sets up the project in .venv (if needed) and runs the elastic-resume demo on bundled offline text.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -c "import zephon_titan.engine" 2>/dev/null || .venv/bin/pip install -q -e '.[test]'
exec .venv/bin/python -m zephon_titan.demo "$@"
