"""powerinfer.quantize on the recurrent and encoder architectures (gated delta net layers with their ssm_* tensors,
experts and the gated shared expert, qwen3next's ssm_ba; bert / nomic-bert's biases, norms, token types and fused
attn_qkv; LFM2's short conv): llama-quantize's file byte for byte. The qwen35 / lfm2 files at n_embd 256 so that the
K-quants apply (the tiny ones fall back to Q5_0 / Q8_0 almost everywhere)."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from encoder_files import write_bert_model  # noqa: E402
from model_files import LFM2, QWEN35, write_lfm2_model, write_lfm2moe_model, write_qwen35_model  # noqa: E402

from powerinfer.quant_rules import FTYPE, QuantOptions  # noqa: E402
from powerinfer.quantize import quantize_file  # noqa: E402

LFM2_256 = dict(LFM2, n_embd=256, n_ff=512, head_dim=64)
QWEN35_256 = dict(QWEN35, n_embd=256, n_ff=512, n_ff_exp=256, n_ff_shexp=256, head_dim=64, d_state=64)


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M", "Q6_K"])
@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next", "bert", "nomic-bert", "lfm2", "lfm2moe"])
def test_quantizer_writes_llama_quantizes_file(tmp_path, arch, ftype):
    src, ours, theirs = tmp_path / "f32.gguf", tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    if arch.endswith("bert"):
        write_bert_model(src, arch, seed=3)
    elif arch == "lfm2":
        write_lfm2_model(src, seed=3, c=LFM2_256)
    elif arch == "lfm2moe":
        write_lfm2moe_model(src, seed=3)
    else:
        write_qwen35_model(src, arch, seed=3, c=QWEN35_256)
    quantize_file(src, ours, QuantOptions(ftype=FTYPE[ftype]))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = FTYPE[ftype], 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(theirs).encode(), ctypes.byref(p)) == 0
    assert ours.read_bytes() == theirs.read_bytes()
