#!/usr/bin/env python3
"""Train the bundled model's SentencePiece tokenizer (LLaMA-style BPE) on the corpus.

    python tools/train_tokenizer.py [data/corpus/train.txt] [--out models/tinyrelu-hf/tokenizer.model]
        [--vocab-size 4096]

Settings as LLaMA's tokenizer: model_type=bpe, byte_fallback (the 256 <0xNN> pieces, so any
text encodes), identity normalization (no NFKC), split_digits, add_dummy_prefix, pieces
<unk>=0, <s>=1, </s>=2, no pad, allow_whitespace_only_pieces, remove_extra_whitespaces off,
max_sentence_length 16384 (one corpus line is one paragraph). character_coverage 1.0 (the
corpus is ASCII). Deterministic: single-threaded, no sentence sampling (the whole file is
used), so the same corpus gives a byte-identical tokenizer.model.
"""
from __future__ import annotations

import argparse
import io
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("text", nargs="?", default="data/corpus/train.txt")
    ap.add_argument("--out", default="models/tinyrelu-hf/tokenizer.model")
    ap.add_argument("--vocab-size", type=int, default=4096)
    a = ap.parse_args(argv)
    if not os.path.isfile(a.text):
        print(f"train_tokenizer: error: text file not found: {a.text} "
              f"(run tools/prepare_corpus.py first)", file=sys.stderr)
        return 1
    import sentencepiece as spm

    # the model goes to a BytesIO (model_writer), so no temporary path ends up in the file's
    # trainer_spec (a random path would make the file differ from run to run)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=a.text, model_writer=buf, model_type="bpe", vocab_size=a.vocab_size,
        byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, add_dummy_prefix=True,
        allow_whitespace_only_pieces=True, split_by_unicode_script=True,
        split_by_whitespace=True, split_by_number=True, character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentence_length=16384,
        input_sentence_size=0, shuffle_input_sentence=False, num_threads=1,
        minloglevel=2)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "wb") as f:
        f.write(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_file=a.out)
    with open(a.text, encoding="utf-8") as f:
        sample = f.read(1 << 20)
    n = len(sp.encode(sample))
    print(f"train_tokenizer: {sp.get_piece_size()} pieces -> {a.out}; "
          f"{len(sample.encode()) / n:.2f} bytes/token on the first MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
