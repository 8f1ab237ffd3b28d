#!/usr/bin/env bash
# Build the bundled sparse model files from the trained HF checkpoint, in one command:
#
#     bash tools/build_bundled_model.sh            # from the repository root, venv active
#
# profile activations -> train predictors -> convert (F16 and Q4_0 PowerInfer GGUF) ->
# convert-dense (F16 dense GGUF) -> card statistics (stats.json, firing_rates.png).
#
# Inputs: models/tinyrelu-hf (config.json, model.safetensors, tokenizer.model: made by
# tools/train_model.py) and data/corpus/train.txt (made by tools/prepare_corpus.py).
# Outputs in models/tinyrelu/: tinyrelu.powerinfer.gguf, tinyrelu.q4_0.powerinfer.gguf,
# tinyrelu.dense.gguf, activation/activation_N.pt, predictor.json, stats.json,
# firing_rates.png. Intermediate predictors: models/tinyrelu-hf/predictor/.
#
# The whole chain from nothing (about 1.5 hours on 2 cores, most of it training):
#     python tools/prepare_corpus.py && python tools/train_tokenizer.py &&
#     python tools/train_model.py && bash tools/build_bundled_model.sh
#
# Settings (environment): HF, OUT, NAME, TEXT, CTX (256), PROFILE_TOKENS (200000),
# PRED_TOKENS (40000), EPOCHS (4, predictor training), THRESHOLD (the predictor threshold written into the files as
# powerinfer.sparse_threshold), RANKS (candidate predictor ranks, multiples of 32 for Q4_0),
# TARGET_RECALL, THREADS (2), SWEEP (thresholds for the card's sweep; empty: none),
# SKIP_PROFILE=1 (keep OUT/activation), SKIP_STATS=1 (no card statistics).
set -euo pipefail

cd "$(dirname "$0")/.."
HF=${HF:-models/tinyrelu-hf}
OUT=${OUT:-models/tinyrelu}
NAME=${NAME:-tinyrelu}
TEXT=${TEXT:-data/corpus/train.txt}
CTX=${CTX:-256}
PROFILE_TOKENS=${PROFILE_TOKENS:-200000}
PRED_TOKENS=${PRED_TOKENS:-40000}
EPOCHS=${EPOCHS:-4}
THRESHOLD=${THRESHOLD:-0.0}
RANKS=${RANKS:-32,64,96,128,192}
TARGET_RECALL=${TARGET_RECALL:-0.93}
TARGET_PRECISION=${TARGET_PRECISION:-0.5}
THREADS=${THREADS:-2}
SWEEP=${SWEEP--1,-0.5,0.5,1}
PY=${PYTHON:-python}
export PYTHONPATH="bindings${PYTHONPATH:+:$PYTHONPATH}"

for f in "$HF/config.json" "$HF/model.safetensors" "$HF/tokenizer.model" "$TEXT"; do
    [ -f "$f" ] || { echo "build_bundled_model: error: missing $f (see the header of this script)" >&2; exit 1; }
done
mkdir -p "$OUT"
step() { echo "== $* ($(date +%H:%M:%S))" >&2; }

if [ "${SKIP_PROFILE:-0}" != 1 ]; then
    step "profile activations"
    rm -rf "$OUT/activation"
    $PY tools/profile_activations.py "$HF" "$TEXT" --out "$OUT/activation" --ctx "$CTX" \
        --max-tokens "$PROFILE_TOKENS" --threads "$THREADS" --no-progress
fi

step "train predictors (threshold $THRESHOLD, ranks $RANKS)"
rm -rf "$HF/predictor"
$PY tools/train_predictor.py "$HF" "$TEXT" --out "$HF/predictor" --ctx "$CTX" \
    --max-tokens "$PRED_TOKENS" --epochs "$EPOCHS" --rank-auto --rank-candidates "$RANKS" \
    --target-recall "$TARGET_RECALL" --target-precision "$TARGET_PRECISION" \
    --threshold "$THRESHOLD" --threads "$THREADS" --no-progress
cp "$HF/predictor/config.json" "$OUT/predictor.json"

step "convert"
$PY convert.py -q --outtype f16 --outfile "$OUT/$NAME.powerinfer.gguf" "$HF" "$HF/predictor"
$PY convert.py -q --outtype q4_0 --outfile "$OUT/$NAME.q4_0.powerinfer.gguf" "$HF" "$HF/predictor"
$PY convert-dense.py -q --outtype f16 --outfile "$OUT/$NAME.dense.gguf" "$HF"

if [ "${SKIP_STATS:-0}" != 1 ]; then
    step "card statistics"
    $PY tools/model_card_stats.py --hf "$HF" --dir "$OUT" --name "$NAME" --ctx "$CTX" "--sweep=$SWEEP"
fi
ls -l "$OUT" "$OUT/activation" >&2
step "done"
