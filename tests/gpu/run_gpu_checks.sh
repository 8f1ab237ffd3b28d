#!/usr/bin/env bash
# run_gpu_checks.sh: everything issues 6 and 14 need a GPU for, in one run of under 8 minutes.
#
#   tests/gpu/run_gpu_checks.sh            (from anywhere; the repository root is found from this file)
#
# The whole run stays under 8 minutes: every step has a timeout, cut to what is left of 460 s.
# 1. configure and build libpowerinfer with -DPI_CUDA=ON into build-cuda/ (only the GPU's own
#    architecture, found with nvidia-smi; PI_CUDA_ARCH=90 overrides);
# 2. gpu_smoke: a C program (no Python needed) comparing the main GPU ops with the CPU ops, plus
#    kernel timings (mul_mat, hot FFN, attention);
# 3. the pytest GPU suite tests/gpu (every op against the CPU, named tolerances; the hybrid model:
#    greedy tokens equal to CPU-only at three budgets, -ngl, device memory under the budget) and the
#    CPU tests of the placement (tests/test_gpu_split.py, tests/test_hybrid.py on the emulated device),
#    when python has numpy, cffi, gguf and pytest;
# 4. bench/bench_hybrid.py: decode speed of a sparse file with 7B-shaped layers (PI_BENCH_LAYERS of
#    them, default 4) at budgets of the dense part + 0/25/50/100% of the FFN against CPU-only and dense -ngl at the same memory.
# Options (environment): PI_GPU_PREBUILT=1 uses a build-cuda/libpowerinfer.so already there (built on
# another machine: step 1 is skipped); PI_GPU_SKIP_CPU_TESTS=1 leaves out the CPU-only placement tests;
# PI_BENCH_LAYERS / PI_BENCH_TIMEOUT_S set step 4's layers (4) and time limit (200 s); when compute-sanitizer
# is on the PATH, gpu_smoke also runs under its memcheck, last.
# Every step has a timeout; a failing step does not stop the others. Logs go to $OUT (if set, e.g. by
# the device runner) or build-cuda/gpu-checks/. Exit status: 0 when every step that ran passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
LOG_DIR=${OUT:-$ROOT/build-cuda/gpu-checks}
mkdir -p "$LOG_DIR"
PY=${PYTHON:-python3}
START=$(date +%s)
DEADLINE=$(( START + ${PI_GPU_CHECKS_BUDGET_S:-460} ))   # every step's timeout is cut to what is left of this
FAILED=()
PASSED=()

say() { printf '\n==== %s (%ds) ====\n' "$*" "$(( $(date +%s) - START ))"; }

# step NAME TIMEOUT_S CMD...: runs CMD with a timeout, its output to the terminal and $LOG_DIR/NAME.log
step() {
    local name=$1 limit=$2
    shift 2
    say "$name"
    local left=$(( DEADLINE - $(date +%s) ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "[$name not run: the time budget is spent]"
        FAILED+=("$name (no time left)")
        return 0
    fi
    local rc=0
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$LOG_DIR/$name.log" || rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        PASSED+=("$name")
    elif [ "$rc" -eq 77 ] && [ "$HAVE_GPU" -eq 0 ]; then
        echo "[$name skipped]"
    else
        [ "$rc" -eq 124 ] && echo "[$name timed out after ${limit}s]"
        FAILED+=("$name (rc $rc)")
    fi
    return 0
}

say "device"
HAVE_GPU=0   # when nvidia-smi sees a GPU, a library that sees none is a failure, not a skip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
    HAVE_GPU=1
    nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,driver_version --format=csv || true
else
    echo "no GPU visible to nvidia-smi: the GPU steps will skip (compile and link are still checked)"
fi
if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
        [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
    done
fi
command -v nvcc >/dev/null 2>&1 || { echo "nvcc not found: cannot build the CUDA backend"; exit 1; }
nvcc --version | tail -1

ARCH=${PI_CUDA_ARCH:-}
if [ -z "$ARCH" ] && command -v nvidia-smi >/dev/null 2>&1; then
    ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
fi
ARCH=${ARCH:-80;90}
GEN=(); command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)

# Without cmake: the same sources compiled directly (C core with cc, core/cuda with nvcc).
build_direct() {
    local obj=build-cuda/direct
    mkdir -p "$obj"
    local gencode=()
    IFS=';' read -ra archs <<< "$ARCH"
    for a in "${archs[@]}"; do gencode+=("-gencode=arch=compute_$a,code=sm_$a"); done
    ls core/src/*.c core/src/arch/*.c core/cuda/stub.c | grep -v '/stub.c$' | xargs -P "$(nproc)" -I{} sh -c \
        'cc -std=c11 -O2 -fPIC -march=native -fvisibility=hidden -ffp-contract=off -fno-math-errno -D_GNU_SOURCE \
            -Icore/include -Icore/src -c {} -o '"$obj"'/$(echo {} | tr / _).o' || return 1
    ls core/cuda/*.cu | xargs -P "$(nproc)" -I{} sh -c \
        'nvcc -std=c++17 -O3 -Xcompiler=-fPIC,-fvisibility=hidden -DPI_CUDA=1 -D_GNU_SOURCE '"${gencode[*]}"' \
            -Icore/include -Icore/src -Icore/cuda -c {} -o '"$obj"'/$(echo {} | tr / _).o' || return 1
    nvcc -shared -cudart static -o build-cuda/libpowerinfer.so "$obj"/*.o -lpthread -lm
}

if [ "${PI_GPU_PREBUILT:-0}" = 1 ] && [ -f build-cuda/libpowerinfer.so ]; then
    say "build"
    echo "using the prebuilt build-cuda/libpowerinfer.so (PI_GPU_PREBUILT=1)"
elif command -v cmake >/dev/null 2>&1; then
    step configure 45 cmake -S . -B build-cuda "${GEN[@]}" -DPI_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" \
        -DCMAKE_BUILD_TYPE=Release
    step build 200 cmake --build build-cuda -j "$(nproc)"
else
    echo "cmake not found: compiling the sources directly"
    export -f build_direct; export ARCH
    step build_direct 200 bash -c build_direct
fi
if [ ! -f build-cuda/libpowerinfer.so ]; then
    say "summary"; echo "build failed: ${FAILED[*]}"; exit 1
fi

step smoke_build 20 cc -std=c11 -O2 -Wall tests/gpu/gpu_smoke.c -Icore/include -Lbuild-cuda -lpowerinfer \
    "-Wl,-rpath,$ROOT/build-cuda" -lm -o build-cuda/gpu_smoke
[ -x build-cuda/gpu_smoke ] && step gpu_smoke 60 build-cuda/gpu_smoke

if $PY -c "import numpy, cffi, gguf, pytest" >/dev/null 2>&1; then
    export POWERINFER_LIB_PATH=$ROOT/build-cuda/libpowerinfer.so PYTHONPATH=$ROOT/bindings${PYTHONPATH:+:$PYTHONPATH}
    if [ "$HAVE_GPU" -eq 1 ]; then
        step library_sees_gpu 20 $PY -c "import sys; sys.path.insert(0, 'tests/gpu'); import gpu_helpers as g; \
ok, why = g.gpu_ready(); print('library sees the GPU' if ok else 'library: ' + why); sys.exit(0 if ok else 1)"
    fi
    step pytest_gpu 150 $PY -m pytest -q -rs --durations=8 tests/gpu -p no:cacheprovider
    [ "${PI_GPU_SKIP_CPU_TESTS:-0}" = 1 ] || step pytest_gpu_split 60 $PY -m pytest -q tests/test_gpu_split.py tests/test_hybrid.py -p no:cacheprovider
    step bench_hybrid "${PI_BENCH_TIMEOUT_S:-200}" $PY bench/bench_hybrid.py --n-layer "${PI_BENCH_LAYERS:-4}" --tokens 32
fi
# last: whatever time is left (compute-sanitizer runs the kernels tens of times slower)
if [ -x build-cuda/gpu_smoke ] && [ "$HAVE_GPU" -eq 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    step gpu_smoke_memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 3 build-cuda/gpu_smoke --no-bench
fi
if ! $PY -c "import numpy, cffi, gguf, pytest" >/dev/null 2>&1; then
    say "pytest"
    echo "python ($PY) lacks numpy/cffi/gguf/pytest: the pytest GPU suite is skipped (gpu_smoke covered the ops)"
fi

say "summary"
echo "passed: ${PASSED[*]:-none}"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "FAILED: ${FAILED[*]}"
    echo "logs: $LOG_DIR"
    exit 1
fi
echo "all GPU checks passed; logs: $LOG_DIR"
