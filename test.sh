#!/usr/bin/env bash
# The tests, in an environment of their own (.venv-test; the README's daemon runs from .venv, which this never
# touches, so both can run at once from one checkout).
#
#   ./test.sh --quick     between commits: ruff, mypy and the tests not marked slow (no daemon, browser,
#                         Prometheus or systemd; property tests with a tenth of their examples), in parallel
#   ./test.sh             before you stop (and CI): ruff, mypy, every test, then the NVML, columnar, kubelet and
#                         front-door tests again on the oldest versions pyproject accepts (Python included, where
#                         this machine has it: python3.10 on the PATH or in pyenv's versions)
#
# Other arguments go to pytest (e.g. ./test.sh --quick -k ledger, ./test.sh -x tests/test_web.py). Every stage
# runs whatever the one before did; a table at the end gives each stage's result and time, and the exit status is
# non-zero when any stage failed. The whole suite drives Debian's prometheus, chromium and chromium-driver,
# installed here when missing. GPUWEAR_TEST_WORKERS sets pytest's parallel workers (default: one per core).
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")"

quick=0
args=()
for arg in "$@"; do
    if [ "$arg" = "--quick" ]; then quick=1; else args+=("$arg"); fi
done
workers=${GPUWEAR_TEST_WORKERS:-auto}

# Debian packages the tests drive: Prometheus and promtool (e2e, rules), Chromium and ChromeDriver (the page)
missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
if [ $quick -eq 0 ]; then
    command -v chromium >/dev/null || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
fi
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
    "${as_root[@]}" "${install[@]}" || exit 1
fi

# An environment is installed again only when pyproject.toml (what it holds) changed since it was.
installed() {  # VENV STAMP-TEXT: whether VENV holds what STAMP-TEXT describes
    [ -x "$1/bin/python" ] && [ -f "$1/.gpuwear-installed" ] && [ "$(cat "$1/.gpuwear-installed")" = "$2" ]
}
install_env() {  # VENV STAMP-TEXT PYTHON PIP-ARGS...: VENV made by PYTHON (made again for another version)
    local venv=$1 stamp=$2 python=$3
    shift 3
    installed "$venv" "$stamp" && return 0
    rm -f "$venv/.gpuwear-installed"
    if [ -x "$venv/bin/python" ] && [ "$(version "$venv/bin/python")" != "$(version "$python")" ]; then
        rm -rf "$venv"
    fi
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" || return 1
    "$venv/bin/pip" install -q "$@" && echo "$stamp" >"$venv/.gpuwear-installed"
}
version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

names=() results=() times=()
stage() {  # NAME COMMAND...: runs it, keeps its result and time
    local name=$1 start status
    shift
    echo "test.sh: == $name ==" >&2
    start=$(date +%s)
    "$@"
    status=$?
    names+=("$name") results+=("$([ $status -eq 0 ] && echo passed || echo "FAILED ($status)")")
    times+=("$(($(date +%s) - start))")
    return 0
}

floor() { sed -n "s/.*\"$1>=\\([0-9.]*\\)[\";].*/\\1/p" pyproject.toml | head -n 1; }
project=$(sha256sum pyproject.toml | cut -c1-16)

stage "install .venv-test" install_env .venv-test "$project" python3 -e '.[test]'
if installed .venv-test "$project"; then
    stage "ruff" .venv-test/bin/ruff check daemon tests bench
    stage "mypy" .venv-test/bin/mypy
    if [ $quick -eq 1 ]; then
        stage "pytest --quick" env GPUWEAR_QUICK=1 .venv-test/bin/pytest -q -n "$workers" -m "not slow and not gpu" "${args[@]}"
    else
        stage "pytest" .venv-test/bin/pytest -n "$workers" "${args[@]}"
    fi
fi

if [ $quick -eq 0 ]; then
    # The NVML tests again on the oldest nvidia-ml-py that pyproject accepts (the README's supported range), the
    # columnar import's on the oldest numpy and pyarrow, the kubelet client's on the oldest grpcio, the front door's
    # (its gzip) on the oldest isal, and all of them on the oldest Python (3.10 lacks asyncio.timeout and sqlite3's
    # error codes).
    nvml=$(floor nvidia-ml-py) numpy=$(floor numpy) pyarrow=$(floor pyarrow) grpcio=$(floor grpcio) isal=$(floor isal)
    oldest=$(sed -n 's/^requires-python = ">=\([0-9.]*\)"/\1/p' pyproject.toml)
    python=python3  # the oldest Python pyproject accepts, where this machine has one
    for candidate in "python$oldest" "${PYENV_ROOT:-$HOME/.pyenv}/versions/$oldest".*/bin/python; do
        if [ "$(version "$candidate")" = "$oldest" ]; then python=$candidate; break; fi
    done
    stage "install .venv-floor" install_env .venv-floor "$project $python" "$python" -e . "nvidia-ml-py==$nvml" \
        "numpy==$numpy.*" "pyarrow==$pyarrow.*" "grpcio==$grpcio" "grpcio-tools==$grpcio" "isal==$isal" pytest \
        pytest-xdist hypothesis
    if installed .venv-floor "$project $python"; then
        echo "test.sh: on Python $(version "$python") ($python; pyproject accepts $oldest and newer), the NVML" \
            "tests on nvidia-ml-py $nvml, the columnar import's on numpy $numpy, pyarrow $pyarrow, the kubelet" \
            "client's on grpcio $grpcio, and the front door's (gzip by isal $isal)" >&2
        stage "pytest (oldest versions)" .venv-floor/bin/pytest -q -p no:cacheprovider -n "$workers" \
            tests/test_drivers.py tests/test_nvml_backend.py tests/test_fakenvml.py tests/test_columnar.py \
            tests/test_kubelet.py tests/test_web.py tests/test_webconfig.py
    fi
fi

failed=0
echo >&2
for i in "${!names[@]}"; do
    printf 'test.sh: %-26s %-12s %5d s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}" >&2
    [ "${results[$i]}" = passed ] || failed=1
done
exit $failed
