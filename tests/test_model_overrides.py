"""Model-level overrides as llama.cpp takes them: --rope-freq-base / --rope-freq-scale / --rope-scale /
--rope-scaling / --yarn-* (Model(rope_freq_base=, ...), powerinfer.rope) and --override-kv (Model(kv_overrides=)),
each checked against a file whose metadata says the same; YaRN against the float64 reference forward."""
from __future__ import annotations

import math

import numpy as np
import pytest


def test_rope_overrides(tiny_model, tmp_path):
    """--rope-freq-base / --rope-freq-scale / --rope-scale / --rope-scaling none: the model of a file whose metadata
    says so (the same logits), in the API and main.py."""
    import subprocess
    import sys
    from pathlib import Path

    import powerinfer as pi
    from model_files import rewrite
    src = tiny_model("f32", seed=5)
    from gguf import GGUFValueType as VT
    ref_file = rewrite(src, tmp_path / "rope.gguf", meta={"llama.rope.freq_base": (5000.0, VT.FLOAT32),
                                                         "llama.rope.scaling.type": ("linear", VT.STRING),
                                                         "llama.rope.scaling.factor": (4.0, VT.FLOAT32)})
    toks = list(range(1, 40))

    def logits(model):
        ctx = pi.Context(model, n_ctx=64)
        ctx.decode(toks, logits="all")
        return np.stack([ctx.logits(i) for i in range(len(toks))])
    want = logits(pi.Model(ref_file))
    assert np.array_equal(logits(pi.Model(src, rope_freq_base=5000.0, rope_freq_scale=0.25)), want)
    assert not np.array_equal(logits(pi.Model(src)), want)
    assert np.array_equal(logits(pi.Model(ref_file, rope_freq_scale=1.0)),
                          logits(pi.Model(src, rope_freq_base=5000.0)))
    with pytest.raises(ValueError, match="rope_freq_base"):
        pi.Model(src, rope_freq_base=-1)
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"

    def run(path, *extra):
        return subprocess.run([sys.executable, str(main), "-m", str(path), "-p", "Once", "-n", "12", "--temp", "0",
                               "--ignore-eos", "-no-cnv", "-c", "64", *extra], capture_output=True, text=True,
                              timeout=120)
    assert run(src, "--rope-freq-base", "5000", "--rope-scale", "4").stdout == run(ref_file).stdout
    assert run(ref_file, "--rope-scaling", "none").stdout == run(src, "--rope-freq-base", "5000").stdout
    bad = run(src, "--rope-scale", "-2")
    assert bad.returncode == 1 and "--rope-scale must be > 0" in bad.stderr


def test_override_kv(tiny_model):
    """--override-kv KEY=TYPE:VALUE / kv_overrides: the model reads the given metadata value instead of the file's."""
    import subprocess
    import sys
    from pathlib import Path

    import powerinfer as pi
    from powerinfer.model import parse_kv_override
    src = tiny_model("f32", seed=5)
    m = pi.Model(src, kv_overrides={"tokenizer.ggml.add_bos_token": False, "llama.rope.freq_base": 5000.0})
    assert m.tokenizer.encode("the cat")[0] != m.tokenizer.bos_id
    assert pi.Model(src).tokenizer.encode("the cat")[0] == m.tokenizer.bos_id
    assert m.hparams.rope_freq_base == 5000.0
    assert parse_kv_override("a.b=int:3") == ("a.b", 3)
    assert parse_kv_override("a=bool:FALSE") == ("a", False) and parse_kv_override("a=str:x:y") == ("a", "x:y")
    for bad in ("a=int:x", "a=bool:maybe", "a=list:1", "a:int=3", "=int:1"):
        with pytest.raises(ValueError, match="override-kv"):
            parse_kv_override(bad)
    with pytest.raises(ValueError, match="kv_overrides"):
        pi.Model(src, kv_overrides={"a": [1]})
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"

    def run(*extra):
        return subprocess.run([sys.executable, str(main), "-m", str(src), "-p", "Once", "-n", "8", "--temp", "0",
                               "--ignore-eos", "-no-cnv", "-c", "64", *extra], capture_output=True, text=True,
                              timeout=120)
    assert run("--override-kv", "llama.rope.freq_base=float:5000").stdout == run("--rope-freq-base", "5000").stdout
    bad = run("--override-kv", "llama.rope.freq_base=double:5000")
    assert bad.returncode == 1 and "not one of int, float, bool, str" in bad.stderr


YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 8}


def yarn_file(src, dst, arch, extra=None):
    from gguf import GGUFValueType as VT
    from model_files import rewrite
    types = {str: VT.STRING, float: VT.FLOAT32, int: VT.UINT32}
    meta = {f"{arch}.{k}": (v, types[type(v)]) for k, v in {**YARN, **(extra or {})}.items()}
    return rewrite(src, dst, meta=meta)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama-ff"])
def test_yarn_matches_the_reference(tmp_path, arch):
    """YaRN (the core's per-pair frequency divisors and attention scale) against ggml's rope_yarn written out in the
    float64 reference forward: normal and NEOX pairs, with a file's own rope_freqs, positions past the original
    context; and it differs from linear scaling."""
    import powerinfer as pi
    from helpers import FLOAT_REL_RMS, logits_all, rel_rms
    from model_files import make_weights, write_arch_model
    from reference_model import ReferenceModel
    base = arch.split("-")[0]
    weights = make_weights(base, 4, rope_freqs=True) if arch == "llama-ff" else None
    src = write_arch_model(tmp_path / "src.gguf", base, seed=3, weights=weights) and tmp_path / "src.gguf"
    extra = {"rope.scaling.attn_factor": 1.3} if arch == "qwen2" else None
    path = yarn_file(src, tmp_path / "yarn.gguf", base, extra)
    prompt = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190, 2, 9, 77, 31]   # 20 > 8
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), prompt)
    ref = ReferenceModel(path).forward(prompt)
    assert rel_rms(ours, ref) < FLOAT_REL_RMS, rel_rms(ours, ref)
    linear = logits_all(pi.Context(pi.Model(path, rope_scaling="linear"), n_ctx=64, kv_type="f32"), prompt)
    assert rel_rms(linear, ref) > 1e-3
    # the same model from flags on the plain file (llama.cpp's --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 8)
    kw = dict(rope_scaling="yarn", rope_freq_scale=0.25, yarn_orig_ctx=8)
    if extra:
        kw["kv_overrides"] = {f"{base}.rope.scaling.attn_factor": float(np.float32(1.3))}   # the file's f32 value
    same = logits_all(pi.Context(pi.Model(src, **kw), n_ctx=64, kv_type="f32"), prompt)
    assert np.array_equal(same, ours)


def test_yarn_flags_and_refusals(tiny_model, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import powerinfer as pi
    from model_files import write_arch_model
    src = tiny_model("f32", seed=5)
    path = yarn_file(src, tmp_path / "yarn.gguf", "llama")
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"

    def run(p, *extra):
        return subprocess.run([sys.executable, str(main), "-m", str(p), "-p", "Once", "-n", "12", "--temp", "0",
                               "--ignore-eos", "-no-cnv", "-c", "64", *extra], capture_output=True, text=True,
                              timeout=120)
    want = run(path)
    assert want.returncode == 0, want.stderr
    assert run(src, "--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "8").stdout == want.stdout
    assert run(path, "--yarn-ext-factor", "0").stdout == run(src, "--rope-scale", "4").stdout   # interpolation only
    llm = pi.PowerInfer(src, n_ctx=64, verbose=False, rope_scaling_type=2, rope_freq_scale=0.25, yarn_orig_ctx=8)
    assert llm.create_completion("Once", max_tokens=12, temperature=0, ignore_eos=True)["choices"][0]["text"] == \
        want.stdout[len("Once"):]
    g = write_arch_model(tmp_path / "g.gguf", "gemma3", seed=3) and tmp_path / "g.gguf"
    with pytest.raises(ValueError, match="gemma3"):
        pi.Model(g, rope_scaling="yarn", rope_freq_scale=0.5)
    # YaRN's mscale_all_dim (yarn_log_multiplier, mistral3's files): cos/sin scaled by llama.cpp's
    # get_mscale(4, 1) / get_mscale(4, 0.1)
    hp = pi.Model(yarn_file(src, tmp_path / "lm.gguf", "llama", {"rope.scaling.yarn_log_multiplier": 0.1})).hparams
    assert pi.rope.rope_mscale(hp) == pytest.approx((1 + 0.1 * math.log(4)) / (1 + 0.01 * math.log(4)))
    with pytest.raises(ValueError, match="rope_scaling"):
        pi.Model(src, rope_scaling="longrope")


def test_server_rope_flags(tiny_model):
    from powerinfer.server.cli import make_state, parse_args
    args = parse_args(["-m", str(tiny_model("f32", seed=5)), "-c", "64", "-t", "1", "--rope-scaling", "yarn",
                       "--rope-scale", "4", "--yarn-orig-ctx", "8", "--override-kv", "llama.rope.freq_base=float:5000"])
    state = make_state(args)
    llm = state.loader()
    hp = llm.model.hparams
    assert (hp.rope_scaling, hp.rope_freq_scale, hp.yarn_orig_ctx, hp.rope_freq_base) == ("yarn", 0.25, 8, 5000.0)
    llm.close()


def test_mixture_of_experts_metadata_without_experts(tiny_model, tmp_path):
    """expert_count in the metadata (Mixtral's layout; tests/test_moe.py) without the experts: the missing tensor
    named; an impossible expert_used_count: the reason."""
    from gguf import GGUFValueType as VT

    import powerinfer as pi
    from model_files import rewrite
    moe = rewrite(tiny_model("f32", seed=5), tmp_path / "moe.gguf",
                  meta={"llama.expert_count": (8, VT.UINT32), "llama.expert_used_count": (2, VT.UINT32)})
    with pytest.raises(pi.ModelLoadError, match="missing tensor 'blk.0.ffn_gate_inp.weight'"):
        pi.Model(moe)
    bad = rewrite(tiny_model("f32", seed=5), tmp_path / "bad.gguf",
                  meta={"llama.expert_count": (8, VT.UINT32), "llama.expert_used_count": (9, VT.UINT32)})
    with pytest.raises(pi.ModelLoadError, match="n_expert_used = 9"):
        pi.Model(bad)
