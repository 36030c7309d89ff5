#!/usr/bin/env bash
# Sets up the project in .venv (if needed), then trains on 2 CPU ranks, resumes on 4 and 1, and checks the batches.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv"
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import zephon_titan.titan.trainer" 2>/dev/null; then
    echo "[setup] installing zephon_titan with PyTorch 2.14 and TorchTitan 0.3 into .venv: several GB to download on a"
    echo "        fresh machine (pip shows each download), then minutes of unpacking with no output after pip's"
    echo "        'Installing collected packages' line (PyTorch alone is ~6 GB installed)"
    .venv/bin/pip install -e '.[test]'
    echo "[setup] done"
fi
exec .venv/bin/python examples/demo.py "$@"
