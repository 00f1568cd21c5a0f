#!/usr/bin/env bash
# Install the Debian packages that building and testing the krex packages need.
#
#   packaging/install-build-deps.sh            build tools only (.deb, .rpm, linters)
#   packaging/install-build-deps.sh --test     also the tested-install tools
#                                              (mmdebstrap, systemd-nspawn)
#   packaging/install-build-deps.sh --hip      also the HIP headers (the HIP entry-point
#                                              table's generator and its test)
# The options combine.
#
# Idempotent: packages already installed are skipped without touching apt.
# Needs root and a reachable Debian mirror; exits 2 (and says why) otherwise,
# so callers can tell "cannot install tools" apart from a build failure.
set -euo pipefail

build_pkgs=(
    build-essential       # gcc/make for libkrex_shim.so and libkrex_gate.so
    debhelper             # dh, dh_installsystemd, dh_installsysusers
    dh-python             # dh_python3: ${python3:Depends}, shebang rewriting
    pybuild-plugin-pyproject
    python3-all
    python3-setuptools
    python3-wheel
    python3-build
    python3-installer     # the rpm %install step
    fakeroot
    rpm                   # rpmbuild, rpm --root
    rpmlint
    lintian
    systemd               # systemd-analyze verify / security --offline
)
test_pkgs=(
    mmdebstrap            # clean Debian root for the install test
    systemd-container     # systemd-nspawn -b boots that root with systemd as PID 1
)
hip_pkgs=(
    libamdhip64-dev       # /usr/include/hip (HIP 5.2.3 on bookworm): gen_hip_entrypoints.py
)

want=("${build_pkgs[@]}")
for arg in "$@"; do
    case "$arg" in
        --test) want+=("${test_pkgs[@]}") ;;
        --hip) want+=("${hip_pkgs[@]}") ;;
        *) echo "usage: $0 [--test] [--hip]" >&2; exit 64 ;;
    esac
done

missing=()
for p in "${want[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "install-build-deps: need root to install: ${missing[*]}" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq >/dev/null 2>&1; then
    echo "install-build-deps: apt-get update failed (no reachable mirror?)" >&2
    exit 2
fi
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    echo "install-build-deps: apt-get install failed for: ${missing[*]}" >&2
    exit 2
fi
