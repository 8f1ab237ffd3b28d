"""The architectures of issue 7 in dense mode (llama/mistral, qwen2, qwen3, gemma3) against a float64 numpy
forward pass written from llama.cpp's graphs (tests/reference_model.py), on tiny random f32 models.

What each architecture exercises: qwen2 the q/k/v biases, NEOX rope and a tied output; qwen3 per-head QK
RMSNorm without biases and a head size different from n_embd / n_head, with its own output matrix; gemma3 a
head size different from n_embd / n_head, per-head QK RMSNorm, the post-attention and post-FFN
norms, the GELU FFN, the embedding scale sqrt(n_embd), and local layers (a sliding window of 5
positions, rope base 10000) next to a global one (layer 5 of 7). llama.cpp itself checks the same
files in tests/compat/test_arch_vs_llama_cpp.py.
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
from helpers import FLOAT_REL_RMS, KV_F16_REL_RMS, logits_all, logits_one_by_one, rel_rms  # noqa: E402
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
    for arch in ("llama", "qwen2", "qwen3", "gemma3"):
        path = d / f"tiny-{arch}.gguf"
        out[arch] = (path, write_arch_model(path, arch, seed=3))
    path = d / "tiny-llama-rope-freqs.gguf"    # llama with Llama 3.1-style rope frequency factors
    out["llama-ff"] = (path, write_arch_model(path, "llama", weights=make_weights("llama", 4, rope_freqs=True)))
    path = d / "tiny-mistral.gguf"     # the llama weights under general.architecture = mistral
    write_arch_model(path, "mistral", weights=out["llama"][1])
    out["mistral"] = (path, out["llama"][1])
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3", "llama-ff"])
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


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma3"])
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


def test_gemma3_without_sliding_window_is_refused(tmp_path, files):
    import gguf
    src = gguf.GGUFReader(files["gemma3"][0])
    assert "gemma3.attention.sliding_window" in src.fields
    from powerinfer.model import _hparams_from_metadata
    meta = {"general.architecture": "gemma3", "gemma3.embedding_length": 128, "gemma3.attention.head_count": 4,
            "gemma3.context_length": 512, "gemma3.feed_forward_length": 256, "gemma3.block_count": 7,
            "gemma3.attention.key_length": 64, "tokenizer.ggml.tokens": ["a"] * 320}
    with pytest.raises(ModelLoadError, match="sliding_window"):
        _hparams_from_metadata(tmp_path / "x.gguf", meta)
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
