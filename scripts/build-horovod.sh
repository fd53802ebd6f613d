#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (TensorFlow, MPI, Gloo; PyTorch if torch imports) into a
# Python environment that already has tensorflow-cpu.
#
#   usage: scripts/build-horovod.sh /path/to/venv/bin/python
#
# Horovod 0.28.1 does not build unmodified against TF 2.21 / torch 2.x, so the sdist is patched
# (see docs: platform-notes, "Horovod 0.28.1"). Needs cmake, g++ and libopenmpi-dev.
set -euo pipefail

HOROVOD_VERSION=0.28.1

die() { echo "build-horovod: error: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: $0 /path/to/venv/bin/python"
PY=$1
[[ -x $PY ]] || die "not an executable: $PY"

if "$PY" -c 'import horovod.tensorflow' >/dev/null 2>&1; then
    echo "build-horovod: horovod.tensorflow already importable with $PY; nothing to do."
    exit 0
fi

"$PY" -c 'import tensorflow' >/dev/null 2>&1 \
    || die "tensorflow does not import with $PY; install it first: $PY -m pip install tensorflow-cpu"
for tool in cmake g++ mpicxx; do
    command -v "$tool" >/dev/null || die "$tool not found (needs: cmake g++ openmpi-bin libopenmpi-dev)"
done

start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/build-horovod.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src=$work/horovod-$HOROVOD_VERSION

# Source edits: each expected text must occur exactly once, else stop (the sdist changed).
"$PY" - "$src" <<'EOF'
import pathlib, sys
src = pathlib.Path(sys.argv[1])
edits = [
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    ("horovod/torch/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    ("horovod/tensorflow/CMakeLists.txt",
     'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\n', ""),
    # GPU builds only (the code is under HAVE_GPU): TensorFlow 2.21 has neither
    # stream_executor::gpu::AsGpuStreamValue (a stream's handle is platform_specific_handle(), as
    # in TensorFlow's own gpu_kernel_helper.h) nor tensorflow_gpu_device_info().
    ("horovod/tensorflow/mpi_ops.cc",
     """// Forward declaration of AsGpuStreamValue
namespace stream_executor {
namespace gpu {
GpuStreamHandle AsGpuStreamValue(Stream* stream);
} // namespace stream_executor
} // namespace gpu
#if TENSORFLOW_VERSION >= 2011000000
#include "tensorflow/compiler/xla/stream_executor/stream.h"
#else
#include "tensorflow/stream_executor/stream.h"
#endif // TENSORFLOW_VERSION >= 2011000000
""",
     """#include "tensorflow/compiler/xla/stream_executor/stream.h"
namespace stream_executor {
namespace gpu {
inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {
  return reinterpret_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
} // namespace gpu
} // namespace stream_executor
"""),
    ("horovod/tensorflow/mpi_ops.cc",
     """context->device()->tensorflow_gpu_device_info() != nullptr) {
    device = context->device()->tensorflow_gpu_device_info()->gpu_id;""",
     """context->device()->tensorflow_accelerator_device_info() != nullptr) {
    device = context->device()->tensorflow_accelerator_device_info()->gpu_id;"""),
]
for name, old, new in edits:
    path = src / name
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"build-horovod: error: expected {old.strip()!r} exactly once in {name}, "
                 f"found {text.count(old)}; the sdist changed, review the patch")
    path.write_text(text.replace(old, new))
    print(f"build-horovod: patched {name}")
EOF

"$PY" -m pip install --quiet wheel setuptools packaging psutil cloudpickle pyyaml

unset HOROVOD_WITH_PYTORCH HOROVOD_WITHOUT_PYTORCH
if "$PY" -c 'import torch' >/dev/null 2>&1; then
    export HOROVOD_WITH_PYTORCH=1
else
    export HOROVOD_WITHOUT_PYTORCH=1
fi
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
export MAKEFLAGS=-j2
echo "build-horovod: building horovod $HOROVOD_VERSION (pytorch: ${HOROVOD_WITH_PYTORCH:-no})"
"$PY" -m pip install --no-build-isolation --no-cache-dir "$src"

rm -rf "$work"
trap - EXIT
echo "build-horovod: done in $((SECONDS - start)) s"
"$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/horovodrun" --check-build
if [[ -n ${HOROVOD_WITHOUT_PYTORCH:-} ]]; then
    # horovod.torch imports even when its extension was not built, so --check-build shows [X].
    echo "build-horovod: PyTorch support NOT built (torch does not import); ignore [X] PyTorch above."
fi
