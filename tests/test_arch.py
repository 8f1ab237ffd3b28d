"""The architectures of issue 7 in dense mode (llama/mistral, qwen2, qwen3, gemma2, gemma3) against a float64 numpy
forward pass written from llama.cpp's graphs (tests/reference_model.py), on tiny random f32 models.

What each architecture exercises: qwen2 the q/k/v biases, NEOX rope and a tied output; qwen3 per-head QK
RMSNorm without biases and a head size different from n_embd / n_head, with its own output matrix; gemma3 a
head size different from n_embd / n_head, per-head QK RMSNorm, the post-attention and post-FFN
norms, the GELU FFN, the embedding scale sqrt(n_embd), and local layers (a sliding window of 5
positions, rope base 10000) next to a global one (layer 5 of 7); gemma2 gemma3's blocks without the QK norms, with
soft-capped attention scores and logits (caps of 5 and 3, small enough to change these scores and logits) and every
other layer local (0 and 2 of 4, the one rope base). llama.cpp itself checks the same files in
tests/compat/test_arch_vs_llama_cpp.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from model_files import CONFIGS, make_weights, write_arch_model  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402
from helpers import (FLOAT_REL_RMS, KV_F16_REL_RMS, check_level, llama_cpp_logits, logits_all,
                     logits_one_by_one, rel_rms)  # noqa: E402
from powerinfer.gguf_file import ModelLoadError  # noqa: E402

# f32 weights and KV cache: float32 arithmetic against float64 (rel. RMS of the logits; measured
# ~1e-7 .. 4e-7); an f16 KV cache rounds K and V to 11 bits (measured ~3e-4).
F32_REL_RMS = FLOAT_REL_RMS
F16_KV_REL_RMS = KV_F16_REL_RMS
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]   # 16 > the window of 5


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    out = {}
    for arch in ("llama", "qwen2", "qwen3", "gemma2", "gemma3"):
        path = d / f"tiny-{arch}.gguf"
        out[arch] = (path, write_arch_model(path, arch, seed=3))
    path = d / "tiny-llama-rope-freqs.gguf"    # llama with Llama 3.1-style rope frequency factors
    out["llama-ff"] = (path, write_arch_model(path, "llama", weights=make_weights("llama", 4, rope_freqs=True)))
    path = d / "tiny-mistral.gguf"     # the llama weights under general.architecture = mistral
    write_arch_model(path, "mistral", weights=out["llama"][1])
    out["mistral"] = (path, out["llama"][1])
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "llama-ff"])
def test_forward_matches_numpy(files, arch):
    path, _ = files[arch]
    model = pi.Model(path)
    ours = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    ref = ReferenceModel(path).forward(PROMPT)
    assert rel_rms(ours, ref) < F32_REL_RMS, rel_rms(ours, ref)
    ours16 = logits_all(pi.Context(model, n_ctx=64, kv_type="f16"), PROMPT)
    assert rel_rms(ours16, ref) < F16_KV_REL_RMS


def test_hparams(files):
    hp = pi.Model(files["gemma3"][0]).hparams
    c = CONFIGS["gemma3"]
    assert (hp.arch, hp.head_dim, hp.n_rot, hp.rope_mode) == ("gemma3", 64, 64, "neox")
    assert hp.n_swa == c["n_swa"] and hp.swa_pattern == 6 and hp.qk_norm and hp.post_norms
    assert [hp.is_swa_layer(i) for i in range(7)] == [True] * 5 + [False, True]
    assert hp.ffn_act == "gelu" and hp.embd_scale == pytest.approx(np.sqrt(128))
    assert hp.attn_scale == pytest.approx(1 / 8) and hp.rope_freq_base_swa == 10000.0
    hq = pi.Model(files["qwen2"][0]).hparams
    assert hq.rope_mode == "neox" and hq.qkv_bias and hq.head_dim == 0 and not hq.qk_norm
    h3 = pi.Model(files["qwen3"][0]).hparams
    assert (h3.arch, h3.rope_mode, h3.head_dim, h3.n_rot) == ("qwen3", "neox", 64, 64)
    assert h3.qk_norm and not h3.qkv_bias and not h3.post_norms and h3.n_swa == 0 and h3.ffn_act == "silu"
    hl = pi.Model(files["llama"][0]).hparams
    assert hl.rope_mode == "normal" and not hl.qkv_bias and hl.n_swa == 0


def test_mistral_is_llama(files):
    a = logits_all(pi.Context(pi.Model(files["llama"][0]), n_ctx=64, kv_type="f32"), PROMPT)
    b = logits_all(pi.Context(pi.Model(files["mistral"][0]), n_ctx=64, kv_type="f32"), PROMPT)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma2", "gemma3"])
def test_batch_equals_token_by_token(files, arch):
    """Incremental decoding (the sliding window over cached cells) gives the batched logits."""
    model = pi.Model(files[arch][0])
    batched = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    single = logits_one_by_one(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    np.testing.assert_allclose(single, batched, rtol=0, atol=1e-4 * np.abs(batched).max())


def test_local_layers_matter(files):
    """The window and the local rope base change the result: the logits match the reference with
    them and are far from the reference without them (all layers global, or local layers with the
    global rope base)."""
    path, _ = files["gemma3"]
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < F32_REL_RMS
    assert rel_rms(ours, ReferenceModel(path, n_swa=1000).forward(PROMPT)) > 1e-3
    assert rel_rms(ours, ReferenceModel(path, rope_base_swa=1000000.0).forward(PROMPT)) > 1e-3


def test_thread_counts_identical(files):
    model = pi.Model(files["gemma3"][0])
    outs = [logits_all(pi.Context(model, n_ctx=64, n_threads=n, kv_type="f32"), PROMPT) for n in (1, 2, 3)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_unsupported_architecture_is_named(tmp_path):
    w = make_weights("llama")
    path = tmp_path / "phi2.gguf"
    c = dict(CONFIGS["llama"])
    CONFIGS["phi2"] = c
    try:
        write_arch_model(path, "phi2", weights=w)
    finally:
        del CONFIGS["phi2"]
    with pytest.raises(ModelLoadError, match="unsupported architecture 'phi2'"):
        pi.Model(path)


def test_gemma3_sliding_window_pattern(tmp_path):
    """The window's layer pattern from per-layer flags (newer converters); no window: every layer global."""
    from powerinfer.model import _hparams_from_metadata
    meta = {"general.architecture": "gemma3", "gemma3.embedding_length": 128, "gemma3.attention.head_count": 4,
            "gemma3.context_length": 512, "gemma3.feed_forward_length": 256, "gemma3.block_count": 7,
            "gemma3.attention.key_length": 64, "tokenizer.ggml.tokens": ["a"] * 320}
    assert _hparams_from_metadata(tmp_path / "x.gguf", meta).n_swa == 0
    with pytest.raises(ModelLoadError, match="final_logit_softcapping"):
        _hparams_from_metadata(tmp_path / "x.gguf", {**meta, "gemma3.final_logit_softcapping": -1.0})
    hp = _hparams_from_metadata(tmp_path / "x.gguf", {**meta, "gemma3.attention.sliding_window": 512,
                                                      "gemma3.attention.sliding_window_pattern":
                                                          [True, True, False] * 2 + [True]})
    assert hp.swa_pattern == 3


def test_main_conversation_mode(tmp_path):
    """examples/main.py -cnv renders each turn with the file's chat template and feeds only the new text."""
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    path = tmp_path / "chat-gemma3.gguf"
    write_arch_model(path, "gemma3", seed=1, chat_template=template)
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"
    r = subprocess.run([sys.executable, str(main), "-m", str(path), "-cnv", "-sys", "be brief", "--temp", "0",
                        "-n", "4", "-t", "1"], input="hello there\n\nand again\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "chat template: gguf" in r.stderr
    assert r.stdout.count("> ") == 4     # two turns; the empty line is no message and ends nothing; then EOF
    assert "prompt eval time" in r.stderr
    # the file has a chat template: conversation mode is on without -cnv; -p is the first message, -st one turn
    r = subprocess.run([sys.executable, str(main), "-m", str(path), "-p", "hello", "-st", "--temp", "0",
                        "-n", "4", "-t", "1"], input="never read\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "conversation mode is on" in r.stderr and r.stdout.startswith("> hello\n")
    assert r.stdout.count("> ") == 1 and "never read" not in r.stdout


def test_rope_freq_factors_matter(files):
    path, _ = files["llama-ff"]
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(path, rope_freqs=None).forward(PROMPT)) > 1e-3


# ---- gemma2 ----------------------------------------------------------------------------------------------------------
# What each of gemma2's features changes in the tiny model's logits (rel. RMS against the reference with it; measured
# 2.2e-2 .. 4.6e-2 over seeds 3, 5, 7): far above F32_REL_RMS (ours is 2.6e-7 from the reference) and above the f16
# GELU table's 3.6e-4 against llama.cpp (tests/compat/test_arch_vs_llama_cpp.py).
GEMMA2_FEATURE_MIN = 1e-2


def gemma2_logits(model, *, one_by_one=False, kv_type="f32"):
    ctx = pi.Context(model, n_ctx=64, kv_type=kv_type)
    return logits_one_by_one(ctx, PROMPT) if one_by_one else logits_all(ctx, PROMPT)


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
def test_gemma2_matches_numpy_at_every_level(files, level):
    """gemma2 (soft caps, every other layer local) against the float64 reference at every ISA level this machine runs:
    the prompt (attend_block: attn_qk's scores where the level has them) and token by token (attend); the same bits
    at every level (docs/design.md, numeric contract)."""
    path, _ = files["gemma2"]
    check_level(path, level, ReferenceModel(path).forward(PROMPT), PROMPT, F32_REL_RMS)


def test_gemma2_features_matter(files):
    """Each soft cap and the local layers change the logits far beyond the tolerance: without the attention cap,
    without the final cap, with every layer global, with gemma3's pattern (every 6th layer global) instead of every
    other one, the reference is far from ours."""
    path, _ = files["gemma2"]
    ours = gemma2_logits(pi.Model(path))
    assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < F32_REL_RMS
    for change in (dict(attn_softcap=0.0), dict(final_softcap=0.0), dict(n_swa=1000), dict(swa_pattern=6)):
        err = rel_rms(ours, ReferenceModel(path, **change).forward(PROMPT))
        assert err > GEMMA2_FEATURE_MIN, (change, err)
    assert np.abs(ours).max() < CONFIGS["gemma2"]["final_softcap"]


def test_gemma2_hparams(files):
    hp = pi.Model(files["gemma2"][0]).hparams
    c = CONFIGS["gemma2"]
    assert (hp.arch, hp.head_dim, hp.n_rot, hp.rope_mode, hp.ffn_act) == ("gemma2", 64, 64, "neox", "gelu")
    assert (hp.attn_softcap, hp.final_softcap) == (c["attn_softcap"], c["final_softcap"])
    assert hp.n_swa == c["n_swa"] and hp.swa_pattern == 2 and not hp.qk_norm and hp.post_norms
    assert [hp.is_swa_layer(i) for i in range(4)] == [True, False, True, False]
    assert hp.embd_scale == pytest.approx(np.sqrt(128)) and hp.attn_scale == pytest.approx(1 / 8)
    assert (hp.rope_freq_base_swa, hp.rope_freq_scale_swa) == (c["rope_base"], 1.0)
    assert pi.Model(files["gemma3"][0]).hparams.attn_softcap == 0.0


GEMMA2_META = {"general.architecture": "gemma2", "gemma2.embedding_length": 2304, "gemma2.attention.head_count": 8,
               "gemma2.attention.head_count_kv": 4, "gemma2.context_length": 8192,
               "gemma2.feed_forward_length": 9216, "gemma2.block_count": 26, "gemma2.attention.key_length": 256,
               "gemma2.attention.value_length": 256, "tokenizer.ggml.tokens": ["a"] * 320}


def test_gemma2_metadata_defaults(tmp_path):
    """llama.cpp's defaults where a file lacks the keys (llama_model_gemma2: window 4096, caps 50 and 30); the 27B's
    q scale 1/sqrt(n_embd / n_head) (46 layers, gemma_pytorch's query_pre_attn_scalar), the others' 1/sqrt(head_dim);
    a rope.freq_base_swa key for the local layers; soft caps of 0 turn them off."""
    from powerinfer.model import _hparams_from_metadata
    hp = _hparams_from_metadata(tmp_path / "x.gguf", GEMMA2_META)       # Gemma 2 2B's shape
    assert (hp.n_swa, hp.swa_pattern, hp.attn_softcap, hp.final_softcap) == (4096, 2, 50.0, 30.0)
    assert hp.attn_scale == pytest.approx(1 / 16) and hp.head_dim == 256
    big = {**GEMMA2_META, "gemma2.embedding_length": 4608, "gemma2.attention.head_count": 32,
           "gemma2.attention.head_count_kv": 16, "gemma2.attention.key_length": 128,
           "gemma2.attention.value_length": 128, "gemma2.block_count": 46}                  # 27B
    assert _hparams_from_metadata(tmp_path / "x.gguf", big).attn_scale == pytest.approx(1 / 12)
    hp = _hparams_from_metadata(tmp_path / "x.gguf", {**GEMMA2_META, "gemma2.rope.freq_base": 20000.0,
                                                      "gemma2.rope.freq_base_swa": 5000.0,
                                                      "gemma2.attn_logit_softcapping": 0.0,
                                                      "gemma2.final_logit_softcapping": 0})
    assert (hp.rope_freq_base, hp.rope_freq_base_swa, hp.attn_softcap, hp.final_softcap) == (20000.0, 5000.0, 0, 0)


@pytest.mark.parametrize("key,value,words", [
    ("attn_logit_softcapping", -50.0, ["gemma2.attn_logit_softcapping", ">= 0"]),
    ("final_logit_softcapping", float("nan"), ["gemma2.final_logit_softcapping", "finite"]),
    ("final_logit_softcapping", float("inf"), ["gemma2.final_logit_softcapping", "finite"]),
    ("attn_logit_softcapping", "50", ["gemma2.attn_logit_softcapping", "not a number"]),
    ("final_logit_softcapping", True, ["gemma2.final_logit_softcapping", "not a number"]),
    ("attention.sliding_window_pattern", -2, ["gemma2.attention.sliding_window_pattern"]),
])
def test_gemma2_bad_metadata_is_named(tmp_path, key, value, words):
    """Bad soft-capping (or window) metadata: a ModelLoadError naming the key, from the metadata and from a file."""
    from powerinfer.model import _hparams_from_metadata
    with pytest.raises(ModelLoadError) as e:
        _hparams_from_metadata(tmp_path / "x.gguf", {**GEMMA2_META, f"gemma2.{key}": value})
    for w in words:
        assert w in str(e.value)


def test_gemma2_bad_softcap_in_a_file(tmp_path, files):
    import gguf
    from model_files import rewrite
    bad = rewrite(files["gemma2"][0], tmp_path / "bad.gguf",
                  meta={"gemma2.final_logit_softcapping": (-3.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(ModelLoadError, match="gemma2.final_logit_softcapping"):
        pi.Model(bad)


def test_gemma3_without_a_window(files, tmp_path):
    """gemma3 without attention.sliding_window (Rnj-1): every layer global, and the file's final logit soft cap:
    the reference's logits and, where llama-cpp-python is installed, llama.cpp's."""
    from gguf import GGUFValueType as VT
    from model_files import rewrite
    path = rewrite(files["gemma3"][0], tmp_path / "gemma3-global.gguf",
                   meta={"gemma3.attention.sliding_window": None, "gemma3.final_logit_softcapping": (3.0, VT.FLOAT32)})
    hp = pi.Model(path).hparams
    assert hp.n_swa == 0 and hp.final_softcap == 3.0
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), PROMPT)
    ref = ReferenceModel(path)
    assert ref.n_swa == 0 and rel_rms(ours, ref.forward(PROMPT)) < F32_REL_RMS, rel_rms(ours, ref.forward(PROMPT))
    assert rel_rms(ours, ReferenceModel(path, final_softcap=0.0).forward(PROMPT)) > 1e-3
    assert rel_rms(ours, llama_cpp_logits(path, PROMPT)) < 3e-3   # the f16 GELU table (skipped without the peer)
