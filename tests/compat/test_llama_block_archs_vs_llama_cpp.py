"""The tiny files of tests/test_llama_block_archs.py (architectures on llama's blocks) through llama.cpp
(llama-cpp-python) and through us: f32 weights and KV cache on both sides within REL_RMS (measured in parentheses), and
Q8_0 / Q4_0 files with llama.cpp's greedy tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import QUANT_REL_RMS, greedy_both, llama_cpp_eval, logits_all, rel_rms  # noqa: E402
from model_files import LLAMA_BLOCK_ARCHS, write_arch_model  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
REL_RMS = {"mistral3": 1e-5,      # (measured 2.7e-7)
           "exaone4": 1e-5,      # (measured 1.1e-6: 64 layers)
           "ernie4_5": 1e-5,     # (measured 2.9e-7)
           "seed_oss": 1e-5,     # (measured 2.9e-7)
           "hunyuan-dense": 1e-5,    # (measured 2.9e-7)
           "arcee": 1e-5,            # (measured 3.1e-7)
           "command-r": 1e-5,        # (measured 2.6e-7)
           "cohere2": 1e-5,          # (measured 3.3e-7)
           "exaone": 1e-5,           # (measured 3.1e-7)
           "apertus": 1e-5}          # (measured 3.4e-7)


@pytest.mark.parametrize("arch", LLAMA_BLOCK_ARCHS)
def test_f32_agrees_with_llama_cpp(tmp_path, arch):
    path = tmp_path / f"tiny-{arch}.gguf"
    write_arch_model(path, arch, seed=3)
    _, theirs = llama_cpp_eval(path, PROMPT)
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"{arch}: relative RMS difference from llama.cpp {err:.2e}, the reference's "
          f"{rel_rms(ReferenceModel(path).forward(PROMPT), theirs):.2e}")
    assert err < REL_RMS[arch], err


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("arch", LLAMA_BLOCK_ARCHS)
def test_quantized_greedy_tokens(tmp_path, arch, dtype):
    path = tmp_path / f"tiny-{arch}-{dtype}.gguf"
    write_arch_model(path, arch, seed=3, dtype=dtype)
    ll, theirs = llama_cpp_eval(path, PROMPT)
    model = pi.Model(path)
    err = rel_rms(logits_all(pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1), PROMPT), theirs)
    print(f"{arch} {dtype}: relative RMS difference from llama.cpp {err:.2e}")
    assert err < QUANT_REL_RMS, err
    want, got = greedy_both(ll, model, PROMPT, 12)
    assert got == want


def test_exaone4_unwindowed_agrees_with_llama_cpp(tmp_path):
    """exaone4 with 3 of the 64 layers (as the 1.2B: llama.cpp windows the 64-layer 32B only): every layer global with
    rope, whatever the window key says (measured 3.9e-7)."""
    from gguf import GGUFValueType as VT
    from model_files import rewrite
    path = tmp_path / "tiny-exaone4.gguf"
    write_arch_model(path, "exaone4", seed=3)
    small = rewrite(path, tmp_path / "exaone4-3.gguf", meta={"exaone4.block_count": (3, VT.UINT32)},
                    drop=[n for n in pi.Model(path).file.tensors if n.startswith("blk.") and int(n.split(".")[1]) >= 3])
    _, theirs = llama_cpp_eval(small, PROMPT)
    err = rel_rms(logits_all(pi.Context(pi.Model(small), n_ctx=64, kv_type="f32", n_threads=1), PROMPT), theirs)
    print(f"exaone4, 3 layers: relative RMS difference from llama.cpp {err:.2e}")
    assert err < 1e-5, err


def test_hunyuan_alpha_agrees_with_llama_cpp(tmp_path):
    """A hunyuan-dense file with rope.scaling.alpha (the base scaled by alpha^(d / (d - 2)) at load, as llama.cpp)."""
    from gguf import GGUFValueType as VT
    from model_files import rewrite
    path = tmp_path / "tiny-hunyuan.gguf"
    write_arch_model(path, "hunyuan-dense", seed=3)
    alpha = rewrite(path, tmp_path / "alpha.gguf", meta={"hunyuan-dense.rope.scaling.alpha": (50.0, VT.FLOAT32),
                                                         "hunyuan-dense.rope.freq_base": (10000.0, VT.FLOAT32)})
    assert pi.Model(alpha).hparams.rope_freq_base == pytest.approx(10000.0 * 50.0 ** (32 / 30))
    _, theirs = llama_cpp_eval(alpha, PROMPT)
    ours = logits_all(pi.Context(pi.Model(alpha), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    assert rel_rms(ours, ReferenceModel(alpha).forward(PROMPT)) < 1e-5
    err = rel_rms(ours, theirs)
    print(f"hunyuan-dense with alpha: relative RMS difference from llama.cpp {err:.2e}")
    assert err < 1e-5, err
