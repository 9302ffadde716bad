#!/usr/bin/env bash
# Installs the Debian packages zeroplan needs to build and test. Idempotent:
# when every package is present it does nothing (no apt-get update).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libboost-graph-dev libeigen3-dev nlohmann-json3-dev
  doctest-dev libcli11-dev libfmt-dev
  libopenmpi-dev openmpi-bin
  libbenchmark-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# cudnn-frontend's headers (header-only, for cuDNN's fused attention in the CUDA build): taken
# from its PyPI wheel without its Python dependencies, into .deps/ (ignored by git). Only
# where nvcc is; a machine that cannot reach PyPI builds without cuDNN's attention.
cudnn_frontend() {
  local dest=.deps/cudnn-frontend version=1.32.0 tmp
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  [ -f "$dest/include/cudnn_frontend.h" ] && return 0
  tmp=$(mktemp -d)
  if python3 -m pip download --quiet --timeout 20 --retries 1 --no-deps --only-binary=:all: \
       "nvidia-cudnn-frontend==$version" -d "$tmp" 2>/dev/null &&
     python3 - "$tmp" <<'PY'
import pathlib, sys, zipfile
tmp = pathlib.Path(sys.argv[1])
with zipfile.ZipFile(next(tmp.glob("*.whl"))) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    for name in names:
        z.extract(name, tmp / "unpacked")
sys.exit(0 if (tmp / "unpacked/include/cudnn_frontend.h").is_file() else 1)
PY
  then
    rm -rf "$dest" && mkdir -p "$(dirname "$dest")" && mv "$tmp/unpacked" "$dest"
    echo "setup: cudnn-frontend $version headers in $dest"
  else
    echo "setup: cudnn-frontend's headers not downloaded (no PyPI?): the CUDA build goes without cuDNN's attention"
  fi
  rm -rf "$tmp"
}
(cd "$(dirname "$0")/.." && cudnn_frontend)

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
