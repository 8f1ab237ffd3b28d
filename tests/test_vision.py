"""Image input through an mmproj file (powerinfer.vision, powerinfer.multimodal): Gemma 3's vision tower against its
float64 reference (tests/reference_vision.py) at every ISA level, and against llama.cpp's mtmd (the fixture
tests/fixtures/mtmd_gemma3.npz that tools/mtmd_fixtures.py writes with tools/mtmd_ref; live when /tmp/mtmd_ref/
mtmd-ref is built): the preprocessed image, the projected embeddings, the prompt's chunks, its last logits and the
greedy tokens after it (the image decoded bidirectionally, pi_batch.span).

Where our preprocessing differs from llama.cpp's: nowhere for PNG (the resize is Pillow's bilinear, which mtmd ports
to C; the letterboxed, resized and normalised arrays are bit-identical, every case here); for JPEG the decoders differ
(Pillow's libjpeg vs mtmd's stb_image: IDCT and chroma upsampling), by up to JPEG_PIX_TOL in the normalised values
(2/255 per u8 step with mean = std = 0.5), measured on jpeg_f16 below.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

import powerinfer as pi  # noqa: E402
from powerinfer.multimodal import (ImageStore, build_prompt, eval_prompt, placeholder_ids,  # noqa: E402
                                   split_placeholder)
from powerinfer.vision import VisionError, VisionProjector, fit_size, image_hash, load_image  # noqa: E402

from reference_vision import gemma3_tower, load  # noqa: E402
from vision_files import image_array, write_mmproj, write_vision_text_model  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "mtmd_gemma3.npz"
MTMD_REF = Path("/tmp/mtmd_ref/mtmd-ref")
PROMPT = "the cat <__media__> is a"

# ours vs the float64 reference, relative to max |reference|: f32 / f16 weights (f32 activations: seen 1.8e-7);
# q8_0 weights (activations quantized to q8_0 blocks for the matmuls, as ggml does: seen 5.6e-3)
TOL_FLOAT, TOL_Q8 = 1e-5, 1.5e-2
# the default tower rounds K and V to f16 for the attention (as llama.cpp's flash path), the reference too: an f32 K
# row next to a rounding boundary may round the other way than its float64 value (seen 8.6e-6, f16 weights)
TOL_KV16 = 5e-5
# ours vs llama.cpp's mtmd embeddings, relative to max |llama.cpp|: llama.cpp rounds activations to f16 in its f16
# matmuls (the input projection is always f16) and reads GELU from an f16 table (seen 3.5e-4 f16, 2.8e-4 f32);
# q8_0 both quantize activations, their blocks' roundings differ (seen below 1e-2)
TOL_MTMD, TOL_MTMD_Q8 = 1.5e-3, 2e-2
# the prompt's last logits after the image, ours vs llama.cpp's (absolute; logits here are within +-3)
TOL_LOGITS = 2e-2
JPEG_PIX_TOL = 8 * 2 / 255   # up to 8 u8 steps between the two JPEG decoders


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision")
    out = {"text": write_vision_text_model(d / "text.gguf")}
    for dt in ("f32", "f16", "q8_0"):
        write_mmproj(d / f"mmproj-{dt}.gguf", "tiny", dtype=dt)
        out[dt] = d / f"mmproj-{dt}.gguf"
    out["dir"] = d
    return out


@pytest.fixture(scope="module")
def fixture():
    return np.load(FIXTURE)


def case_image(name: str, d: Path) -> Path:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from mtmd_fixtures import CASES
    from PIL import Image
    _, (w, h, seed, fmt) = CASES[name]
    p = d / f"{name}.{fmt.lower()}"
    Image.fromarray(image_array(w, h, seed)).save(p, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return p


CASES = ["wide_f16", "square_f32", "tall_q8_0", "exact_f16", "jpeg_f16"]


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("kv_f16", [True, False])
def test_tower_matches_f64_reference(files, dtype, level, kv_f16):
    if not pi.cpu_isa_supported(level):
        pytest.skip(f"{level} does not run here ({pi.system_info()})")
    start = pi.cpu_isa()
    pi.set_cpu_isa(level)
    try:
        p = VisionProjector(files[dtype], n_threads=2, kv_f16=kv_f16)
        meta, w = load(files[dtype])
        for seed, (wd, ht) in enumerate([(50, 40), (32, 32), (17, 90)]):
            pix = p.preprocess(image_array(wd, ht, seed))
            got, ref = p.encode(pix), gemma3_tower(meta, w, pix, kv_f16=kv_f16)
            assert got.shape == (16, 128) and got.dtype == np.float32
            tol = (TOL_Q8 if dtype == "q8_0" else TOL_KV16 if kv_f16 else TOL_FLOAT) * np.abs(ref).max()
            assert np.abs(got - ref).max() <= tol, (dtype, level, np.abs(got - ref).max(), tol)
    finally:
        pi.set_cpu_isa(start)


def test_tower_reference_sees_every_part(files):
    """The comparison above can fail: a changed weight of the last block, or of the projection, moves the output."""
    p = VisionProjector(files["f32"], n_threads=2)
    meta, w = load(files["f32"])
    pix = p.preprocess(image_array(40, 40, 0))
    ref = gemma3_tower(meta, w, pix)
    for name in ("v.blk.1.ffn_down.bias", "mm.soft_emb_norm.weight", "v.position_embd.weight"):
        w2 = dict(w)
        w2[name] = w[name] * 1.01
        assert np.abs(gemma3_tower(meta, w2, pix) - ref).max() > TOL_FLOAT * np.abs(ref).max() * 10, name


@pytest.mark.parametrize("name", CASES)
def test_preprocess_matches_mtmd(files, fixture, name):
    p = VisionProjector(files["f16"], n_threads=2)
    got, ref = p.preprocess(case_image(name, files["dir"])), fixture[f"{name}.pix"]
    assert got.shape == ref.shape == (3, 32, 32)
    if name.startswith("jpeg"):
        diff = np.abs(got - ref).max()
        assert diff <= JPEG_PIX_TOL, diff   # the decoders differ (module doc)
    else:
        np.testing.assert_array_equal(got, ref)


def test_letterbox_sizes():
    """mtmd's aspect-preserving fit (PAD_CEIL) in float32: the side that fills, the other rounded up."""
    assert fit_size(50, 40, 32) == (32, 26)
    assert fit_size(20, 70, 32) == (10, 32)
    assert fit_size(64, 64, 32) == (32, 32)
    assert fit_size(7, 5, 896) == (896, 640)


@pytest.mark.parametrize("name", CASES)
def test_embeddings_prompt_and_greedy_match_mtmd(files, fixture, name):
    dtype = name.split("_", 1)[1]
    model = pi.Model(files["text"])
    p = VisionProjector(files[dtype], n_threads=2)
    p.check_text_model(model)
    img = case_image(name, files["dir"])
    # the embeddings from llama.cpp's own preprocessed image: the tower alone
    got, ref = p.encode(fixture[f"{name}.pix"]), fixture[f"{name}.embd"]
    tol = (TOL_MTMD_Q8 if dtype == "q8_0" else TOL_MTMD) * np.abs(ref).max()
    assert np.abs(got - ref).max() <= tol, (name, np.abs(got - ref).max(), tol)
    tokens, store = build_prompt(model.tokenizer, p, PROMPT, [img])
    n_img = 16
    before, after = fixture[f"{name}.before"].tolist(), fixture[f"{name}.after"].tolist()
    assert tokens[:len(before)] == before and tokens[len(before) + n_img:] == after
    assert all(t < 0 for t in tokens[len(before):len(before) + n_img])
    assert bool(fixture[f"{name}.non_causal"])   # mtmd decodes gemma3's images non-causally
    if name.startswith("jpeg"):
        return   # decoded differently (module doc): the tokens after it are not compared
    ctx = pi.Context(model, n_ctx=256, n_batch=64)
    n = eval_prompt(ctx, tokens, store)
    assert np.abs(ctx.logits() - fixture[f"{name}.logits"]).max() <= TOL_LOGITS
    out = []
    for _ in range(8):
        t = int(np.argmax(ctx.logits()))
        out.append(t)
        ctx.decode([t], pos=[n])
        n += 1
    assert out == fixture[f"{name}.generated"].tolist()


def test_image_rows_attend_bidirectionally(files, fixture):
    """pi_batch.span: the same rows decoded causally give other logits (and not llama.cpp's)."""
    model = pi.Model(files["text"])
    p = VisionProjector(files["f16"], n_threads=2)
    tokens, store = build_prompt(model.tokenizer, p, PROMPT, [case_image("wide_f16", files["dir"])])
    ctx = pi.Context(model, n_ctx=256, n_batch=64)
    eval_prompt(ctx, tokens, store)
    bidir = ctx.logits().copy()
    ctx.kv_clear()
    i0 = next(i for i, t in enumerate(tokens) if t < 0)
    ctx.decode(tokens[:i0])
    h, _ = split_placeholder(tokens[i0])
    ctx.decode_embd(store[h], span=0)
    ctx.decode(tokens[i0 + 16:])
    causal = ctx.logits()
    ref = fixture["wide_f16.logits"]
    assert np.abs(bidir - ref).max() <= TOL_LOGITS < np.abs(causal - ref).max()


def test_embeddings_enter_unscaled(files):
    """decode_embd feeds rows as given: a token's own row fed as an embedding differs from the token by gemma's
    sqrt(n_embd) scale, and equals the token once scaled by it."""
    model = pi.Model(files["text"])
    ctx = pi.Context(model, n_ctx=64, n_batch=64)
    ctx.decode([1, 300, 301])
    want = ctx.logits().copy()
    row = model.tensor_f32("token_embd.weight")[301]
    ctx.kv_clear()
    ctx.decode([1, 300], logits="none")
    ctx.decode_embd(row[None, :] * np.float32(np.sqrt(128.0)), logits="last")
    np.testing.assert_allclose(ctx.logits(), want, atol=1e-4)
    ctx.kv_seq_rm(0, 2, -1)
    ctx.decode_embd(row[None, :], logits="last")
    assert np.abs(ctx.logits() - want).max() > 1e-2


@pytest.mark.skipif(not MTMD_REF.exists(), reason="llama.cpp's mtmd test tool is not built: tools/mtmd_ref/build.sh")
def test_live_mtmd_two_images_prompt(files):
    """Live against the built tool: a fresh image (not in the fixture), f16."""
    from vision_files import write_png
    img = write_png(files["dir"] / "live.png", 77, 51, 11)
    out = subprocess.run([str(MTMD_REF), str(files["text"]), str(files["f16"]), str(img), "a <__media__> b", "6", "2",
                          str(files["dir"] / "live")], capture_output=True, text=True, check=True)
    js = json.loads(out.stdout.strip().splitlines()[-1])
    model = pi.Model(files["text"])
    p = VisionProjector(files["f16"], n_threads=2)
    tokens, store = build_prompt(model.tokenizer, p, "a <__media__> b", [img])
    ctx = pi.Context(model, n_ctx=256, n_batch=64)
    n = eval_prompt(ctx, tokens, store)
    out = []
    for _ in range(6):
        t = int(np.argmax(ctx.logits()))
        out.append(t)
        ctx.decode([t], pos=[n])
        n += 1
    assert out == js["generated"]


# ---------------------------------------------------------------- errors

def test_unsupported_projector_is_named(files, tmp_path):
    for proj, words in (("qwen2.5vl_merger", "a projector type llama.cpp knows"), ("wat", "an unknown projector type")):
        f = tmp_path / f"{proj}.gguf"
        write_mmproj(f, "tiny", meta={"clip.projector_type": proj})
        with pytest.raises(VisionError, match=rf"projector type '{proj}' is not supported \({words}.*gemma3"):
            VisionProjector(f)


def test_not_an_mmproj_file(files):
    with pytest.raises(VisionError, match="not a multimodal projector file"):
        VisionProjector(files["text"])


def test_missing_tensor_and_bad_keys(files, tmp_path):
    f = tmp_path / "drop.gguf"
    write_mmproj(f, "tiny", drop=("v.blk.1.attn_k.weight",))
    with pytest.raises(VisionError, match="missing tensor v.blk.1.attn_k.weight"):
        VisionProjector(f)
    f = tmp_path / "quick.gguf"
    write_mmproj(f, "tiny", meta={"clip.use_gelu": False})
    with pytest.raises(VisionError, match="not GELU"):
        VisionProjector(f)
    f = tmp_path / "audio.gguf"
    write_mmproj(f, "tiny", meta={"clip.has_vision_encoder": False, "clip.has_audio_encoder": True})
    with pytest.raises(VisionError, match="no vision encoder.*audio"):
        VisionProjector(f)


def test_projector_of_another_model(files, tmp_path):
    f = tmp_path / "wide.gguf"
    write_mmproj(f, "tiny", n_embd_text=256)
    model = pi.Model(files["text"])
    with pytest.raises(VisionError, match="embeddings of 256 but the text model's n_embd is 128"):
        VisionProjector(f).check_text_model(model)


def test_bad_images(files):
    from powerinfer.vision import ImageError
    with pytest.raises(ImageError, match="cannot decode the image"):
        load_image(b"not an image at all")
    with pytest.raises(ImageError, match="cannot read image file"):
        load_image(str(files["dir"] / "nope.png"))
    p = VisionProjector(files["f16"])
    with pytest.raises(ValueError, match="pixels of shape"):
        p.encode(np.zeros((3, 16, 16), np.float32))
    model = pi.Model(files["text"])
    with pytest.raises(ImageError, match="2 image markers"):
        build_prompt(model.tokenizer, p, "a <__media__> <__media__>", [image_array(8, 8)])


def test_missing_pillow_message(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_pil(name, *a, **k):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("no PIL")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_pil)
    from powerinfer.vision import ImageError
    with pytest.raises(ImageError, match=r"pip install 'powerinfer\[vision\]'"):
        load_image(b"\x89PNG")


def test_decode_embd_refusals(files):
    model = pi.Model(files["text"])
    ctx = pi.Context(model, n_ctx=64, n_batch=8)
    with pytest.raises(ValueError, match="expected"):
        ctx.decode_embd(np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="do not fit one batch"):
        ctx.decode_embd(np.zeros((9, 128), np.float32), span=1)
    bad = np.zeros((1, 128), np.float32)
    bad[0, 3] = np.nan
    with pytest.raises(pi.PowerInferError, match="non-finite"):
        ctx.decode_embd(bad)


# ---------------------------------------------------------------- placeholders and the image store

def test_placeholders_carry_hash_and_row():
    rgb = image_array(9, 7, 1)
    h = int(image_hash(rgb)[:12], 16)
    ids = placeholder_ids(h, 16)
    assert all(t < 0 for t in ids) and len(set(ids)) == 16
    assert [split_placeholder(t) for t in ids] == [(h, j) for j in range(16)]
    assert image_hash(rgb) != image_hash(image_array(9, 7, 2))
    s = ImageStore(cap=2)
    e = np.arange(32, dtype=np.float32).reshape(16, 2)
    s.put(h, e)
    np.testing.assert_array_equal(s.rows(ids[3], 2), e[3:5])
    s.put(1, e)
    s.put(2, e)
    with pytest.raises(KeyError, match="no longer held"):
        s.rows(ids[0], 1)


def test_image_decode_with_offloaded_layers(files):
    """-ngl on the emulated device (POWERINFER_EMULATED_GPU_MIB, tests/test_hybrid.py's): the image rows' embeddings and
    their span mask reach the device's attention; the logits after an image prompt equal the CPU's bit for bit."""
    import os
    import subprocess
    import sys
    code = f"""
import sys, numpy as np
sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[1] / 'bindings')]!r}
import powerinfer as pi
from powerinfer.vision import VisionProjector
from powerinfer.multimodal import build_prompt, eval_prompt
from vision_files import image_array
model = pi.Model({str(files['text'])!r})
p = VisionProjector({str(files['f16'])!r}, n_threads=2)
tokens, store = build_prompt(model.tokenizer, p, "the cat <__media__> is a", [image_array(50, 40, 1)])
out = []
for ngl in (0, 2, -1):
    ctx = pi.Context(model, n_ctx=128, n_batch=64, n_gpu_layers=ngl)
    assert ngl == 0 or ctx.offload is not None
    eval_prompt(ctx, tokens, store)
    out.append(ctx.logits().copy())
assert all(np.array_equal(out[0], o) for o in out[1:]), [float(np.abs(out[0] - o).max()) for o in out[1:]]
print("ok")
"""
    env = {**os.environ, "POWERINFER_EMULATED_GPU_MIB": "1024"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-3000:]
