"""The architectures on llama's blocks (model_files.LLAMA_BLOCK_ARCHS: mistral3, ...) on tiny random files against the
float64 reference (tests/reference_model.py) at every ISA level, and what each new piece changes: the reference without
it is far from ours. llama.cpp checks the same files in tests/compat/test_llama_block_archs_vs_llama_cpp.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from helpers import FLOAT_REL_RMS, KV_F16_REL_RMS, check_level, logits_all, rel_rms  # noqa: E402
from model_files import LLAMA_BLOCK_ARCHS, CONFIGS, rewrite, write_arch_model  # noqa: E402
from powerinfer.gguf_file import ModelLoadError  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
LEVELS = ["scalar", "avx2", "avx512"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("archs")
    out = {}
    for arch in LLAMA_BLOCK_ARCHS:
        out[arch] = d / f"tiny-{arch}.gguf"
        write_arch_model(out[arch], arch, seed=3)
    return out


def ours(path, **kw):
    return logits_all(pi.Context(pi.Model(path, **kw), n_ctx=64, kv_type="f32"), PROMPT)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("arch", LLAMA_BLOCK_ARCHS)
def test_forward_matches_reference(files, arch, level):
    check_level(files[arch], level, ReferenceModel(files[arch]).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


@pytest.mark.parametrize("arch", LLAMA_BLOCK_ARCHS)
def test_f16_cache(files, arch):
    got = logits_all(pi.Context(pi.Model(files[arch]), n_ctx=64, kv_type="f16"), PROMPT)
    assert rel_rms(got, ReferenceModel(files[arch]).forward(PROMPT)) < KV_F16_REL_RMS


def test_mistral3_pieces_matter(files):
    """The per-position q scale, the YaRN log multiplier (cos/sin scale 1 here, not 1 + 0.1 ln 16) and the output bias
    each change the logits."""
    path = files["mistral3"]
    got = ours(path)
    c = CONFIGS["mistral3"]
    hp = pi.Model(path).hparams
    assert (hp.attn_temp_scale, hp.attn_temp_floor, hp.yarn_log_mul) == pytest.approx(
        (c["temp_scale"], c["orig_ctx"], c["yarn_log_mul"]))
    assert pi.rope.rope_mscale(hp) == pytest.approx(1.0)
    for name, off in (("attn_temp", 0.0), ("yarn_log_mul", 0.0)):
        assert rel_rms(got, ReferenceModel(path, **{name: off}).forward(PROMPT)) > 1e-3, name
    ref = ReferenceModel(path)
    for L in ref.layers:
        L.pop("attn_output.bias")
    assert rel_rms(got, ref.forward(PROMPT)) > 1e-3
    # the scale starts at position orig_ctx: the first 8 positions' logits are those of the reference without it
    no_temp = ReferenceModel(path, attn_temp=0.0).forward(PROMPT)
    assert rel_rms(got[:c["orig_ctx"]], no_temp[:c["orig_ctx"]]) < FLOAT_REL_RMS


def test_mistral3_without_bias_or_temperature(files, tmp_path):
    """Without attn_output.bias and attention.temperature_scale (Mistral Small 3.x style files) it is plain llama with
    YaRN; the temperature without the YaRN original context is refused."""
    path = files["mistral3"]
    n_layer = CONFIGS["mistral3"]["n_layer"]
    plain = rewrite(path, tmp_path / "plain.gguf", meta={"mistral3.attention.temperature_scale": None},
                    drop=[f"blk.{il}.attn_output.bias" for il in range(n_layer)])
    assert pi.Model(plain).hparams.attn_temp_scale == 0.0
    assert rel_rms(ours(plain), ReferenceModel(plain).forward(PROMPT)) < FLOAT_REL_RMS
    bad = rewrite(path, tmp_path / "bad.gguf", meta={"mistral3.rope.scaling.original_context_length": None})
    with pytest.raises(ModelLoadError, match="original_context_length"):
        pi.Model(bad)


def test_exaone4_pieces_matter(files, tmp_path):
    """The 64-layer file (llama.cpp windows the 32B's layers only): the window and the global layers without rope each
    change the logits; with fewer layers (the 1.2B) every layer is global and ropes, whatever the window key says."""
    from gguf import GGUFValueType as VT
    path = files["exaone4"]
    hp = pi.Model(path).hparams
    assert (hp.rope_mode, hp.qk_norm, hp.post_norms_only, hp.n_swa, hp.swa_pattern, hp.n_no_rope_layer_step) == \
        ("neox", 1, True, CONFIGS["exaone4"]["n_swa"], 4, 4)
    got = ours(path)
    for name, off in (("n_swa", 0), ("nope_global", False)):
        assert rel_rms(got, ReferenceModel(path, **{name: off}).forward(PROMPT)) > 1e-3, name
    small = rewrite(path, tmp_path / "exaone4-3.gguf", meta={"exaone4.block_count": (3, VT.UINT32)},
                    drop=[n for n in pi.Model(path).file.tensors if n.startswith("blk.") and int(n.split(".")[1]) >= 3])
    hp = pi.Model(small).hparams
    assert (hp.n_swa, hp.n_no_rope_layer_step) == (0, 0)
    assert rel_rms(ours(small), ReferenceModel(small).forward(PROMPT)) < FLOAT_REL_RMS


def test_ernie4_5_is_llama_with_normal_rope(files):
    """ERNIE 4.5 dense: llama's blocks with NORMAL rope pairs (NEOX's far off) and tied embeddings."""
    path = files["ernie4_5"]
    hp = pi.Model(path).hparams
    assert hp.rope_mode == "normal" and "output.weight" not in pi.Model(path).file.tensors
    assert rel_rms(ours(path), ReferenceModel(path, neox=True).forward(PROMPT)) > 1e-3


def test_seed_oss_pieces(files):
    """Seed-OSS: the q/k/v biases (read because the file has them) and its post_attention_norm as the FFN's pre-norm."""
    path = files["seed_oss"]
    got = ours(path)
    ref = ReferenceModel(path)
    for L in ref.layers:
        for k in "qkv":
            L.pop(f"attn_{k}.bias")
    assert rel_rms(got, ref.forward(PROMPT)) > 1e-3
    ref = ReferenceModel(path)
    for L in ref.layers:
        L.pop("ffn_norm")
    assert rel_rms(got, ref.forward(PROMPT)) > 1e-3
    assert pi.Model(path).hparams.rope_mode == "neox"


def test_hunyuan_dense_norms_after_rope(files):
    """hunyuan-dense: q/k normed after the rope; before it (qwen3's order) is far off."""
    path = files["hunyuan-dense"]
    hp = pi.Model(path).hparams
    assert (hp.rope_mode, hp.qk_norm, hp.qk_norm_after_rope) == ("neox", 1, True)
    assert rel_rms(ours(path), ReferenceModel(path, qk_norm_after_rope=False).forward(PROMPT)) > 1e-3


def test_arcee_relu_squared(files):
    """arcee: W_down relu(W_up x)^2 without a gate; relu alone (unsquared) is far off. About half of the activations
    are exact zeros (a naturally sparse FFN; run dense here)."""
    path = files["arcee"]
    hp = pi.Model(path).hparams
    assert (hp.ffn_act, hp.ffn_gate, hp.ffn_act_square) == ("relu", "seq", True)
    ref = ReferenceModel(path)
    ref.ffn = lambda L, g, x=None, trace=None: np.maximum(g @ L["ffn_up"].T, 0.0) @ L["ffn_down"].T   # unsquared
    assert rel_rms(ours(path), ref.forward(PROMPT)) > 1e-3
    up = ReferenceModel(path).tok_embd[PROMPT] @ ReferenceModel(path).layers[0]["ffn_up"].T
    assert 0.3 < np.mean(up <= 0.0) < 0.7


@pytest.mark.parametrize("arch", ["command-r", "cohere2"])
def test_cohere_pieces_matter(files, arch):
    """command-r / cohere2: LayerNorm (RMSNorm far off), the parallel block (sequential far off), the logit scale; and
    cohere2's window and its global layers without rope."""
    path = files[arch]
    hp = pi.Model(path).hparams
    assert (hp.layer_norm, hp.parallel_block, hp.rope_mode) == (True, True, "normal")
    assert hp.logit_scale == pytest.approx(1.0 / CONFIGS[arch]["logit_scale"])
    got = ours(path)
    offs = [("layer_norm", False), ("parallel", False), ("logit_scale", 1.0)]
    if arch == "cohere2":
        offs += [("n_swa", 0), ("nope_global", False)]
        assert (hp.n_swa, hp.swa_pattern, hp.n_no_rope_layer_step) == (CONFIGS[arch]["n_swa"], 4, 4)
    for name, off in offs:
        assert rel_rms(got, ReferenceModel(path, **{name: off}).forward(PROMPT)) > 1e-3, name


@pytest.mark.parametrize("arch,why", [("command-r", "(command-r, cohere2) run on the CPU only"),
                                      ("apertus", "xIELU activation (apertus) runs on the CPU only")])
def test_offload_refused(files, arch, why):
    """Offloading command-r (the device has no LayerNorm) or apertus (nor xIELU) on the emulated device is refused
    with a message: the context runs on the CPU and says why."""
    script = ("import sys, powerinfer as pi\n"
              "c = pi.Context(pi.Model(sys.argv[1]), n_ctx=64, n_gpu_layers=-1)\n"
              "print(c.offload is None, '|'.join(c.gpu_warnings))\n")
    env = dict(os.environ, POWERINFER_EMULATED_GPU_MIB="256")
    out = subprocess.run([sys.executable, "-c", script, str(files[arch])], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True") and why in out.stdout, out.stdout


def test_exaone_neox_and_rope_factors(files):
    """EXAONE 3.5: llama's blocks with NEOX rope pairs (NORMAL far off) and the file's rope_freqs (without, far off)."""
    path = files["exaone"]
    assert pi.Model(path).hparams.rope_mode == "neox"
    got = ours(path)
    assert rel_rms(got, ReferenceModel(path, neox=False).forward(PROMPT)) > 1e-3
    assert rel_rms(got, ReferenceModel(path, rope_freqs=None).forward(PROMPT)) > 1e-3


def test_apertus_xielu(files):
    """apertus: the FFN is W_down xielu(W_up x) with each layer's parameters; ReLU^2 or the first layer's parameters
    everywhere are far off (the op itself: tests/test_ops.py's test_xielu)."""
    path = files["apertus"]
    hp = pi.Model(path).hparams
    assert (hp.ffn_act, hp.ffn_gate, len(hp.xielu)) == ("xielu", "seq", CONFIGS["apertus"]["n_layer"])
    got = ours(path)
    assert rel_rms(got, ReferenceModel(path, relu_sqr=True).forward(PROMPT)) > 1e-3
    ref = ReferenceModel(path)
    for L in ref.layers:
        L["xielu"] = ref.layers[0]["xielu"]
    assert rel_rms(got, ref.forward(PROMPT)) > 1e-3
