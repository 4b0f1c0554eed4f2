#!/usr/bin/env bash
# Installs gemmt into the current Python environment, building it against the torch there.
#   bash scripts/setup.sh          torch (if missing), build tools, then the package
#   bash scripts/setup.sh --test   the same, plus the test requirements
# GEMMT_TORCH_SPEC picks the torch to install when none is present (default torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
command -v "$PY" >/dev/null 2>&1 || PY=python3
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "== installing ${GEMMT_TORCH_SPEC:-torch==2.13.0}"
  pip_install "${GEMMT_TORCH_SPEC:-torch==2.13.0}"
fi
echo "== build tools"
pip_install "scikit-build-core>=0.10" "pybind11>=2.12" ninja numpy
cmake_ok=$(cmake --version 2>/dev/null | awk 'NR==1{split($3,v,"."); print (v[1]>3 || (v[1]==3 && v[2]>=24)) ? 1 : 0}')
if [ "${cmake_ok:-0}" != 1 ]; then pip_install "cmake>=3.24"; fi
if [ "${1:-}" = "--test" ]; then
  echo "== test requirements"
  pip_install pytest hypothesis expecttest
fi
# Compilers from another GCC install than the one torch's process links would build a module
# that crashes on load; python/gemmt/_toolchain.py names the system's where they differ.
eval "$("$PY" python/gemmt/_toolchain.py)"
echo "== building gemmt (pip install --no-build-isolation .)"
"$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-deps .
"$PY" -c "import gemmt, json; print('gemmt installed:', json.dumps(gemmt.build_info()))"
