"""What a llama.cpp user meets first in examples/main.py (and the flags the other tools share):
defaults as current llama.cpp has them, llama.cpp's flags recognised by their full names,
context size and context shift, conversation mode, interactive input, timings, bad input."""
from __future__ import annotations

import importlib.util
import io
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import powerinfer as pi  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from model_files import rewrite  # noqa: E402
from helpers import TINY_SHAPE, reaped  # noqa: E402
from powerinfer.cli_args import LoadProgress, threads_in_use  # noqa: E402
from powerinfer.context import resolve_n_ctx  # noqa: E402
from powerinfer.engine import ContextFull, Timings  # noqa: E402
from powerinfer.generator import Generator  # noqa: E402

MAIN = ROOT / "examples" / "main.py"


def _load_main():
    spec = importlib.util.spec_from_file_location("_main_under_test", MAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


main_mod = _load_main()


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "bindings"), e.get("PYTHONPATH")) if p)
    return e


def run_main(*args, input: str | None = "", timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(MAIN), *map(str, args)], input=input, capture_output=True,
                          text=True, timeout=timeout, env=env())


@pytest.fixture(scope="module")
def tiny(tiny_model) -> Path:
    return tiny_model("f32", seed=7, n_ctx_train=512)


# ------------------------------------------------------------------------------------------ flags
@pytest.mark.parametrize("argv,named", [
    (["-ngx", "99"], "-ngx"),          # a prefix of nothing: used to be "-n: invalid int value 'gx'"
    (["-n99"], "-n99"),                # no -xVALUE splitting either
    (["--temperature", "0"], "--temperature"),
    (["--tem", "0"], "--tem"),         # no abbreviations of --temp
    (["--repeat-pen", "1"], "--repeat-pen"),
])
def test_unknown_and_abbreviated_flags_are_reported_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as ei:
        main_mod.parse_args(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {named}" in err, err


def test_ngl_is_the_gpu_layer_count_not_n_gl():
    assert main_mod.parse_args(["-ngl", "99"]).n_gpu_layers == 99


def test_fa_is_not_f_a_and_no_effect_flags_say_so_once(capsys):
    args = main_mod.parse_args(["-fa", "--mlock", "--no-mmap", "--jinja", "-tb", "4", "-ub", "128", "-p", "x"])
    assert args.file is None and args.prompt == "x"
    err = capsys.readouterr().err
    for flag in ("-fa/--flash-attn", "--jinja"):
        assert err.count(f"{flag} is accepted for llama.cpp compatibility and changes nothing") == 1, err
    for flag in ("--mlock", "--no-mmap", "-tb/--threads-batch", "-ub/--ubatch-size"):   # they work (test_mlock, ...)
        assert f"{flag} is accepted" not in err
    assert args.batch_size == 128                                     # -ub lowers -b (llama.cpp's physical batch)
    assert main_mod.parse_args(["-b", "64", "-ub", "128"]).batch_size == 64
    main_mod.parse_args([])
    assert "changes nothing" not in capsys.readouterr().err
    main_mod.parse_args(["--keep", "4"])
    assert "--keep changes nothing without --context-shift" in capsys.readouterr().err
    main_mod.parse_args(["--keep", "4", "--context-shift"])
    assert "changes nothing" not in capsys.readouterr().err


def test_mlock(tiny):
    """--mlock locks the weights in RAM (the process's VmLck covers the file), or says why the system refused (here:
    RLIMIT_MEMLOCK 0 for a user without CAP_IPC_LOCK); the output is the same either way."""
    import resource
    probe = ("import atexit, resource, runpy, sys\n"
             "if sys.argv[1] == 'limit': resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))\n"
             "atexit.register(lambda: print([ln for ln in open('/proc/self/status') if ln.startswith('VmLck')][0],"
             " file=sys.stderr))\n"
             "sys.argv = sys.argv[2:]\n"
             "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    base = ["-m", tiny, "-p", "Once", "-n", "8", "--temp", "0", "--ignore-eos", "-no-cnv", "-c", "64"]

    def run(*extra, limit=False):
        return subprocess.run([sys.executable, "-c", probe, "limit" if limit else "-", str(MAIN), *map(str, base),
                               *extra], capture_output=True, text=True, timeout=120, env=env())
    plain, locked = run(), run("--mlock")
    assert locked.returncode == 0 and locked.stdout == plain.stdout, locked.stderr
    vmlck = lambda r: int(re.search(r"VmLck:\s+(\d+) kB", r.stderr).group(1)) * 1024   # noqa: E731
    assert vmlck(plain) == 0
    assert "weights locked in RAM (--mlock)" in locked.stderr and vmlck(locked) >= os.path.getsize(tiny)
    if os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] != 0:
        refused = run("--mlock", limit=True)
        assert refused.returncode == 0 and refused.stdout == plain.stdout
        assert "failed to lock" in refused.stderr and "RLIMIT_MEMLOCK" in refused.stderr


def test_no_mmap(tiny, tmp_path):
    """--no-mmap / use_mmap=False: the weights are a copy read into memory (the file may then change or go), the
    output the mapped file's."""
    import shutil
    copy = shutil.copy(tiny, tmp_path / "copy.gguf")
    mapped = pi.Model(copy)
    read = pi.Model(copy, use_mmap=False)
    assert not isinstance(read.file.mapping, np.memmap) and isinstance(mapped.file.mapping, np.memmap)
    toks = [1, 5, 9, 12, 3]
    want = pi.Context(mapped, n_ctx=32)
    want.decode(toks, logits="all")
    Path(copy).write_bytes(b"\0" * os.path.getsize(copy))   # the mapped model would now read zeros
    ctx = pi.Context(read, n_ctx=32)
    ctx.decode(toks, logits="all")
    assert all(np.array_equal(ctx.logits(i), want.logits(i)) for i in range(len(toks)))
    base = ["-m", tiny, "-p", "Once", "-n", "8", "--temp", "0", "--ignore-eos", "-no-cnv", "-c", "64"]
    assert run_main(*base, "--no-mmap").stdout == run_main(*base).stdout
    llm = pi.PowerInfer(tiny, n_ctx=64, n_threads=1, verbose=False, use_mmap=False)
    assert not isinstance(llm.model.file.mapping, np.memmap)


def test_mlock_refused_says_why(tiny, monkeypatch):
    """Where the system refuses mlock (RLIMIT_MEMLOCK), Model.mlock returns llama.cpp's advice instead of failing."""
    import ctypes

    class Libc:
        def mlockall(self, flags):
            ctypes.set_errno(12)       # ENOMEM: what Linux answers over RLIMIT_MEMLOCK
            return -1
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: Libc())
    warning = pi.Model(tiny).mlock()
    assert "failed to lock" in warning and "RLIMIT_MEMLOCK" in warning and "Cannot allocate memory" in warning


def test_cache_type_flags(capsys):
    """-ctk / -ctv set the K and V caches' types (llama.cpp's flags), each on its own; --kv-type sets both."""
    assert main_mod.parse_args(["-ctk", "f32", "-ctv", "f32"]).kv_type == "f32"
    assert main_mod.parse_args(["-ctk", "F16"]).kv_type == "f16"
    assert main_mod.parse_args(["-ctk", "q8_0", "-ctv", "q8_0"]).kv_type == "q8_0"
    assert main_mod.parse_args(["-ctk", "q8_0"]).kv_type == ("q8_0", "f16")
    assert main_mod.parse_args(["-ctv", "q4_0"]).kv_type == ("f16", "q4_0")
    assert main_mod.parse_args(["--kv-type", "f32", "-ctk", "q5_1"]).kv_type == ("q5_1", "f32")
    assert main_mod.parse_args(["--kv-type", "bf16"]).kv_type == "bf16"
    assert main_mod.parse_args(["-ctk", "iq4_nl", "-ctv", "q5_0"]).kv_type == ("iq4_nl", "q5_0")
    for argv, words in ((["-ctk", "q4_K"], "q4_k: not a KV cache type"), (["-ctv", "q6_k"], "not a KV cache type"),
                        (["-ctk", "xyz"], "xyz: not a KV cache type")):
        with pytest.raises(SystemExit) as ei:
            main_mod.parse_args(argv)
        assert ei.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("script", ["examples/server.py", "examples/batched.py", "examples/perplexity.py"])
def test_other_tools_share_the_exact_flag_matching(script):
    r = subprocess.run([sys.executable, str(ROOT / script), "-ngx", "99", "-fa"], capture_output=True, text=True,
                       timeout=60, env=env())
    assert r.returncode == 2 and "unrecognized arguments: -ngx" in r.stderr, r.stderr
    assert "invalid int value" not in r.stderr


# ------------------------------------------------------------------------------------------ defaults
def test_sampling_defaults_are_the_apis():
    """main.py used a 1.1 repeat penalty (llama.cpp's 2023 default); now every tool takes SamplingParams'."""
    a = main_mod.parse_args([])
    sp = pi.SamplingParams()
    assert (a.temp, a.top_k, a.top_p, a.min_p, a.repeat_penalty, a.repeat_last_n) == \
        (sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repeat_penalty, sp.repeat_last_n)
    assert a.repeat_penalty == 1.0
    from powerinfer.server.app import sampling_fields
    assert sampling_fields({})["repeat_penalty"] == 1.0


def test_greedy_text_equals_the_apis(tiny):
    """--temp 0 in main.py and temperature=0 in the API give the same text for the same prompt."""
    r = run_main("-m", tiny, "-p", "hello", "-n", "12", "--temp", "0", "--ignore-eos", "-t", "1",
                 "--no-display-prompt")
    assert r.returncode == 0, r.stderr
    llm = pi.PowerInfer(tiny, n_threads=1)
    api = llm.generate("hello", max_tokens=12, temperature=0, ignore_eos=True)
    assert r.stdout == api


def test_context_size_default_and_warning(tiny, caplog):
    m = pi.Model(tiny)
    assert m.hparams.n_ctx_train == 512
    assert resolve_n_ctx(m, None) == 512          # min(4096, training context)
    assert resolve_n_ctx(m, 0) == 512
    assert resolve_n_ctx(m, 128) == 128
    with caplog.at_level(logging.WARNING, logger="powerinfer"):
        assert resolve_n_ctx(m, 1024) == 1024
    assert "larger than the model's training context (512)" in caplog.text
    assert pi.PowerInfer(tiny, n_threads=1).n_ctx() == 512
    r = run_main("-m", tiny, "-p", "x", "-n", "1", "-c", "1024", "-t", "1")
    assert r.returncode == 0 and r.stderr.count("larger than the model's training context") == 1, r.stderr
    from powerinfer.server.cli import parse_args as server_args
    assert server_args([]).ctx_size is None       # the same default in the server


def test_system_info_shows_the_threads_used(tiny):
    r = run_main("-m", tiny, "-p", "x", "-n", "1")
    assert r.returncode == 0, r.stderr
    n = int(re.search(r"system_info: n_threads = (\d+)", r.stderr).group(1))
    assert n == threads_in_use(0) >= 1
    assert "n_threads = 3 |" in run_main("-m", tiny, "-p", "x", "-n", "1", "-t", "3").stderr


def test_total_time_counts_the_load_once():
    t = Timings(load_ms=1500.0)
    t.t_start -= 2.0                   # made 2 s ago, before a 1.5 s load
    total = float(re.search(r"total time = +([\d.]+) ms", t.report()).group(1))
    assert 2000.0 <= total < 3500.0     # was 3500 + (the load counted twice)


def test_load_progress_dots():
    buf = io.StringIO()
    with LoadProgress("main", after=0.0, every=0.001, out=buf):
        deadline = time.monotonic() + 30
        while "." not in buf.getvalue() and time.monotonic() < deadline:
            time.sleep(0.005)
    text = buf.getvalue()
    assert text.startswith("main: loading .") and re.search(r" done \([\d.]+ s\)\n$", text), text
    quiet = io.StringIO()
    with LoadProgress("main", after=3600.0, out=quiet):
        pass
    assert quiet.getvalue() == ""


# ------------------------------------------------------------------------------------------ bad input
def test_model_directory_and_missing_prompt_file(tiny, tmp_path):
    r = run_main("-m", tiny.parent, "-p", "x")
    assert r.returncode == 1 and "is a directory, not a model file" in r.stderr and tiny.name in r.stderr
    r = run_main("-m", tiny, "-f", tmp_path / "missing.txt")
    assert r.returncode == 1 and "cannot read prompt file" in r.stderr
    assert "loaded" not in r.stderr                  # before the model loads
    assert "Traceback" not in r.stderr


def test_nan_logits_are_one_error_line(tiny, tmp_path):
    """A file whose weights make NaN logits: one error line and status 1, not a sampler traceback."""
    nan = np.full(TINY_SHAPE["n_embd"], np.nan, np.float32)
    out = rewrite(tiny, tmp_path / "nan.gguf", replace={"output_norm.weight": (nan, GGMLQuantizationType.F32)})
    res = run_main("-m", out, "-p", "x", "-n", "4", "-t", "1")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "NaN" in errors[0], res.stderr


# ------------------------------------------------------------------------------------------ context shift
def test_generator_context_shift(tiny):
    model = pi.Model(tiny)
    ctx = pi.Context(model, n_ctx=32, kv_type="f32", n_threads=1)
    params = pi.SamplingParams(temperature=0, ignore_eos=True)
    prompt = [1, 17, 200, 45, 3, 99]
    gen = Generator(ctx, pi.Sampler(params), context_shift=True, n_keep=3)
    gen.feed(prompt)
    out = list(gen.generate(100))
    assert len(out) == 100 and not gen.context_full and gen.n_shifts > 0
    assert gen.tokens[:3] == prompt[:3] and gen.n_past <= 32
    # after a shift the cache holds exactly the kept tokens: the next logits are a fresh context's
    solo = pi.Context(model, n_ctx=32, kv_type="f32", n_threads=1)
    solo.decode(gen.tokens)
    ctx.decode([5], pos=[gen.n_past])
    solo.decode([5], pos=[len(gen.tokens)])
    np.testing.assert_allclose(ctx.logits(), solo.logits(), rtol=0, atol=1e-5)
    # off (the default): generation stops at the full context
    ctx.kv_clear()
    gen = Generator(ctx, pi.Sampler(params))
    gen.feed(prompt)
    assert len(list(gen.generate(100))) == 32 - len(prompt) + 1 and gen.context_full
    # a feed longer than the context keeps n_keep and the newest tokens (llama.cpp's prompt truncation)
    ctx.kv_clear()
    gen = Generator(ctx, pi.Sampler(params), context_shift=True, n_keep=2)
    long = [(7 * i) % 300 + 1 for i in range(50)]
    gen.feed(long)
    assert gen.tokens[:2] == long[:2] and gen.tokens[2:] == long[-len(gen.tokens) + 2:] and gen.n_past <= 32
    assert len(list(gen.generate(40))) == 40
    # n_keep is capped at n_ctx - 4 (as llama.cpp's server does), so a shift always frees room
    ctx.kv_clear()
    gen = Generator(ctx, pi.Sampler(params), context_shift=True, n_keep=40)
    gen.feed(list(range(1, 31)))
    gen.feed([7, 8, 9])
    assert gen.tokens[:28] == list(range(1, 29)) and gen.tokens[-1] == 9 and gen.n_past <= 32
    # without context shift a feed that overflows is ContextFull
    ctx.kv_clear()
    gen = Generator(ctx, pi.Sampler(params))
    gen.feed(list(range(1, 31)))
    with pytest.raises(ContextFull):
        gen.feed([7, 8, 9])


def test_main_context_shift_goes_past_the_context(tiny):
    r = run_main("-m", tiny, "-p", "hello", "-n", "80", "-c", "32", "--ignore-eos", "--temp", "0", "-t", "1")
    assert r.returncode == 0 and "context is full" in r.stderr and "--context-shift" in r.stderr
    r = run_main("-m", tiny, "-p", "hello", "-n", "80", "-c", "32", "--ignore-eos", "--temp", "0", "-t", "1",
                 "--context-shift", "--keep", "-1")
    assert r.returncode == 0, r.stderr
    assert "context is full" not in r.stderr
    assert re.search(r"sample time = .* /\s+80 runs", r.stderr), r.stderr


# ------------------------------------------------------------------------------------------ interactive
def test_interactive_input_starts_on_its_own_line(tiny):
    r = run_main("-m", tiny, "-i", "-p", "hello", "-n", "3", "--temp", "0", "-t", "1", input="more\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n> ") == 2, repr(r.stdout)   # after the first reply, and after the second


@pytest.mark.parametrize("threads", [1, 3])
def test_ctrl_c_at_the_input_prompt_exits(tiny, threads):
    """With worker threads too (Linux delivers the process's SIGINT to the main thread, whose read it
    interrupts)."""
    proc = subprocess.Popen([sys.executable, str(MAIN), "-m", str(tiny), "--interactive-first", "-t", str(threads)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    seen = bytearray()
    ready = threading.Event()

    def reader():
        while not ready.is_set():
            b = proc.stdout.read(1)
            if not b:
                break
            seen.extend(b)
            if seen.endswith(b"> "):
                ready.set()
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    with reaped(proc):
        assert ready.wait(60), seen
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Interrupted by user" in err and "Traceback" not in err


def test_system_prompt_and_chat_template_files(tmp_path, tiny_model):
    """-sysf / --chat-template-file: the same as the text flags; a missing file or both forms: error 1."""
    import subprocess
    import sys
    from pathlib import Path
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"
    model = str(tiny_model("q8_0", seed=3))
    tpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
    (tmp_path / "sys.txt").write_text("Be terse.", encoding="utf-8")
    (tmp_path / "tpl.jinja").write_text(tpl, encoding="utf-8")

    def run(*extra):
        return subprocess.run([sys.executable, str(main), "-m", model, "-cnv", "-st", "-p", "hi", "-n", "6", "--temp",
                               "0", "--verbose-prompt", *extra], capture_output=True, text=True, timeout=120,
                              input="")
    a = run("-sys", "Be terse.", "--chat-template", tpl)
    b = run("-sysf", str(tmp_path / "sys.txt"), "--chat-template-file", str(tmp_path / "tpl.jinja"))
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout == b.stdout
    (tmp_path / "raise.jinja").write_text("{{ raise_exception('from the template file') }}", encoding="utf-8")
    c = run("--chat-template-file", str(tmp_path / "raise.jinja"))
    assert c.returncode == 1 and "from the template file" in c.stderr        # the file's template is the one used
    bad = run("-sysf", str(tmp_path / "missing.txt"))
    assert bad.returncode == 1 and "-sysf" in bad.stderr
    bad = run("-sys", "x", "-sysf", str(tmp_path / "sys.txt"))
    assert bad.returncode == 1 and "not both" in bad.stderr
