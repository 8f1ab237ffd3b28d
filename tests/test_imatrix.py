"""The importance matrix (powerinfer.imatrix, core/src/imatrix.c): llama-imatrix's collection and files.

The reference: tests/reference_model.py's float64 forward pass over the same windows (BOS first, every row's
logits), its weight matrices wrapped so that each matmul records its input rows: per matrix the sum of x^2 per column
over the batches of 16 rows or more (llama-imatrix's rule for MUL_MAT), per expert over the rows routed to it
(MUL_MAT_ID, every batch size), and the counts. The engine's sums are float32 over float32 activations: TOL_SUMS.

llama-cpp-python has no imatrix tool, so collection is compared with the reference only; the files are compared with
llama.cpp's format by reading them back with gguf-py (GGUF) and by layout (.dat), and quantizing with them is compared
byte for byte with llama.cpp in test_quantize_imatrix.py.

Run: PYTHONPATH=bindings python -m pytest tests/test_imatrix.py -q
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from model_files import write_arch_model, write_lfm2_model, write_qwen35_model
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer._ffi import PowerInferError, lib
from powerinfer.imatrix import Imatrix, ImatrixEntry, collect, main, quant_weights, read_imatrix, write_imatrix

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))
from make_test_model import write_model  # noqa: E402
from test_moe import write_moe  # noqa: E402

TOL_SUMS = 2e-5    # relative, per entry (max |ours - ref| / max |ref|): f32 activations and sums against float64
#                    (an f32 KV cache: with f16's the attention outputs are ~1e-3 off)
N_CTX = 32


class Recorder(np.ndarray):
    """A weight that records the inputs of its matmuls into `log` (name -> [sums per expert, counts])."""

    def __array_finalize__(self, obj):
        self.wname = getattr(obj, "wname", None)
        self.log = getattr(obj, "log", None)
        self.expert = getattr(obj, "expert", None)

    def __getitem__(self, i):
        out = super().__getitem__(i)
        if isinstance(out, Recorder) and self.ndim == 3 and isinstance(i, (int, np.integer)):
            out.expert = int(i)
        return out

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(i) if isinstance(i, Recorder) else i for i in inputs]
        if ufunc is np.matmul and method == "__call__" and len(inputs) == 2:
            if isinstance(inputs[1], Recorder) and inputs[1].expert is None:    # x @ W.T: rows x
                x = np.atleast_2d(plain[0])
                if x.shape[0] >= 16:
                    self._add(inputs[1], 0, x)
            elif isinstance(inputs[0], Recorder) and inputs[0].expert is not None:   # W[e] @ x: one routed row
                self._add(inputs[0], inputs[0].expert, np.atleast_2d(plain[1]))
        return getattr(ufunc, method)(*plain, **kwargs)

    @staticmethod
    def _add(w, e, x):
        sums, counts = w.log.setdefault(w.wname, [{}, {}])
        sums[e] = sums.get(e, 0.0) + (x.astype(np.float64) ** 2).sum(axis=0)
        counts[e] = counts.get(e, 0) + x.shape[0]


def reference_imatrix(path, tokens, n_ctx, *, output=False, bos=None):
    """{name: (sums [n_mat, n_cols], counts [n_mat])} of the reference model over llama-imatrix's windows."""
    ref = ReferenceModel(path)
    log: dict = {}
    names = set(pi.Model(path).file.tensors)
    for li, L in enumerate(ref.layers):
        for k, v in list(L.items()):
            name = f"blk.{li}.{k}.weight"
            if isinstance(v, np.ndarray) and v.ndim in (2, 3) and name in names:
                r = np.asarray(v, dtype=np.float64).view(Recorder)
                r.wname, r.log, r.expert = name, log, None
                L[k] = r
    if output and "output.weight" in names:
        r = np.asarray(ref.output, dtype=np.float64).view(Recorder)
        r.wname, r.log, r.expert = "output.weight", log, None
        ref.output = r
    for i in range(len(tokens) // n_ctx):
        w = np.array(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos is not None:
            w[0] = bos
        ref.forward(w)
    out = {}
    for name, (sums, counts) in log.items():
        n_mat = max(sums) + 1
        n_cols = len(next(iter(sums.values())))
        s = np.zeros((n_mat, n_cols))
        c = np.zeros(n_mat, dtype=np.int64)
        for e in sums:
            s[e], c[e] = sums[e], counts[e]
        out[name] = (s, c)
    return out


def assert_matches_reference(im: Imatrix, ref: dict, n_expert: int = 1):
    assert set(im.entries) == set(ref), f"entries differ: {set(im.entries) ^ set(ref)}"
    for name, (s, c) in ref.items():
        e = im.entries[name]
        if e.sums.shape[0] > 1:   # an expert tensor: every expert's row (those never routed: zero)
            s = np.vstack([s, np.zeros((e.sums.shape[0] - s.shape[0], s.shape[1]))])
            c = np.concatenate([c, np.zeros(e.sums.shape[0] - len(c), dtype=np.int64)])
        assert e.sums.shape == s.shape, name
        np.testing.assert_array_equal(e.counts, c, err_msg=name)
        err = np.abs(e.sums - s).max() / np.abs(s).max()
        assert err < TOL_SUMS, f"{name}: relative error {err:.2e}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("imatrix")
    f = {"llama": d / "llama.gguf", "gemma3": d / "gemma3.gguf"}
    write_model(f["llama"], dtype="f32", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2)
    write_arch_model(f["gemma3"], "gemma3", seed=0)
    f["mixtral"] = write_moe(d, "llama")
    (d / "q2").mkdir()
    f["qwen2moe"] = write_moe(d / "q2", "qwen2moe", n_ff_exp=64)
    f["qwen35"] = d / "qwen35.gguf"              # gated delta net layers' matrices (gdn.c) too
    write_qwen35_model(f["qwen35"])
    f["lfm2"] = d / "lfm2.gguf"                  # LFM2's short conv in_proj / out_proj (shortconv.c)
    write_lfm2_model(f["lfm2"])
    return f


def _tokens(n, seed=0):
    return np.random.default_rng(seed).integers(3, 300, size=n).tolist()


@pytest.mark.parametrize("model", ["llama", "gemma3", "mixtral", "qwen2moe", "qwen35", "lfm2"])
def test_sums_match_the_reference(files, model):
    toks = _tokens(3 * N_CTX + 5)
    m = pi.Model(files[model])
    im = collect(m, toks, n_ctx=N_CTX, process_output=True, kv_type="f32", log=lambda s: None)
    bos = m.tokenizer.bos_id if m.tokenizer.add_bos else None
    assert im.chunk_size == N_CTX and im.chunk_count == 3
    assert_matches_reference(im, reference_imatrix(files[model], toks, N_CTX, output=True, bos=bos))


def test_output_only_when_asked_and_chunks(files):
    toks = _tokens(4 * N_CTX)
    m = pi.Model(files["llama"])
    im = collect(m, toks, n_ctx=N_CTX, chunks=2, log=lambda s: None)
    assert "output.weight" not in im.entries
    assert all(int(e.counts[0]) == 2 * N_CTX for e in im.entries.values())
    assert im.chunk_count == 2


def test_tied_output_is_not_collected(files):
    """gemma3 ties its output to token_embd: llama-imatrix sees token_embd.weight there and skips it."""
    im = collect(pi.Model(files["gemma3"]), _tokens(2 * N_CTX), n_ctx=N_CTX, process_output=True,
                 log=lambda s: None)
    assert not any(n.startswith(("output", "token_embd")) for n in im.entries)


def test_observer_off_leaves_logits_alone(files):
    """Collecting changes no logit (it only reads the matmul inputs)."""
    m = pi.Model(files["llama"])
    toks = _tokens(N_CTX)
    ctx = pi.Context(m, n_ctx=N_CTX, n_batch=N_CTX)
    ctx.decode(toks, logits="all")
    a = np.stack([ctx.logits(i) for i in range(N_CTX)])
    lib.pi_imatrix_begin(ctx._ptr, 0)
    ctx.kv_clear()
    ctx.decode(toks, logits="all")
    b = np.stack([ctx.logits(i) for i in range(N_CTX)])
    assert lib.pi_imatrix_n_entries(ctx._ptr) == 14
    lib.pi_imatrix_end(ctx._ptr)
    assert lib.pi_imatrix_n_entries(ctx._ptr) == 0
    np.testing.assert_array_equal(a, b)


def test_gguf_file_is_llama_cpps_format(files, tmp_path):
    """The keys and tensors llama-imatrix writes (gguf-py reads them back), and the round trip."""
    from gguf import GGUFReader
    m = pi.Model(files["mixtral"])
    im = collect(m, _tokens(2 * N_CTX), n_ctx=N_CTX, dataset="data.txt", log=lambda s: None)
    p = tmp_path / "im.gguf"
    write_imatrix(p, im)
    r = GGUFReader(p)
    kv = {f.name: f for f in r.fields.values() if not f.name.startswith("GGUF.")}
    assert list(kv) == ["general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"]
    names = [t.name for t in r.tensors]
    expect = [f"{n}.{s}" for n in sorted(im.entries) for s in ("in_sum2", "counts")]
    assert names == expect
    exps = next(t for t in r.tensors if t.name == "blk.0.ffn_up_exps.weight.in_sum2")
    assert list(exps.shape) == [im.entries["blk.0.ffn_up_exps.weight"].sums.shape[1], 4]
    back = read_imatrix(p)
    assert back.datasets == ["data.txt"] and back.chunk_count == 2 and back.chunk_size == N_CTX
    for n, e in im.entries.items():
        np.testing.assert_array_equal(back.entries[n].sums, e.sums)
        np.testing.assert_array_equal(back.entries[n].counts, e.counts)


def test_legacy_dat_round_trip(tmp_path):
    """--output-format dat: mean x^2 * ncall per entry (entries without data skipped, a partial expert's rows
    stored as 1), read back and normalised as llama-quantize does."""
    im = Imatrix(entries={"b.weight": ImatrixEntry(np.array([[2.0, 4.0]], np.float32), np.array([4])),
                          "a.weight": ImatrixEntry(np.array([[8.0], [3.0]], np.float32), np.array([8, 0])),
                          "none.weight": ImatrixEntry(np.zeros((1, 2), np.float32), np.array([0]))},
                 datasets=["t.txt"], chunk_size=4, chunk_count=2)
    p = tmp_path / "im.dat"
    write_imatrix(p, im, "dat")
    raw = p.read_bytes()
    assert struct.unpack_from("<i", raw)[0] == 2
    assert raw[4:8] == struct.pack("<i", 8) and raw[8:16] == b"a.weight"
    back = read_imatrix(p)
    assert back.is_legacy and list(back.entries) == ["a.weight", "b.weight"] and back.datasets == ["t.txt"]
    np.testing.assert_allclose(back.entries["a.weight"].sums.ravel(), [1.0 * 2, 1.0 * 2])   # ncall 2
    qw = quant_weights(back)
    np.testing.assert_allclose(qw["b.weight"], [0.5, 1.0])
    np.testing.assert_allclose(qw["a.weight"], [1.0, 1.0])


def test_quant_weights_as_llama_quantize(tmp_path):
    im = Imatrix(entries={"blk.0.ffn_up_exps.weight": ImatrixEntry(np.array([[2.0, 4.0], [1.0, 1.0]], np.float32),
                                                                   np.array([2, 0])),
                          "blk.0.attn_q.weight": ImatrixEntry(np.array([[3.0, 6.0]], np.float32), np.array([3]))},
                 chunk_size=2)
    qw = quant_weights(im)
    np.testing.assert_allclose(qw["blk.0.ffn_up_exps.weight"], [1.0, 2.0, 1.0, 1.0])
    np.testing.assert_allclose(qw["blk.0.attn_q.weight"], [1.0, 2.0])
    assert list(quant_weights(im, exclude=["attn"])) == ["blk.0.ffn_up_exps.weight"]
    assert list(quant_weights(im, include=["attn_q"])) == ["blk.0.attn_q.weight"]
    im.has_metadata = False
    with pytest.raises(ValueError, match="metadata"):
        quant_weights(im)


def test_combine_in_files(files, tmp_path):
    """--in-file: two halves' files add up to the whole's."""
    toks = _tokens(4 * N_CTX)
    m = pi.Model(files["llama"])
    whole = collect(m, toks, n_ctx=N_CTX, log=lambda s: None)
    a = collect(m, toks[:2 * N_CTX], n_ctx=N_CTX, log=lambda s: None)
    b = collect(m, toks[2 * N_CTX:], n_ctx=N_CTX, log=lambda s: None)
    write_imatrix(tmp_path / "a.gguf", a)
    write_imatrix(tmp_path / "b.gguf", b)
    assert main(["--in-file", str(tmp_path / "a.gguf"), "--in-file", str(tmp_path / "b.gguf"), "-c", str(N_CTX),
                 "-o", str(tmp_path / "ab.gguf")]) == 0
    ab = read_imatrix(tmp_path / "ab.gguf")
    assert ab.chunk_count == 4
    for n, e in whole.entries.items():
        np.testing.assert_array_equal(ab.entries[n].counts, e.counts)
        np.testing.assert_allclose(ab.entries[n].sums, e.sums, rtol=1e-5)


def test_command_line(files, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "im.gguf"
    assert main(["-m", str(files["llama"]), "-f", str(text), "-o", str(out), "-c", "32", "--chunks", "2",
                 "--save-frequency", "1", "--output-frequency", "1"]) == 0
    assert out.is_file() and (tmp_path / "im.gguf.at_1").is_file() and (tmp_path / "im.gguf.at_2").is_file()
    im = read_imatrix(out)
    assert im.chunk_count == 2 and im.datasets == [str(text)]
    assert read_imatrix(tmp_path / "im.gguf.at_1").chunk_count == 1
    assert main(["--in-file", str(out), "--show-statistics"]) == 0
    assert "ffn_down" in capsys.readouterr().err
    assert main(["-m", str(files["llama"]), "-f", str(text), "-ngl", "99"]) == 1
    assert main(["-m", str(files["llama"]), "-f", str(text), "-c", "4096"]) == 1     # too few tokens
    assert main([]) == 1
    bad = tmp_path / "bad.dat"
    bad.write_bytes(b"\x00\x00")
    assert main(["--in-file", str(bad), "--show-statistics"]) == 1


def test_sparse_file_collects_attention_only(tmp_path):
    from model_files import write_sparse_model
    p = write_sparse_model(tmp_path / "s.powerinfer.gguf")
    im = collect(pi.Model(p), _tokens(2 * N_CTX), n_ctx=N_CTX, log=lambda s: None)
    assert im.entries and all("attn" in n for n in im.entries)


def test_bad_calls_are_refused(files):
    from powerinfer._ffi import check
    ctx = pi.Context(pi.Model(files["llama"]), n_ctx=N_CTX)
    with pytest.raises(PowerInferError, match="flags"):
        check(lib.pi_imatrix_begin(ctx._ptr, 8), "imatrix")
    with pytest.raises(PowerInferError, match="collects no importance matrix"):
        check(lib.pi_imatrix_entry(ctx._ptr, 0, pi._ffi.ffi.NULL, pi._ffi.ffi.NULL, pi._ffi.ffi.NULL,
                                   pi._ffi.ffi.NULL, pi._ffi.ffi.NULL), "imatrix")
