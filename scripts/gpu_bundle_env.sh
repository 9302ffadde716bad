# Sourced by the scripts that run a bundle of binaries built elsewhere on a GPU machine
# (scripts/gpu_bundle.sh writes one): with BUNDLE set to its folder, unpacks its bundle.tgz
# there when the binaries are not there yet, puts the
# bundle's libraries, the machine's CUDA toolkit and PyTorch's nvidia-* wheels (NCCL, cuBLAS,
# the CUDA runtime, cuDNN, NVRTC) on LD_LIBRARY_PATH, and points the data folder the binary was built with
# (models/catalog, sim/*.json: the bundle's data_dir file) at this checkout. Returns 1 when it
# cannot.
if [ ! -x "$BUNDLE/zeroplan" ] && [ -f "$BUNDLE/bundle.tgz" ]; then
  tar xzf "$BUNDLE/bundle.tgz" -C "$BUNDLE" || { echo "cannot unpack $BUNDLE/bundle.tgz"; return 1; }
fi
# The bundle's libraries (lib/) only where this machine has none of that name (its MPI stays
# with its mpirun).
for lib in "$BUNDLE"/lib/*; do
  [ -e "$lib" ] || continue
  name=$(basename "$lib")
  ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$name " || ln -sfn "lib/$name" "$BUNDLE/$name"
done
extra=$(python3 -c 'import os, nvidia
base = os.path.dirname(nvidia.__path__[0] + "/")
print(":".join(os.path.join(base, d, "lib") for d in ("nccl", "cublas", "cuda_runtime", "cudnn", "cuda_nvrtc", "cu13") if os.path.isdir(os.path.join(base, d, "lib"))))' 2>/dev/null)
export LD_LIBRARY_PATH="$BUNDLE:/usr/local/cuda/lib64:${extra}:${LD_LIBRARY_PATH:-}"
src=$(cat "$BUNDLE/data_dir" 2>/dev/null || true)
if [ -n "$src" ] && [ ! -f "$src/sim/devices.json" ]; then
  mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src" ||
    { echo "cannot link $src to this checkout (the bundle's data folder)"; return 1; }
fi
