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

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
