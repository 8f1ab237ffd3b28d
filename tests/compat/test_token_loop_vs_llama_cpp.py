"""llama-cpp-python's token loop (Llama.eval / scores / generate(tokens) / sample) run by the same code on its Llama
and on our PowerInfer over one file: the same logits (REL_RMS, measured value in parentheses) and the same greedy
tokens, including sent draft tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import rel_rms  # noqa: E402
from model_files import write_arch_model  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
REL_RMS = 1e-5     # (measured 3e-7)


def user_code(llm, n: int) -> tuple[np.ndarray, list[int], list[int]]:
    """What a llama-cpp-python user writes: eval, read scores, generate greedily, feed a draft back."""
    llm.reset()
    llm.eval(PROMPT[:9])
    llm.eval(PROMPT[9:])
    scores = np.array(llm.scores[:llm.n_tokens], dtype=np.float64)
    greedy = []
    for tok in llm.generate(PROMPT, top_k=1, temp=0.0):
        greedy.append(int(tok))
        if len(greedy) == n:
            break
    g = llm.generate(PROMPT, temp=0.0)
    drafted = [int(next(g))]
    drafted.append(int(g.send(greedy[1:4])))
    while len(drafted) < n:
        drafted.append(int(next(g)))
    g.close()
    return scores, greedy, drafted


def test_token_loop_agrees_with_llama_cpp(tmp_path):
    path = tmp_path / "tiny-llama.gguf"
    write_arch_model(path, "llama", seed=7)
    theirs = user_code(llama_cpp.Llama(str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False,
                                       n_threads=1, type_k=0, type_v=0, seed=1), 12)
    ours = user_code(pi.PowerInfer(path, n_ctx=64, logits_all=True, verbose=False, n_threads=1, type_k=0,
                                   type_v=0, seed=1), 12)
    err = rel_rms(ours[0], theirs[0])
    print(f"scores: relative RMS difference {err:.2e}; greedy {ours[1]}")
    assert ours[0].shape == theirs[0].shape == (len(PROMPT), theirs[0].shape[1])
    assert err < REL_RMS, err
    assert ours[1] == theirs[1] and ours[2] == theirs[2] == ours[1]
