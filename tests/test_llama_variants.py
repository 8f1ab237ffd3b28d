"""Architectures that are llama with flags, on tiny random f32 files against the float64 reference
(tests/reference_model.py): granite (IBM Granite 3.x: embedding, attention, residual and logit multipliers), smollm3
(no rope in every 4th layer), olmo2 (OLMo 2 / 3: no pre-norms, post-norms, q/k RMSNorm over the whole projection,
OLMo 3's sliding window every 4th layer global), glm4 (GLM-4-0414: fused q|k|v with its bias and gate|up split into
views, NORMAL rope over half a head, norms before and after each block). llama.cpp checks the same files in
tests/compat/test_llama_variants_vs_llama_cpp.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from helpers import FLOAT_REL_RMS, KV_F16_REL_RMS, llama_cpp_logits, logits_all, logits_one_by_one, rel_rms  # noqa: E402
from model_files import CONFIGS, write_arch_model  # noqa: E402
from powerinfer.gguf_file import ModelLoadError  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("archs")
    out = {}
    for arch in ("granite", "smollm3", "olmo2", "glm4"):
        out[arch] = d / f"tiny-{arch}.gguf"
        write_arch_model(out[arch], arch, seed=3)
    return out


@pytest.mark.parametrize("arch", ["granite", "smollm3", "olmo2", "glm4"])
def test_forward_matches_numpy(files, arch):
    model = pi.Model(files[arch])
    ours = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    ref = ReferenceModel(files[arch])
    assert rel_rms(ours, ref.forward(PROMPT)) < FLOAT_REL_RMS, rel_rms(ours, ref.forward(PROMPT))
    assert rel_rms(logits_all(pi.Context(model, n_ctx=64, kv_type="f16"), PROMPT), ref.forward(PROMPT)) < KV_F16_REL_RMS
    single = logits_one_by_one(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    np.testing.assert_allclose(single, ours, rtol=0, atol=1e-4 * np.abs(ours).max())


def test_granite_multipliers_matter(files):
    """Each multiplier changes the logits: the reference without it is far from ours."""
    ours = logits_all(pi.Context(pi.Model(files["granite"]), n_ctx=64, kv_type="f32"), PROMPT)
    for name, off in (("embd_scale", 1.0), ("attn_scale", None), ("residual_scale", 1.0), ("logit_scale", 1.0)):
        other = ReferenceModel(files["granite"], **{name: off}).forward(PROMPT)
        assert rel_rms(ours, other) > 1e-3, name
    hp = pi.Model(files["granite"]).hparams
    c = CONFIGS["granite"]
    assert (hp.embd_scale, hp.residual_scale, hp.logit_scale) == pytest.approx(
        (c["embedding_scale"], c["residual_scale"], c["logit_scale"]))
    assert hp.attn_scale == pytest.approx(c["attention_scale"]) and hp.n_no_rope_layer_step == 0


def test_smollm3_nope_layers_matter(files):
    ours = logits_all(pi.Context(pi.Model(files["smollm3"]), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(files["smollm3"], nope_step=0).forward(PROMPT)) > 1e-3
    assert pi.Model(files["smollm3"]).hparams.n_no_rope_layer_step == 4


def test_granite_without_a_logit_scale_is_refused(tmp_path):
    from model_files import rewrite
    src = tmp_path / "g.gguf"
    write_arch_model(src, "granite", seed=1)
    bad = rewrite(src, tmp_path / "bad.gguf", meta={"granite.logit_scale": None})
    with pytest.raises(ModelLoadError, match="granite.logit_scale"):
        pi.Model(bad)


def test_granite_with_biases_is_refused(tmp_path):
    from model_files import rewrite
    src = tmp_path / "g.gguf"
    write_arch_model(src, "granite", seed=1)
    bad = rewrite(src, tmp_path / "bad.gguf",
                  extra={"blk.0.attn_output.bias": (np.zeros(CONFIGS["granite"]["n_embd"], np.float32), 0)})
    with pytest.raises(ModelLoadError, match="bias tensors"):
        pi.Model(bad)


@pytest.mark.parametrize("shared", [False, True], ids=["experts", "shared-expert"])
def test_granitemoe(tmp_path, shared):
    """granitemoe: the multipliers over Mixtral-layout experts (tests/test_moe.py's file renamed), and Granite MoE
    Shared's ungated shared expert (width 48): the reference's logits and, where llama-cpp-python is installed,
    llama.cpp's."""
    from gguf import GGUFValueType as VT
    from model_files import rename_arch, rewrite
    from test_moe import write_moe
    c = CONFIGS["granite"]
    src = write_moe(tmp_path, "llama")
    meta = {f"granitemoe.{k}": (c[k.replace(".", "_")], VT.FLOAT32)
            for k in ("embedding_scale", "attention.scale", "residual_scale", "logit_scale")}
    if shared:
        rng, E, Fs = np.random.default_rng(9), c["n_embd"], 48
        extra = {}
        for il in range(c["n_layer"]):
            for name, shape in (("gate", (Fs, E)), ("up", (Fs, E)), ("down", (E, Fs))):
                w = rng.standard_normal(shape) / np.sqrt(shape[1])
                extra[f"blk.{il}.ffn_{name}_shexp.weight"] = (w.astype(np.float32), 0)
        src = rewrite(src, tmp_path / "shared.gguf", extra=extra)
        meta["granitemoe.expert_shared_feed_forward_length"] = (Fs, VT.UINT32)
    path = rename_arch(src, tmp_path / "granitemoe.gguf", "granitemoe", meta)
    assert pi.Model(path).hparams.n_ff_shexp == (48 if shared else 0)
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    ref = ReferenceModel(path).forward(PROMPT)
    assert rel_rms(ours, ref) < FLOAT_REL_RMS, rel_rms(ours, ref)
    assert rel_rms(ours, ReferenceModel(path, residual_scale=1.0).forward(PROMPT)) > 1e-3
    assert rel_rms(ours, llama_cpp_logits(path, PROMPT)) < 1e-5     # (skipped without llama-cpp-python)


def test_olmo2_pieces_matter(files, tmp_path):
    """The norms over the whole q and k (not per head) and the window (OLMo 3) change the logits; without a window
    (OLMo 2) every layer is global."""
    path = files["olmo2"]
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(path, n_swa=0).forward(PROMPT)) > 1e-3
    hp = pi.Model(path).hparams
    assert (hp.qk_norm, hp.post_norms_only, hp.swa_pattern, hp.rope_mode) == (2, True, 4, "neox")
    from model_files import rewrite
    plain = rewrite(path, tmp_path / "olmo2-global.gguf", meta={"olmo2.attention.sliding_window": None})
    assert pi.Model(plain).hparams.n_swa == 0
    got = logits_all(pi.Context(pi.Model(plain), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(got, ReferenceModel(plain).forward(PROMPT)) < FLOAT_REL_RMS


def test_glm4_fused_bias(files):
    """glm4's q|k|v bias is fused like its weights: split with them (the reference without it is far from ours)."""
    path = files["glm4"]
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), PROMPT)
    ref = ReferenceModel(path)
    for L in ref.layers:
        for k in "qkv":
            L.pop(f"attn_{k}.bias")
    assert rel_rms(ours, ref.forward(PROMPT)) > 1e-3
    hp = pi.Model(path).hparams
    assert (hp.n_rot, hp.rope_mode, hp.qkv_bias, hp.post_norms) == (16, "normal", True, True)
