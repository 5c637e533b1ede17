#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian machine: lint (ruff), types (mypy) and pytest,
# including the end-to-end tests against a real Prometheus server and the page in a real browser
# (Debian's prometheus, chromium and chromium-driver packages, installed here when missing).
# Arguments go to pytest, e.g. ./test.sh -x -m 'not e2e'
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

# Debian packages the tests drive: Prometheus and promtool (e2e, rules), Chromium and ChromeDriver (the page)
missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
    install=(apt-get install -y --no-install-recommends "${missing[@]}")
    if [ "$(id -u)" -eq 0 ]; then
        as_root=(env DEBIAN_FRONTEND=noninteractive)
    elif command -v sudo >/dev/null; then
        as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
    else
        echo "test.sh: ${missing[*]} missing: as root, run: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "test.sh: installing Debian's packages ${missing[*]}" >&2
    "${as_root[@]}" apt-get update -q
    "${as_root[@]}" "${install[@]}"
fi

[ -d .venv ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[test]'
.venv/bin/ruff check daemon tests
.venv/bin/mypy
.venv/bin/pytest "$@"

# The NVML tests again on the oldest nvidia-ml-py that pyproject accepts (the README's supported range), the
# columnar import's on the oldest numpy and pyarrow, and the kubelet client's on the oldest grpcio.
floor() { sed -n "s/.*\"$1>=\\([0-9.]*\\)\".*/\\1/p" pyproject.toml | head -n 1; }
nvml=$(floor nvidia-ml-py) numpy=$(floor numpy) pyarrow=$(floor pyarrow) grpcio=$(floor grpcio)
[ -d .venv-floor ] || python3 -m venv .venv-floor
.venv-floor/bin/pip install -q -e . "nvidia-ml-py==$nvml" "numpy==$numpy.*" "pyarrow==$pyarrow.*" \
    "grpcio==$grpcio" "grpcio-tools==$grpcio" pytest hypothesis
echo "test.sh: the NVML tests on nvidia-ml-py $nvml, the columnar import's on numpy $numpy, pyarrow $pyarrow," \
    "the kubelet client's on grpcio $grpcio" >&2
.venv-floor/bin/pytest -q -p no:cacheprovider tests/test_drivers.py tests/test_nvml_backend.py tests/test_fakenvml.py \
    tests/test_columnar.py tests/test_kubelet.py
