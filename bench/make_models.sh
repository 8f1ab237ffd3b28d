#!/usr/bin/env bash
# Create the benchmark models with tools/make_test_model.py (random weights, real shapes).
#   bench/make_models.sh [OUTDIR]      (default /tmp; run from anywhere, venv active)
# 7B-shaped Q4_0 (llama 7B layout: n_vocab 32000, n_embd 4096, n_ff 11008, 32 heads, 32 layers):
#   3.53 GiB, 6.74 B params, written in ~15-40 s with --random-blocks (random valid Q4_0 blocks).
# tiny: 2-layer, n_embd 64, for a smoke run.
set -euo pipefail
out=${1:-/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
python "$root/tools/make_test_model.py" "$out/bench_tiny.gguf" --preset tiny --dtype q4_0
python "$root/tools/make_test_model.py" "$out/bench_7b_q4_0.gguf" --preset 7b --dtype q4_0 --random-blocks
