"""Control vectors (llama.cpp's --control-vector files, powerinfer.control_vector): the logits equal the float64
reference forward with the vectors added to the residual stream after their layers; files add up times their
strengths; the layer range selects layers; clearing gives the base model's bits; what llama.cpp refuses is refused."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import FLOAT_REL_RMS, TINY_SHAPE, logits_all, main_greedy, rel_rms
from model_files import write_control_vector
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer.control_vector import load_control_vectors

PROMPT = [1, 17, 93, 5, 200, 41, 7, 66, 130, 12, 3, 250]
N_LAYER, E = 4, TINY_SHAPE["n_embd"]


@pytest.fixture(scope="module")
def base(tiny_model):
    return tiny_model("f32", seed=4, n_layer=N_LAYER)


def ours(model, data=None, start=1, end=None):
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    if data is not None:
        ctx.set_control_vector(data, start, end)
    return logits_all(ctx, PROMPT)


def test_control_vectors_match_the_reference(base, tmp_path):
    d1 = write_control_vector(tmp_path / "a.gguf", E, [1, 2, 3], seed=1)
    d2 = write_control_vector(tmp_path / "b.gguf", E, [2, 3], seed=2)
    model = pi.Model(base)
    data = load_control_vectors(model, [(tmp_path / "a.gguf", 0.8), (tmp_path / "b.gguf", -1.5)])
    want_rows = np.zeros((N_LAYER, E))
    for il, d in d1.items():
        want_rows[il] += 0.8 * d
    for il, d in d2.items():
        want_rows[il] += -1.5 * d
    assert np.allclose(data, want_rows, atol=1e-6)
    ref = ReferenceModel(base)
    plain = ref.forward(PROMPT)
    ref.control_vector = want_rows
    want = ref.forward(PROMPT)
    got = ours(model, data)
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)
    assert rel_rms(plain, want) > 100 * FLOAT_REL_RMS
    ranged = want_rows.copy()
    ranged[3] = 0                                             # --control-vector-layer-range 1 2
    ref.control_vector = ranged
    assert rel_rms(ours(model, data, 1, 2), ref.forward(PROMPT)) < FLOAT_REL_RMS
    ranged[1] = 0
    ref.control_vector = ranged
    assert rel_rms(ours(model, data, 2, 2), ref.forward(PROMPT)) < FLOAT_REL_RMS
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.set_control_vector(data)
    ctx.set_control_vector(None)
    assert np.array_equal(logits_all(ctx, PROMPT), ours(model))


def test_bad_control_vectors(base, tmp_path):
    model = pi.Model(base)
    for name, extra, words in (
            ("zero", {"direction.0": np.zeros(E, np.float32)}, "N >= 1"),
            ("other", {"blk.0.x": np.zeros(E, np.float32)}, "not a direction.N"),
            ("f16", {"direction.2": np.zeros(E, np.float16)}, "1-d f32"),
            ("2d", {"direction.2": np.zeros((2, E), np.float32)}, "1-d f32"),
            ("width", {"direction.2": np.zeros(E + 1, np.float32)}, "n_embd is 64")):
        write_control_vector(tmp_path / f"{name}.gguf", E, [1], extra=extra)
        with pytest.raises(pi.ModelLoadError, match=words):
            load_control_vectors(model, [(tmp_path / f"{name}.gguf", 1.0)])
    with pytest.raises(pi.ModelLoadError, match="control vector: .*no such model file"):
        load_control_vectors(model, [(tmp_path / "missing.gguf", 1.0)])
    ctx = pi.Context(model, n_ctx=32)
    with pytest.raises(ValueError, match="n_layer, n_embd"):
        ctx.set_control_vector(np.zeros((N_LAYER, E + 1), np.float32))
    with pytest.raises(ValueError, match="empty or negative"):
        ctx.set_control_vector(np.zeros((N_LAYER, E), np.float32), 3, 2)
    bad = np.zeros((N_LAYER, E), np.float32)
    bad[1, 5] = np.nan
    with pytest.raises(pi.PowerInferError, match="not finite"):
        ctx.set_control_vector(bad)


def test_main_control_vector_flags(base, tmp_path):
    write_control_vector(tmp_path / "a.gguf", E, [1, 2, 3], seed=1, scale=2.0)

    def run(*extra):
        return main_greedy(base, *extra)
    plain, steered = run(), run("--control-vector", str(tmp_path / "a.gguf"))
    assert steered.returncode == 0 and "control vector" in steered.stderr, steered.stderr
    assert steered.stdout != plain.stdout
    assert run("--control-vector-scaled", str(tmp_path / "a.gguf"), "0").stdout == plain.stdout
    assert run("--control-vector", str(tmp_path / "a.gguf"), "--control-vector-layer-range", "9", "12").stdout == \
        plain.stdout                                  # no layer of the tiny model is in range
    llm = pi.PowerInfer(base, n_ctx=64, n_threads=1, verbose=False, control_vectors=[(tmp_path / "a.gguf", 1.0)])
    text = llm.create_completion("the cat", max_tokens=12, temperature=0, ignore_eos=True)["choices"][0]["text"]
    assert steered.stdout.endswith(text)
    bad = run("--control-vector", str(base))
    assert bad.returncode == 1 and "not a direction.N tensor" in bad.stderr
