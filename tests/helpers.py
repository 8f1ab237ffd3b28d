"""Helpers and named tolerances shared by the test modules.

Fixtures live in conftest.py; these are plain functions and constants, so they sit in a module the
tests import by name (`from helpers import rel_rms`): with three conftest.py files in the tree
(tests/, tests/gpu/, tests/compat/) `import conftest` names whichever pytest loaded last."""
from __future__ import annotations

import struct
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# Relative RMS error of the engine's logits / hidden states against a float64 numpy reference.
FLOAT_REL_RMS = 1e-5      # float32 arithmetic vs float64 (f32/f16/bf16 weights, f32 KV cache)
QUANT_REL_RMS = 3e-2      # + 8-bit activation quantization before q8_0/q4_0 dot products (measured ~1.1%)
KV_F16_REL_RMS = 3e-3     # an f16 KV cache on top of float weights

# the tiny llama of tools/make_test_model.py that the program and API tests run (conftest.tiny_model)
TINY_SHAPE = dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2)


def rel_rms(ours, ref) -> float:
    """sqrt(mean((ours - ref)^2) / mean(ref^2))."""
    return float(np.sqrt(np.mean((ours - ref) ** 2) / np.mean(ref ** 2)))


def logits_all(ctx, tokens, *, clear: bool = False) -> np.ndarray:
    """[len(tokens), n_vocab]: the logits of every position of one decode (after kv_clear if clear)."""
    if clear:
        ctx.kv_clear()
    ctx.decode(tokens, logits="all")
    return np.stack([ctx.logits(i) for i in range(len(tokens))])


def llama_cpp_eval(path, tokens, *, n_ctx: int = 64, **kw):
    """(the llama-cpp-python Llama, [len(tokens), n_vocab] float64 logits of every position) of the file through
    llama.cpp (the test is skipped where llama-cpp-python is not installed), with an f32 KV cache (ggml type 0) on one
    thread; kw: more Llama keywords."""
    import pytest
    llama_cpp = pytest.importorskip("llama_cpp")
    ll = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, verbose=False, n_threads=1,
                         type_k=0, type_v=0, **kw)
    ll.eval(list(tokens))
    return ll, np.array(ll.scores[:len(tokens)], dtype=np.float64)


def llama_cpp_logits(path, tokens, *, n_ctx: int = 64, **kw) -> np.ndarray:
    """[len(tokens), n_vocab] float64: every position's logits through llama.cpp (llama_cpp_eval's)."""
    return llama_cpp_eval(path, tokens, n_ctx=n_ctx, **kw)[1]


def greedy_both(ll, model, tokens, n: int) -> tuple[list[int], list[int]]:
    """n greedy tokens after `tokens` through llama.cpp (a Llama with logits_all, reset first) and through our model
    (f32 KV cache, one thread, n_ctx 64): (theirs, ours)."""
    import powerinfer as pi

    def llama_next(toks):
        ll.eval(toks)
        return np.array(ll.scores[ll.n_tokens - 1])

    ctx = pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1)

    def ours_next(toks):
        ctx.decode(toks)
        return ctx.logits()
    ll.reset()
    return greedy_tokens(llama_next, tokens, n), greedy_tokens(ours_next, tokens, n)


def check_level(path, level, ref, tokens, tol: float) -> None:
    """The model at `path` at ISA level `level` (the test skipped where the CPU or build lacks it): its logits of the
    prompt in one call and token by token within tol (relative RMS) of ref, and the prompt's the scalar level's bits
    (the numeric contract); f32 KV cache, n_ctx 64; the previous level restored."""
    import pytest

    import powerinfer as pi
    if not pi.cpu_isa_supported(level):
        pytest.skip(f"{level}: not supported by this CPU or build")
    start = pi.cpu_isa()
    try:
        pi.set_cpu_isa(level)
        model = pi.Model(path)
        prompt = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), tokens)
        single = logits_one_by_one(pi.Context(model, n_ctx=64, kv_type="f32"), tokens)
        pi.set_cpu_isa("scalar")
        scalar = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), tokens)
    finally:
        pi.set_cpu_isa(start)
    assert rel_rms(prompt, ref) < tol, rel_rms(prompt, ref)
    assert rel_rms(single, ref) < tol, rel_rms(single, ref)
    assert np.array_equal(prompt, scalar), f"{level} vs scalar"


def greedy_tokens(next_logits, prompt, n):
    """n greedy tokens: next_logits(tokens) evaluates them and returns the last row's logits."""
    logits, out = next_logits(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = next_logits([out[-1]])
    return out


def logits_in_calls(ctx, tokens, n: int, *, clear: bool = False) -> np.ndarray:
    """Every position's logits, decoding the tokens n to a call (after kv_clear if clear)."""
    if clear:
        ctx.kv_clear()
    return np.concatenate([logits_all(ctx, tokens[s:s + n]) for s in range(0, len(tokens), n)])


def logits_one_by_one(ctx, tokens, *, clear: bool = False) -> np.ndarray:
    """The logits of decoding the tokens one call each (after kv_clear if clear)."""
    if clear:
        ctx.kv_clear()
    steps = []
    for t in tokens:
        ctx.decode([t])
        steps.append(ctx.logits())
    return np.stack(steps)


@contextmanager
def reaped(proc):
    """Kill the subprocess proc at the end of the block if it still runs (a failed check inside it
    must not leave it behind)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _pk_str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _pk_int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def torch_free_save(path: Path, obj: dict[str, np.ndarray] | np.ndarray) -> None:
    """A torch.save-compatible zip archive written without torch (torch is not in the test extras): of a dict of
    float32/float16 tensors (a state dict), or of one tensor (PowerInfer's activation_N.pt). data.pkl (protocol 2)
    rebuilds each tensor with torch._utils._rebuild_tensor_v2 from a persistent-id storage; data/<key> holds the
    raw little-endian bytes."""
    prefix = path.stem
    storages = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float16): "HalfStorage"}
    blobs = []

    def tensor(key: int, a: np.ndarray) -> bytes:
        a = np.ascontiguousarray(a)
        stride = [int(np.prod(a.shape[i + 1:])) for i in range(a.ndim)]
        t = b"ctorch._utils\n_rebuild_tensor_v2\n("
        t += b"(" + _pk_str("storage") + f"ctorch\n{storages[a.dtype]}\n".encode() + _pk_str(str(key)) \
            + _pk_str("cpu") + _pk_int(a.size) + b"tQ"
        t += _pk_int(0) + b"(" + b"".join(_pk_int(s) for s in a.shape) + b"t"
        t += b"(" + b"".join(_pk_int(s) for s in stride) + b"t"
        t += b"\x89ccollections\nOrderedDict\n)RtR"
        blobs.append((f"{prefix}/data/{key}", a.tobytes()))
        return t

    if isinstance(obj, np.ndarray):
        pkl = b"\x80\x02" + tensor(0, obj) + b"."
    else:
        pkl = b"\x80\x02}("
        for key, (name, a) in enumerate(obj.items()):
            pkl += _pk_str(name) + tensor(key, a)
        pkl += b"u."
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/byteorder", b"little")
        for name, raw in blobs:
            z.writestr(name, raw)
        z.writestr(f"{prefix}/version", b"3\n")


def main_greedy(model, *extra, prompt: str = "the cat", n: int = 12):
    """examples/main.py on `model`: n greedy tokens after `prompt` (-no-cnv, -c 64, --ignore-eos) plus `extra` flags;
    the CompletedProcess (stdout: the prompt and the text)."""
    import subprocess
    import sys
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"
    return subprocess.run([sys.executable, str(main), "-m", str(model), "-p", prompt, "-n", str(n), "--temp", "0",
                           "--ignore-eos", "-no-cnv", "-c", "64", *map(str, extra)], capture_output=True, text=True,
                          timeout=120)


_EMULATED_OFFLOAD_SCRIPT = """
import sys, numpy as np, powerinfer as pi
m, prompt = pi.Model(sys.argv[1]), [int(t) for t in sys.argv[2].split(",")]
def run(**kw):
    c = pi.Context(m, n_ctx=64, kv_type="f32", **kw)
    c.decode(prompt, logits="all")
    return c, np.stack([c.logits(i) for i in range(len(prompt))])
cpu = run()[1]
c, got = run(n_gpu_layers=-1)
print(c.offload is not None, bool(np.array_equal(got, cpu)))
print("|".join(c.gpu_warnings))
"""


def emulated_offload(path, tokens) -> tuple[bool, bool, str]:
    """Decodes tokens with -ngl -1 on the emulated device (POWERINFER_EMULATED_GPU_MIB=256, in a child process) and on
    the CPU: (whether the context offloaded, whether its logits are the CPU's bits, its GPU warnings joined by |)."""
    import os
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _EMULATED_OFFLOAD_SCRIPT, str(path), ",".join(map(str, tokens))],
                         env=dict(os.environ, POWERINFER_EMULATED_GPU_MIB="256"), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    flags, warnings = out.stdout.splitlines()[:2]
    offloaded, same = flags.split()
    return offloaded == "True", same == "True", warnings


def agrees_with_llama_cpp(path, tokens, bound: float, *, same_argmax: bool = False, n_greedy: int = 12) -> float:
    """The file through us (f32 KV cache, one thread, n_ctx 64) and llama.cpp (llama_cpp_eval): every position's
    logits of tokens within relative RMS bound of llama.cpp's (printed), the same argmax at every position if
    same_argmax, the same n_greedy greedy tokens after them; returns the difference."""
    import powerinfer as pi
    model = pi.Model(path)
    ours = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1), tokens)
    ll, theirs = llama_cpp_eval(path, tokens)
    err = rel_rms(ours, theirs)
    print(f"{Path(path).name}: {err:.2e} from llama.cpp")
    assert err < bound, err
    if same_argmax:
        assert np.array_equal(ours.argmax(1), theirs.argmax(1))
    theirs_greedy, ours_greedy = greedy_both(ll, model, tokens, n_greedy)
    assert ours_greedy == theirs_greedy
    return err
