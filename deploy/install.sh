#!/bin/sh
# How the image installs dkernel (deploy/Dockerfile runs this; so does
# tests/test_deploy_image.py, in a fresh folder, where no image can be built):
# a virtual environment at VENV with dkernel from the checkout SOURCE and the
# dependencies its pyproject.toml declares (extra "deploy": ingest, s3 and the
# scheduler's dashboard), at the versions deploy/constraints.txt pins.  The
# list of packages lives in pyproject.toml only, so the image cannot miss one.
#
#   deploy/install.sh SOURCE VENV        (PYTHON=python3.11 to choose the interpreter)
set -eu
# an absolute SOURCE: pip reads a bare relative name ("src[deploy]") as a
# project on PyPI, and downloaded and built the package of that name
src=$(CDPATH= cd -- "$1" && pwd)
venv=$2
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --no-cache-dir --disable-pip-version-check \
    -c "$src/deploy/constraints.txt" "$src[deploy]"
# fails here, not in the first container, if anything the CLI imports is missing
"$venv/bin/dkernel" --version
