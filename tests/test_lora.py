"""LoRA adapters (llama.cpp's GGUF adapters, powerinfer.lora): the logits equal the float64 reference forward of the
merged weights W + scale * alpha / r * B A for every weight an adapter can adapt, several adapters at once, on
float and quantized bases; scale 0 and no adapter are the base model's bits; a prompt's chunking stays neutral; bad
adapters are refused with the reason."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, logits_all, logits_in_calls, rel_rms
from model_files import LORA_ALL_LINEAR, merge_lora, write_arch_model, write_lora, write_sparse_model
from reference_model import ReferenceModel, dequantize, read_gguf

import powerinfer as pi
from powerinfer.lora import LoraAdapter
from powerinfer.request import RequestError

PROMPT = [1, 17, 93, 5, 200, 41, 7, 66, 130, 12, 3, 250]


def reference(base, adapters, **overrides) -> np.ndarray:
    """The float64 forward of base with [(pairs, scale, alpha)] merged in."""
    meta, tensors = read_gguf(base)
    w = {n: dequantize(raw, tt, ne) for n, (tt, ne, raw) in tensors.items()}
    w.setdefault("output.weight", w["token_embd.weight"])   # tied: token_embd's adapter is for the input only
    for pairs, scale, alpha in adapters:
        w = merge_lora(w, pairs, scale, alpha)
    return ReferenceModel.from_weights(meta, w, **overrides).forward(PROMPT)


def ours(model, adapters, **kw) -> np.ndarray:
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", **kw)
    ctx.set_lora(adapters)
    return logits_all(ctx, PROMPT)


@pytest.mark.parametrize("targets", [("attn_q", "attn_v"), LORA_ALL_LINEAR + ("output", "token_embd")])
def test_lora_matches_merged_reference(tiny_model, tmp_path, targets):
    base = tiny_model("f32", seed=2)
    pairs = write_lora(tmp_path / "a.gguf", base, targets=targets, rank=8, alpha=16.0, seed=1)
    model = pi.Model(base)
    ad = LoraAdapter(tmp_path / "a.gguf", model)
    assert ad.n_weights == len(pairs) and ad.alpha == 16.0
    want = reference(base, [(pairs, 0.7, 16.0)])
    got = ours(model, [(ad, 0.7)])
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)
    base_logits = ours(model, [])
    assert rel_rms(base_logits, want) > 100 * FLOAT_REL_RMS   # the adapter changes the model


def test_two_adapters_f16_on_quantized_base(tiny_model, tmp_path):
    """Two adapters at once (their terms add), an f16 one of odd rank with alpha 0 (the scale alone), on a Q8_0 base."""
    base = tiny_model("q8_0", seed=3)
    p1 = write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR, rank=3, alpha=0.0, dtype="f16", seed=4)
    p2 = write_lora(tmp_path / "b.gguf", base, targets=("attn_k", "attn_output", "output"), rank=16, alpha=8.0, seed=5)
    model = pi.Model(base)
    a, b = LoraAdapter(tmp_path / "a.gguf", model), LoraAdapter(tmp_path / "b.gguf", model)
    want = reference(base, [(p1, 0.5, 0.0), (p2, -1.5, 8.0)])
    got = ours(model, [(a, 0.5), (b, -1.5)])
    assert rel_rms(got, want) < QUANT_REL_RMS, rel_rms(got, want)
    only_b = reference(base, [(p2, -1.5, 8.0)])
    assert rel_rms(got, only_b) > 3 * rel_rms(got, want)


def test_lora_keeps_the_numeric_contract(tiny_model, tmp_path):
    """Scale 0 and no adapter: the base model's bits; with an adapter, a prompt's rows are the same bits in one call
    or in chunks (the terms are per-row ops too); the context's list is what the decode applies."""
    base = tiny_model("q8_0", seed=3)
    write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR + ("output", "token_embd"), rank=4, seed=6)
    model = pi.Model(base)
    ad = LoraAdapter(tmp_path / "a.gguf", model)
    plain = ours(model, [])
    assert np.array_equal(ours(model, [(ad, 0.0)]), plain)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.set_lora([(ad, 1.0)])
    one = logits_all(ctx, PROMPT, clear=True)
    assert not np.array_equal(one, plain)
    assert np.array_equal(logits_in_calls(ctx, PROMPT, 5, clear=True), one)
    assert np.array_equal(logits_in_calls(ctx, PROMPT, 1, clear=True), one)
    ctx.set_lora([])
    assert np.array_equal(logits_all(ctx, PROMPT, clear=True), plain)
    # rank 64: a 40-token call's terms run on the pool, one token's on the calling thread alone (lora.c's
    # INLINE_MACS): the same bits
    write_lora(tmp_path / "big.gguf", base, targets=LORA_ALL_LINEAR, rank=64, seed=7)
    ctx.set_lora([(LoraAdapter(tmp_path / "big.gguf", model), 1.0)])
    long = (PROMPT * 4)[:40]
    assert (64 + 160) * 64 * len(long) > 1 << 18 > (64 + 160) * 64
    assert np.array_equal(logits_in_calls(ctx, long, 1, clear=True), logits_all(ctx, long, clear=True))


def test_lora_on_gemma3(tmp_path):
    """gemma3: the token embedding's term is added before the embedding scale (llama.cpp's order), tied output."""
    base = tmp_path / "g.gguf"
    write_arch_model(base, "gemma3", seed=1)
    pairs = write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR + ("token_embd",), rank=4, seed=2)
    model = pi.Model(base)
    got = ours(model, [(LoraAdapter(tmp_path / "a.gguf", model), 1.0)])
    want = reference(base, [(pairs, 1.0, 16.0)])
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)


def test_attention_lora_on_a_sparse_file(tmp_path):
    """A PowerInfer (PWRI) file: its attention takes adapters (the predictor-guided FFN runs as before); FFN
    adapters are refused with the reason."""
    base = write_sparse_model(tmp_path / "s.powerinfer.gguf", ranks=(32, 64))
    pairs = write_lora(tmp_path / "a.gguf", base, targets=("attn_q", "attn_k", "attn_v", "attn_output"), seed=3)
    model = pi.Model(base)
    ad = LoraAdapter(tmp_path / "a.gguf", model)
    got = ours(model, [(ad, 1.0)], dense=True)   # every neuron: the reference without its predictor
    want = reference(base, [(pairs, 1.0, 16.0)], use_predictor=False)
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)
    assert rel_rms(ours(model, [], dense=True), want) > 100 * FLOAT_REL_RMS
    sparse = ours(model, [(ad, 1.0)])            # the predictor's selection, the adapted attention
    assert np.isfinite(sparse).all() and not np.array_equal(sparse, ours(model, []))
    write_lora(tmp_path / "f.gguf", base, targets=("ffn_up",), seed=3)
    with pytest.raises(pi.ModelLoadError, match="FFN are not supported on a PowerInfer"):
        LoraAdapter(tmp_path / "f.gguf", model)


def test_bad_adapters(tiny_model, tmp_path):
    base = tiny_model("f32", seed=2)
    model = pi.Model(base)
    with pytest.raises(pi.ModelLoadError, match="not a LoRA adapter"):
        LoraAdapter(base, model)
    write_lora(tmp_path / "arch.gguf", base, arch="qwen2")
    with pytest.raises(pi.ModelLoadError, match="'qwen2' models, the model is 'llama'"):
        LoraAdapter(tmp_path / "arch.gguf", model)
    write_lora(tmp_path / "half.gguf", base, drop=("blk.1.attn_v.weight.lora_b",))
    with pytest.raises(pi.ModelLoadError, match="blk.1.attn_v.weight' is missing its lora_b"):
        LoraAdapter(tmp_path / "half.gguf", model)
    write_lora(tmp_path / "name.gguf", base, extra=("blk.7.attn_q.weight.lora_a",))
    with pytest.raises(pi.ModelLoadError, match="which this model does not have"):
        LoraAdapter(tmp_path / "name.gguf", model)
    write_lora(tmp_path / "odd.gguf", base, extra=("blk.0.attn_q.weight.scale",))
    with pytest.raises(pi.ModelLoadError, match="neither a .lora_a nor a .lora_b"):
        LoraAdapter(tmp_path / "odd.gguf", model)
    other = tiny_model("f32", seed=2, n_embd=128)
    write_lora(tmp_path / "shape.gguf", other)
    with pytest.raises(pi.ModelLoadError, match="has shapes a .* for a weight of"):
        LoraAdapter(tmp_path / "shape.gguf", model)
    ctx = pi.Context(model, n_ctx=32)
    write_lora(tmp_path / "good.gguf", base)
    good = LoraAdapter(tmp_path / "good.gguf", model)
    with pytest.raises(ValueError, match="finite"):
        ctx.set_lora([(good, float("nan"))])
    with pytest.raises(ValueError, match="another model"):
        ctx.set_lora([(LoraAdapter(tmp_path / "good.gguf", pi.Model(base)), 1.0)])


# ---------------------------------------------------------------------------------------------- front doors
def greedy(llm, prompt="the cat sat", n=16, **kw) -> str:
    return llm.create_completion(prompt, max_tokens=n, temperature=0, seed=1, **kw)["choices"][0]["text"]


def test_api_and_per_request_adapters(tiny_model, tmp_path):
    """PowerInfer(lora_path=, lora_scale=) (llama-cpp-python's keywords) and a request's own scales (llama.cpp's
    `lora` field): the same text as a PowerInfer loaded with those scales; two requests with different adapters in
    flight together give each its own (a decode step holds one set; the slots' caches are kept apart)."""
    import threading
    base = tiny_model("q8_0", seed=7)
    write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR + ("output",), rank=8, seed=8)
    plain = pi.PowerInfer(base, n_ctx=256, n_threads=1, verbose=False)
    half = pi.PowerInfer(base, n_ctx=256, n_threads=1, verbose=False, lora_path=str(tmp_path / "a.gguf"),
                         lora_scale=0.5)
    want_plain, want_half = greedy(plain), greedy(half)
    assert want_plain != want_half
    llm = pi.PowerInfer(base, n_ctx=512, n_parallel=2, n_threads=1, verbose=False, lora=[(tmp_path / "a.gguf", 1.0)])
    assert greedy(llm, lora=[{"id": 0, "scale": 0.5}]) == want_half
    assert greedy(llm, lora=[(0, 0.0)]) == want_plain
    full = greedy(llm)
    assert full not in (want_plain, want_half)
    llm.set_lora_scales([{"id": 0, "scale": 0.5}])            # POST /lora-adapters
    assert greedy(llm) == want_half
    assert np.array_equal(llm.eval_logits([1, 5, 9]), half.eval_logits([1, 5, 9]))
    assert np.allclose(llm.embed("the cat"), half.embed("the cat"), atol=1e-6)
    assert not np.allclose(llm.embed("the cat"), plain.embed("the cat"), atol=1e-3)
    llm.set_lora_scales([])                                    # every adapter at 0
    assert greedy(llm) == want_plain
    for _ in range(3):                                         # concurrent, different adapters, the same prompt
        out = {}
        jobs = [threading.Thread(target=lambda k=k, s=s: out.__setitem__(k, greedy(llm, n=24, lora=[(0, s)])))
                for k, s in (("half", 0.5), ("plain", 0.0))]
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
        assert out["half"] == greedy(half, n=24) and out["plain"] == greedy(plain, n=24)
    with pytest.raises(RequestError, match="lora id 3 is not a loaded adapter"):
        llm.create_completion("x", max_tokens=1, lora=[{"id": 3, "scale": 1.0}])
    with pytest.raises(RequestError, match="finite"):
        llm.create_completion("x", max_tokens=1, lora=[{"id": 0, "scale": "big"}])


def test_server_lora_adapters(tiny_model, tmp_path):
    """GET / POST /lora-adapters and a request's `lora`, as llama.cpp's server answers them."""
    pytest.importorskip("uvicorn")
    from test_server import InProcessServer, get, post, wait_healthy

    from powerinfer.server.app import ServerState, create_app
    base = tiny_model("q8_0", seed=7)
    write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR, rank=8, seed=8)
    ref = pi.PowerInfer(base, n_ctx=256, n_threads=1, verbose=False, lora_path=str(tmp_path / "a.gguf"),
                        lora_scale=0.25)
    plain = pi.PowerInfer(base, n_ctx=256, n_threads=1, verbose=False)
    llm = pi.PowerInfer(base, n_ctx=512, n_parallel=2, n_threads=1, verbose=False, lora=[(tmp_path / "a.gguf", 0.0)])
    srv = InProcessServer(create_app(ServerState(model_path=str(base), llm=llm)))
    try:
        wait_healthy(srv.base)
        listed = get(srv.base, "/lora-adapters").json()
        assert listed == [{"id": 0, "path": str(tmp_path / "a.gguf"), "scale": 0.0, "task_name": "",
                           "prompt_prefix": ""}]
        body = {"prompt": "the cat sat", "n_predict": 16, "temperature": 0, "seed": 1}
        r = post(srv.base, "/completion", {**body, "lora": [{"id": 0, "scale": 0.25}]}).json()
        assert r["content"] == greedy(ref) and r["generation_settings"]["lora"] == [{"id": 0, "scale": 0.25}]
        assert post(srv.base, "/completion", body).json()["content"] == greedy(plain)
        assert post(srv.base, "/lora-adapters", [{"id": 0, "scale": 0.25}]).json() == {"success": True}
        assert get(srv.base, "/lora-adapters").json()[0]["scale"] == 0.25
        assert post(srv.base, "/completion", body).json()["content"] == greedy(ref)
        chat = post(srv.base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 4, "lora": [{"id": 0, "scale": 1.0}]})
        assert chat.status_code == 200
        for bad, what in (([{"id": 5, "scale": 1}], "not a loaded adapter"), ({"id": 0}, "must be an array"),
                          ([{"id": "0", "scale": 1}], "lora entries")):
            r = post(srv.base, "/completion", {**body, "lora": bad})
            assert r.status_code == 400 and what in r.json()["error"]["message"], r.text
        r = post(srv.base, "/lora-adapters", {"id": 0, "scale": 1})
        assert r.status_code == 400 and "must be a JSON array" in r.json()["error"]["message"]
    finally:
        srv.close()


def test_main_lora_flags(tiny_model, tmp_path):
    """main.py --lora / --lora-scaled: the adapter's text; scale 0 the base's; a bad adapter exits 1 saying why."""
    from helpers import main_greedy
    base = tiny_model("q8_0", seed=7)
    write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR, rank=8, seed=8)

    def run(*extra):
        return main_greedy(base, *extra)
    plain, adapted = run(), run("--lora", str(tmp_path / "a.gguf"))
    assert plain.returncode == 0 and adapted.returncode == 0, adapted.stderr
    assert plain.stdout != adapted.stdout and "LoRA adapter" in adapted.stderr
    assert run("--lora-scaled", str(tmp_path / "a.gguf"), "0").stdout == plain.stdout
    ref = pi.PowerInfer(base, n_ctx=64, n_threads=1, verbose=False, lora_path=str(tmp_path / "a.gguf"))
    assert adapted.stdout.endswith(ref.create_completion("the cat", max_tokens=12, temperature=0,
                                                         ignore_eos=True)["choices"][0]["text"])
    bad = run("--lora", str(base))
    assert bad.returncode == 1 and "not a LoRA adapter" in bad.stderr
    (tmp_path / "old.bin").write_bytes(b"algg" + bytes(60))
    bad = run("--lora", str(tmp_path / "old.bin"))
    assert bad.returncode == 1 and "ggml-era LoRA file" in bad.stderr
    assert "--lora-base" in run("--lora-base", str(base)).stderr
