#!/usr/bin/env bash
# Installs the OpenVINO runtime that `--device ov:*` loads at run time.
#
# The shared libraries come from the `openvino` wheel on PyPI: it is downloaded (not
# installed), and its `openvino/libs` directory is unpacked into
# $PYRAMID_HOME/openvino/<version>/libs, where pyramid looks for `libopenvino_c.so.*`
# (PYRAMID_OPENVINO_LIB overrides the search). Building pyramid never needs OpenVINO.
set -euo pipefail

version="${PYRAMID_OPENVINO_VERSION:-2026.4.1}"
home="${PYRAMID_HOME:-$HOME/.cache/pyramid}"
dest="$home/openvino/$version"

if compgen -G "$dest/libs/libopenvino_c.so*" >/dev/null; then
    echo "OpenVINO $version is installed in $dest/libs"
    exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "python3 with pip is needed to download the OpenVINO wheel from PyPI" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "downloading the openvino $version wheel"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" "openvino==$version"
wheel="$(ls "$work"/openvino-*.whl)"
python3 - "$wheel" "$work/unpacked" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("openvino/libs/")])
PY
mkdir -p "$dest"
rm -rf "$dest/libs.partial"
mv "$work/unpacked/openvino/libs" "$dest/libs.partial"
# The rename is the commit point: an interrupted install leaves no half-filled libs/.
mv "$dest/libs.partial" "$dest/libs"
echo "OpenVINO $version installed in $dest/libs"
