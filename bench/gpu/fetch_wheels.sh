#!/usr/bin/env bash
# Fills bench/gpu/wheels/ (ignored by git; it travels with the working tree to the GPU machine) with what the GPU
# image lacks, for Python 3.12 on manylinux x86_64. Run here, where pip can reach an index; see bench/gpu/README.md.
#
#   bash bench/gpu/fetch_wheels.sh            # then: bash bench/gpu/check.sh --dry-run (checks the folder and its size)
#
# - pure wheels and manylinux wheels, pinned (one version of each: check.sh installs by name from this folder), the
#   tested versions (constraints-cpu.txt) of what bench/gpu/versions.py verifies and the image lacks or has at another
#   version (transformers 5.17, tokenizers 0.23.2, huggingface_hub 1.33 there), with the requirements of
#   huggingface_hub 2.4 the image lacks (httpx2, httpcore2, truststore; hf-xet, click, anyio, idna, h11 at the
#   versions CI has, in case the image's are older); peft, lightning and lightning-utilities (small) in case;
#   accelerate, safetensors and torchmetrics are not carried (the image has the tested versions);
# - transformers, like pyarrow below, is stored unpacked as transformers.tar.xz (4.6 MB instead of a 13.5 MB wheel);
# - deepspeed: PyPI has only a source tarball; it is built here into a pure wheel without compiling any op
#   (DS_BUILD_OPS=0, DS_ACCELERATOR=cuda: its ops are compiled at first use on the GPU machine, with its nvcc);
# - pyarrow (a fallback: the GPU image has a pyarrow, used when it satisfies datasets' `pyarrow>=24`): its 55 MB
#   wheel is stored unpacked as pyarrow.tar.xz (38 MB; xz packs its libraries far better than the wheel's zip),
#   with its file name in pyarrow.wheel-name; check.sh zips it back into the same wheel (same files, so its RECORD still holds) before installing.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WHEELS="$HERE/wheels"
PY="${PYTHON:-python3}"
mkdir -p "$WHEELS"
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
PINNED=(
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0
  jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0
  torchdata==0.11.0
  hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions
  tokenizers==0.23.3 huggingface-hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 hf-xet==1.8.0
  click==8.5.1 anyio==4.16.0 idna==3.20 h11==0.16.0 peft==0.21.2 lightning==2.6.6 lightning-utilities==0.15.3
)
"$PY" -m pip download --no-deps "${PLATFORM[@]}" -d "$WHEELS" "${PINNED[@]}"

if ! ls "$WHEELS"/deepspeed-*.whl >/dev/null 2>&1; then
  TMP="$(mktemp -d)"
  "$PY" -m pip download --no-deps --no-binary :all: -d "$TMP" deepspeed==0.19.8
  DS_BUILD_OPS=0 DS_ACCELERATOR=cuda "$PY" -m pip wheel --no-deps --no-build-isolation -w "$WHEELS" "$TMP"/deepspeed-*.tar.gz
  rm -rf "$TMP"
fi

pack() {  # name==version: the wheel unpacked into <name>.tar.xz, its file name in <name>.wheel-name
  local name="${1%%==*}"
  [ -f "$WHEELS/$name.tar.xz" ] && return 0
  TMP="$(mktemp -d)"
  "$PY" -m pip download --no-deps "${PLATFORM[@]}" -d "$TMP" "$1"
  WHEEL="$(basename "$TMP"/"$name"-*.whl)"
  mkdir "$TMP/x" && (cd "$TMP/x" && "$PY" -m zipfile -e "../$WHEEL" .)
  tar -C "$TMP/x" -cf - . | xz -T0 -6 > "$WHEELS/$name.tar.xz"
  echo "$WHEEL" > "$WHEELS/$name.wheel-name"
  rm -rf "$TMP"
}
pack pyarrow==26.0.1
pack transformers==5.24.0
du -sb "$WHEELS" | awk '{printf "bench/gpu/wheels: %.1f MiB\n", $1 / 1048576}'
