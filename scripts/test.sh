#!/usr/bin/env bash
# The whole test suite from a clean clone: installs what it needs, then runs lint, JS and Python tests.
# Usage: bash scripts/test.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's chromium drives the browser tests (Playwright's own browser download does not work offline);
# Noto CJK lets screenshots show Chinese text.
if ! command -v chromium >/dev/null 2>&1 || ! dpkg -s fonts-noto-cjk >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium fonts-noto-cjk >/dev/null
fi

# Debian's redis-server: tests/test_bus.py starts its own on 127.0.0.1 (a port per test) for the
# brokers joined by --bus.
if ! command -v redis-server >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq redis-server >/dev/null
fi

# torch for the integration tests: a pinned CPU-only wheel (~190 MB), from torch's CPU index or a
# local wheel directory, instead of PyPI's Linux build that pulls several GB of CUDA libraries.
# Where neither has it, ".[test]" below installs torch from PyPI.
if ! python3 -c "import torch" >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check --timeout 20 --retries 1 \
        --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu" \
        || echo "no CPU-only torch wheel reachable: torch comes from PyPI (with CUDA libraries)" >&2
fi
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"

echo "== ruff"
ruff check .
ruff format --check .

echo "== ui: JS unit tests and bundle freshness"
(cd ui && npm ci --no-audit --no-fund --loglevel=error && npm test && npm run build)
git diff --exit-code --stat -- vdl_stream/static || {
    echo "vdl_stream/static is stale: run 'npm run build' in ui/ and commit the bundle" >&2
    exit 1
}

echo "== pytest"
python3 -m pytest "$@"
