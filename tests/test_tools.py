"""Tests of the offline tools tools/hf_llama_torch.py, tools/profile_activations.py and
tools/train_predictor.py (torch needed; never used by the inference path).

A tiny random HF llama checkpoint is built here: config.json (llama, relu, hidden 64, ff 256,
2 layers, 4 heads / 2 kv heads, rope_theta 5000 with linear rope_scaling 2), model.safetensors
and a sentencepiece BPE tokenizer trained on an inline corpus.

Planted structure (so predictability is a property of the model, not luck): the residual
stream carries a large common direction mu (every embedding row is mu + noise), and the gate
of layer 0 is rank-4 plus a negative multiple of mu's direction. ReLU(gate . rmsnorm(x)) > 0
iff gate . (ffn_norm * x) > 0, so layer 0's mask is the sign of a rank-5 linear function of
ffn_inp: a rank-16 predictor (>= 2*5) can represent it exactly, and the -mu term makes the
neurons sparse (active rate ~0.2-0.3, which is also the recall/precision of a chance predictor
of the same rate). Bound tested on held-out tokens: recall >= PLANTED_MIN_RECALL (0.85) and
precision >= max(0.5, 2 * active rate).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tqdm")
spm = pytest.importorskip("sentencepiece")

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
sys.path.insert(0, str(TOOLS))

import hf_llama_torch as hfl  # noqa: E402
import profile_activations as pa  # noqa: E402
import train_predictor as tp  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402

# max |logits_torch32 - logits_numpy64| / max |logits_numpy64|
LOGITS_REL_TOL = 1e-4
# fraction of (token, neuron) pairs whose mask may differ between float32 and float64 forwards
MASK_FLIP_TOL = 2e-3
PLANTED_MIN_RECALL = 0.85
PLANT_SHIFT = 0.25         # size of the gate's -mu component (sets layer 0's sparsity)

N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV = 64, 256, 2, 4, 2
CTX = 64
EPOCHS = 10          # tiny data: small batches and a high learning rate give enough steps
BATCH = 64
LR = 1e-2
RANK = 16

CORPUS = """\
The quick brown fox jumps over the lazy dog while the farmer watches from the old barn.
In the morning the village market opens early and people buy bread, cheese and apples.
Scientists measure the temperature of the ocean to understand how the climate changes.
A small boat crossed the river at dawn, carrying letters, tools and a sleeping cat.
Children read stories about dragons, castles and brave knights who travel far away.
The engineer checked every bridge and road before the winter storms arrived in town.
Music filled the hall as the orchestra played a quiet song for the evening guests.
Many languages share words for water, fire, mother and house across the centuries.
When the train stopped, the travellers stepped onto the platform and looked around.
Good software is tested carefully, documented clearly and kept simple where possible.
"""


def _random_text(n_sentences: int, seed: int) -> str:
    words = sorted(set(CORPUS.replace(",", " ").replace(".", " ").lower().split()))
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_sentences):
        n = int(rng.integers(5, 14))
        s = " ".join(words[int(i)] for i in rng.integers(0, len(words), n))
        out.append(s.capitalize() + ".")
    return "\n".join(" ".join(out[i:i + 4]) for i in range(0, len(out), 4)) + "\n"


# ------------------------------------------------------------------------------ checkpoint

def _weights(cfg: dict, seed: int = 0, planted: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    E, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = E // H

    def mat(o, i, gain=1.0):
        return (rng.standard_normal((o, i)) * gain / np.sqrt(i)).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    mu = rng.standard_normal(E)
    mu_hat = mu / np.linalg.norm(mu)
    w = {"model.embed_tokens.weight": (3.0 * mu_hat + 0.5 * rng.standard_normal((V, E)) / np.sqrt(E) * 4)
         .astype(np.float32),
         "model.norm.weight": norm_w(E)}
    if not cfg.get("tie_word_embeddings"):
        w["lm_head.weight"] = mat(V, E)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_w(E)
        w[p + "self_attn.q_proj.weight"] = mat(H * D, E)
        w[p + "self_attn.k_proj.weight"] = mat(KV * D, E)
        w[p + "self_attn.v_proj.weight"] = mat(KV * D, E)
        w[p + "self_attn.o_proj.weight"] = mat(E, H * D, 0.5)
        w[p + "post_attention_layernorm.weight"] = norm_w(E)
        if planted and i == 0:
            # rank 4 + a negative component along mu: sparse and exactly low-rank predictable
            gate = rng.standard_normal((F, 4)) @ rng.standard_normal((4, E)) / np.sqrt(E)
            gate -= PLANT_SHIFT * np.abs(rng.standard_normal((F, 1))) * mu_hat[None, :]
            w[p + "mlp.gate_proj.weight"] = gate.astype(np.float32)
        else:
            w[p + "mlp.gate_proj.weight"] = mat(F, E)
        w[p + "mlp.up_proj.weight"] = mat(F, E)
        w[p + "mlp.down_proj.weight"] = mat(E, F, 0.5)
    return w


def _config(vocab_size: int, **over) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "relu",
        "hidden_size": N_EMBD, "intermediate_size": N_FF, "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV,
        "vocab_size": vocab_size, "rms_norm_eps": 1e-5, "rope_theta": 5000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0}, "max_position_embeddings": 256,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    }
    cfg.update(over)
    return cfg


def _write_checkpoint(d: Path, cfg: dict, weights: dict, tokenizer: Path | None = None) -> Path:
    from safetensors.numpy import save_file
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights, str(d / "model.safetensors"))
    if tokenizer is not None:
        (d / "tokenizer.model").write_bytes(tokenizer.read_bytes())
    return d


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: deterministic, and much faster for these tiny matrices on a busy box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools")
    corpus = tmp / "corpus.txt"
    corpus.write_text(CORPUS * 4, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp / "spm"), model_type="bpe", vocab_size=300,
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp / "spm.model"))
    cfg = _config(sp.get_piece_size())
    weights = _weights(cfg)
    model_dir = _write_checkpoint(tmp / "model", cfg, weights, tmp / "spm.model")
    text = tmp / "text.txt"
    text.write_text(_random_text(700, seed=1), encoding="utf-8")
    return {"tmp": tmp, "dir": model_dir, "cfg": cfg, "weights": weights, "text": text,
            "sp": sp, "model": hfl.load_model(str(model_dir))}


# ------------------------------------------------------------------------------ numpy reference

def numpy_forward(cfg: dict, w: dict, tokens) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The float64 reference (reference_model): (logits [T, V], ffn_inp per layer, active mask per layer)."""
    trace: dict = {}
    logits = ReferenceModel.from_hf(w, cfg).forward(tokens, trace=trace)
    if cfg["model_type"] == "bamboo":
        masks = [(g > 0) & (u > 0) for g, u in zip(trace["gate"], trace["up"])]
    else:
        masks = [g != 0 for g in trace["gate"]]
    return logits, trace["ffn_inp"], masks


def _rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


# ------------------------------------------------------------------------------ model

@pytest.mark.parametrize("variant", ["llama_relu", "bamboo_tied", "silu_mha_plain_rope"])
def test_logits_match_numpy_float64(tiny, tmp_path, variant):
    if variant == "llama_relu":
        cfg, w, model = tiny["cfg"], tiny["weights"], tiny["model"]
    else:
        over = ({"model_type": "bamboo", "tie_word_embeddings": True} if variant == "bamboo_tied"
                else {"hidden_act": "silu", "num_key_value_heads": N_HEAD, "rope_scaling": None,
                      "rope_theta": 10000.0})
        cfg = _config(tiny["cfg"]["vocab_size"], **over)
        w = _weights(cfg, seed=3, planted=False)
        model = hfl.load_model(str(_write_checkpoint(tmp_path / variant, cfg, w)))
    tokens = [1] + tiny["sp"].encode("The engineer checked every bridge before the storms, "
                                     "and the children read stories about dragons.")
    ref_logits, ref_inp, ref_mask = numpy_forward(cfg, w, tokens)
    seen = {}
    logits = model.forward(tokens, ffn_hook=lambda il, x, h, m: seen.__setitem__(il, (x, h, m)))
    assert logits.dtype == torch.float32 and logits.shape == (len(tokens), cfg["vocab_size"])
    assert _rel_err(logits.numpy(), ref_logits) < LOGITS_REL_TOL
    for il in range(N_LAYER):
        x, h, m = seen[il]
        assert x.shape == (len(tokens), N_EMBD) and h.shape == m.shape == (len(tokens), N_FF)
        assert _rel_err(x.numpy(), ref_inp[il]) < LOGITS_REL_TOL      # pre-norm residual
        if variant == "llama_relu":
            assert torch.equal(m, h > 0) or torch.equal(m, h != 0)
        assert np.mean(m.numpy() != ref_mask[il]) <= MASK_FLIP_TOL


def test_weight_loaders_agree(tiny, tmp_path):
    """model.safetensors, sharded safetensors (+index) and pytorch_model.bin give one model."""
    from safetensors.numpy import save_file
    cfg, w = tiny["cfg"], tiny["weights"]
    names = sorted(w)
    half = len(names) // 2
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps(cfg))
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    for fn, keys in shards.items():
        save_file({k: w[k] for k in keys}, str(sharded / fn))
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: fn for fn, keys in shards.items() for k in keys}}))
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text(json.dumps(cfg))
    torch.save({k: torch.from_numpy(v).to(torch.float16) for k, v in w.items()},
               binary / "pytorch_model.bin")
    tokens = [1, 5, 17, 42, 99, 7]
    ref = tiny["model"].forward(tokens)
    assert torch.equal(hfl.load_model(str(sharded)).forward(tokens), ref)
    assert _rel_err(hfl.load_model(str(binary)).forward(tokens).numpy(), ref.numpy()) < 2e-2


# ------------------------------------------------------------------------------ profiler

def _windows(tiny, ctx=CTX, max_tokens=None):
    ids = hfl.tokenize_text(tiny["sp"], tiny["text"].read_text(encoding="utf-8"), max_tokens)
    return hfl.make_windows(ids, ctx, tiny["sp"].bos_id())


def test_profile_cli_counts(tiny, tmp_path):
    out = tmp_path / "activation"
    res = subprocess.run([sys.executable, str(TOOLS / "profile_activations.py"), str(tiny["dir"]),
                          str(tiny["text"]), "--out", str(out), "--ctx", str(CTX),
                          "--max-tokens", "1500", "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "sparsity" in res.stdout and "warning" not in res.stderr  # n_ff = 256: no warning
    files = sorted(os.listdir(out))
    assert files == [f"activation_{i}.pt" for i in range(N_LAYER)]

    windows = _windows(tiny, max_tokens=1500)
    assert all(len(wd) <= CTX and wd[0] == 1 for wd in windows)
    n_tok = sum(len(wd) for wd in windows)
    assert n_tok == 1500 + len(windows)
    direct = [np.zeros(N_FF, np.int64) for _ in range(N_LAYER)]
    ref = [np.zeros(N_FF, np.int64) for _ in range(N_LAYER)]
    for wd in windows:
        tiny["model"].forward(wd, ffn_hook=lambda il, x, h, m: direct[il].__iadd__(
            (h != 0).sum(0).numpy()))
        for il, m in enumerate(numpy_forward(tiny["cfg"], tiny["weights"], wd)[2]):
            ref[il] += m.sum(0)
    for i in range(N_LAYER):
        t = torch.load(out / f"activation_{i}.pt")
        assert t.dtype == torch.float32 and t.shape == (N_FF,)
        assert np.array_equal(t.numpy().astype(np.int64), direct[i])
        assert np.abs(t.numpy() - ref[i]).sum() <= MASK_FLIP_TOL * n_tok * N_FF
        assert 0 <= t.min() and t.max() <= n_tok
        spars = 1 - t.sum().item() / (n_tok * N_FF)
        assert f"{spars:8.4f}" in res.stdout
    # planted sparsity: layer 0 clearly sparser than the random layer 1 (~50% active)
    assert torch.load(out / "activation_0.pt").sum() < 0.45 * n_tok * N_FF


def test_profile_function_and_n_ff_warning(tiny, tmp_path, capsys):
    cfg = _config(tiny["cfg"]["vocab_size"], intermediate_size=160)
    d = _write_checkpoint(tmp_path / "ff160", cfg, _weights(cfg, seed=5, planted=False),
                          tiny["dir"] / "tokenizer.model")
    res = pa.run(str(d), str(tiny["text"]), ctx=32, max_tokens=200, progress=False)
    assert "not a multiple of 256" in capsys.readouterr().err
    assert [tuple(torch.load(p).shape) for p in res["paths"]] == [(160,)] * N_LAYER
    assert res["n_tokens"] == 200 + len(res["windows"])
    assert all(0.0 <= s <= 1.0 for s in res["sparsity"])


# ------------------------------------------------------------------------------ predictor

def _val_recall(tiny, pred_dir: Path, threshold: float, max_tokens: int):
    """Independent recall/precision of saved predictors on the held-out tokens (numpy)."""
    ids = hfl.tokenize_text(tiny["sp"], tiny["text"].read_text(encoding="utf-8"), max_tokens)
    n_val = max(1, int(round(len(ids) * 0.1)))
    val = hfl.make_windows(ids[-n_val:], CTX, 1)
    out = []
    for il in range(N_LAYER):
        sd = torch.load(pred_dir / f"model_{il}.pt")
        w1, w2 = sd["fc1.weight"].double().numpy(), sd["fc2.weight"].double().numpy()
        tp_ = fp_ = fn_ = 0
        for wd in val:
            _, inps, masks = numpy_forward(tiny["cfg"], tiny["weights"], wd)
            pred = np.maximum(inps[il] @ w1.T, 0) @ w2.T >= threshold
            tp_ += int((pred & masks[il]).sum())
            fp_ += int((pred & ~masks[il]).sum())
            fn_ += int((~pred & masks[il]).sum())
        out.append((tp_ / (tp_ + fn_), tp_ / (tp_ + fp_), float(masks[il].mean())))
    return out


def test_train_cli(tiny, tmp_path):
    out = tmp_path / "predictor"
    res = subprocess.run([sys.executable, str(TOOLS / "train_predictor.py"), str(tiny["dir"]),
                          str(tiny["text"]), "--out", str(out), "--ctx", str(CTX),
                          "--max-tokens", "4000", "--epochs", str(EPOCHS), "--rank", str(RANK),
                          "--seed", "0", "--batch", str(BATCH), "--lr", str(LR),
                          "--threads", "1", "--no-progress"],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(out)) == ["config.json"] + [f"model_{i}.pt" for i in range(N_LAYER)]
    for i in range(N_LAYER):
        sd = torch.load(out / f"model_{i}.pt")
        assert isinstance(sd, dict) and sorted(sd) == ["fc1.weight", "fc2.weight"]
        assert sd["fc1.weight"].shape == (RANK, N_EMBD) and sd["fc2.weight"].shape == (N_FF, RANK)
        assert sd["fc1.weight"].dtype == sd["fc2.weight"].dtype == torch.float32
    try:  # the converter's own (torch-free) reader accepts the files, when it is importable
        from powerinfer.convert.predictors import load_predictors
    except ImportError:
        load_predictors = None
    if load_predictors is not None:
        preds = load_predictors(out, n_layer=N_LAYER, n_embd=N_EMBD, n_ff=N_FF)
        assert preds.ranks == [RANK] * N_LAYER and preds.sparse_threshold == 0.0
        sd = torch.load(out / "model_0.pt")
        assert np.array_equal(preds.fc1[0].load_f32(), sd["fc1.weight"].numpy())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sparse_threshold"] == 0.0 and cfg["ranks"] == [RANK] * N_LAYER
    assert len(cfg["recall"]) == len(cfg["precision"]) == N_LAYER
    print("\nconfig:", {k: cfg[k] for k in ("ranks", "recall", "precision", "active_rate")})
    # planted layer 0: far above chance (chance recall = chance precision = active rate)
    rate0 = cfg["active_rate"][0]
    assert 0.05 < rate0 < 0.45
    assert cfg["recall"][0] >= PLANTED_MIN_RECALL
    assert cfg["precision"][0] >= max(0.5, 2 * rate0)
    # the reported numbers agree with an independent float64 evaluation of the saved files
    for il, (rec, prec, _) in enumerate(_val_recall(tiny, out, 0.0, 4000)):
        assert abs(rec - cfg["recall"][il]) < 0.01 and abs(prec - cfg["precision"][il]) < 0.01


def test_train_function_deterministic_f16_and_rank_auto(tiny, tmp_path):
    kw = dict(ctx=CTX, max_tokens=2500, epochs=3, seed=7, progress=False, log=lambda m: None,
              model=tiny["model"], batch=BATCH, lr=LR)
    a = tp.train(str(tiny["dir"]), str(tiny["text"]), str(tmp_path / "a"), rank=8, **kw)
    b = tp.train(str(tiny["dir"]), str(tiny["text"]), str(tmp_path / "b"), rank=8, **kw)
    tp.train(str(tiny["dir"]), str(tiny["text"]), str(tmp_path / "c"), rank=8,
             **dict(kw, seed=8))
    for i in range(N_LAYER):
        sa, sb, sc = (torch.load(tmp_path / x / f"model_{i}.pt") for x in "abc")
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        assert not torch.equal(sa["fc2.weight"], sc["fc2.weight"])
    assert a["recall"] == b["recall"] and a["precision"] == b["precision"]
    # one pass per layer (tiny memory budget) gives the same files as one pass for all layers
    tp.train(str(tiny["dir"]), str(tiny["text"]), str(tmp_path / "p"), rank=8, max_memory_gb=1e-9,
             **kw)
    for i in range(N_LAYER):
        sa, sp_ = (torch.load(tmp_path / x / f"model_{i}.pt") for x in "ap")
        assert all(torch.equal(sa[k], sp_[k]) for k in sa)

    tp.train(str(tiny["dir"]), str(tiny["text"]), str(tmp_path / "h"), rank=8, dtype="f16",
             threshold=0.5, **kw)
    sd = torch.load(tmp_path / "h" / "model_0.pt")
    assert sd["fc1.weight"].dtype == torch.float16 and sorted(sd) == ["fc1.weight", "fc2.weight"]
    assert json.loads((tmp_path / "h" / "config.json").read_text())["sparse_threshold"] == 0.5

    auto = tp.train(str(tiny["dir"]), str(tiny["text"]), str(tmp_path / "auto"), rank_auto=True,
                    rank_candidates=[1, 16], target_recall=0.8, target_precision=0.6,
                    **dict(kw, epochs=EPOCHS))
    print("\nrank-auto:", auto["ranks"], auto["candidates"])
    # rank 1 cannot represent layer 0's rank-5 sign pattern (it ends up near "all active" or
    # "none active"); 16 can
    assert auto["ranks"][0] == 16 and [t["rank"] for t in auto["candidates"][0]] == [1, 16]
    r1 = auto["candidates"][0][0]
    assert r1["recall"] < 0.8 or r1["precision"] < 0.6
    assert auto["recall"][0] >= 0.8 and auto["precision"][0] >= 0.6
    for i, r in enumerate(auto["ranks"]):
        assert torch.load(tmp_path / "auto" / f"model_{i}.pt")["fc1.weight"].shape == (r, N_EMBD)


# ------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("tool", [pa, tp])
@pytest.mark.parametrize("case", ["no_model", "no_text", "empty_text"])
def test_errors_one_line(tiny, tmp_path, capsys, tool, case):
    model = str(tmp_path / "missing") if case == "no_model" else str(tiny["dir"])
    text = tmp_path / "t.txt"
    if case == "empty_text":
        text.write_text(" \n\n")
    argv = [model, str(text), "--out", str(tmp_path / "o")]
    assert tool.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0]
    assert {"no_model": "model directory not found", "no_text": "text file not found",
            "empty_text": "text file is empty"}[case] in err[0]
    assert not (tmp_path / "o").exists()


def test_error_exit_subprocess(tmp_path):
    """The real CLI: exit status 1 and exactly one stderr line (no traceback, no import noise);
    train_predictor shares the code path (error_exit), checked in-process above."""
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    res = subprocess.run([sys.executable, str(TOOLS / "profile_activations.py"), str(tmp_path / "nope"), str(text),
                          "--out", str(tmp_path / "o"), "--threads", "1"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "model directory not found" in lines[0], res.stderr


def test_train_warns_when_the_recall_target_is_missed(tiny, tmp_path):
    """A threshold no score reaches predicts no neuron: recall 0 on every layer. The run warns (exit 0)
    and, with --strict, exits 2; config.json lists the layers either way."""
    base = [sys.executable, str(TOOLS / "train_predictor.py"), str(tiny["dir"]), str(tiny["text"]),
            "--ctx", str(CTX), "--max-tokens", "1000", "--epochs", "1", "--rank", "8", "--threshold", "1e9",
            "--target-recall", "0.5", "--threads", "1", "--no-progress"]
    for strict, rc in ((False, 0), (True, 2)):
        out = tmp_path / f"pred-{strict}"
        res = subprocess.run(base + ["--out", str(out)] + ["--strict"] * strict, capture_output=True, text=True,
                             timeout=180)
        assert res.returncode == rc, res.stderr
        assert "miss the recall target 0.5" in res.stderr
        assert ("--strict" in res.stderr) == strict
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["layers_below_target_recall"] == list(range(N_LAYER)) and cfg["target_recall"] == 0.5
