"""main.py's --prompt-cache / --prompt-cache-all / --prompt-cache-ro (llama.cpp's session files), on the state-file
format of the server's slot files (powerinfer.state_file): the cached prefix is not evaluated again and the output
is the same, bit for bit."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

MAIN = Path(__file__).resolve().parents[1] / "examples" / "main.py"
PROMPT = "the cat sat on the mat and the dog sat on the log and the bird sat on the tree"


def run(model, *extra):
    return subprocess.run([sys.executable, str(MAIN), "-m", str(model), "-n", "12", "--ignore-eos", "-no-cnv",
                           "-c", "128", *extra], capture_output=True, text=True, timeout=120)


def prompt_tokens_evaluated(stderr: str) -> int:
    return int(re.search(r"prompt eval time = +[0-9.]+ ms / +([0-9]+) tokens", stderr).group(1))


@pytest.mark.parametrize("sampling", [["--temp", "0"], ["--temp", "0.8", "-s", "5"]], ids=["greedy", "seeded"])
def test_cached_prompt_is_reused_with_the_same_output(tiny_model, tmp_path, sampling):
    model, cache = tiny_model("q8_0", seed=3), tmp_path / "session.bin"
    plain = run(model, "-p", PROMPT, *sampling)
    first = run(model, "-p", PROMPT, "--prompt-cache", str(cache), *sampling)
    assert first.returncode == 0, first.stderr
    assert "session file does not exist, will create" in first.stderr and cache.exists()
    n_prompt = prompt_tokens_evaluated(first.stderr)
    second = run(model, "-p", PROMPT, "--prompt-cache", str(cache), *sampling)
    assert "exact match for prompt" in second.stderr
    assert prompt_tokens_evaluated(second.stderr) == 1            # the last prompt token again, for its logits
    assert plain.stdout == first.stdout == second.stdout
    longer = run(model, "-p", PROMPT + " and the fish", "--prompt-cache", str(cache), "--prompt-cache-ro", *sampling)
    assert prompt_tokens_evaluated(longer.stderr) == prompt_tokens_evaluated(
        run(model, "-p", PROMPT + " and the fish", *sampling).stderr) - n_prompt
    assert longer.stdout == run(model, "-p", PROMPT + " and the fish", *sampling).stdout


def test_ro_all_and_errors(tiny_model, tmp_path):
    model, cache = tiny_model("q8_0", seed=3), tmp_path / "session.bin"
    r = run(model, "-p", PROMPT, "--prompt-cache", str(cache), "--temp", "0")
    assert r.returncode == 0
    n_prompt = prompt_tokens_evaluated(r.stderr)
    saved = cache.read_bytes()
    assert run(model, "-p", "something else", "--prompt-cache", str(cache), "--prompt-cache-ro").returncode == 0
    assert cache.read_bytes() == saved                             # -ro: not updated
    r = run(model, "-p", "something else", "--prompt-cache", str(cache))
    assert "low similarity" in r.stderr and cache.read_bytes() != saved
    r = run(model, "-p", PROMPT, "--prompt-cache", str(cache), "--prompt-cache-all", "--temp", "0")
    m = re.search(r"saved session to .* \(([0-9]+) tokens\)", r.stderr)
    assert int(m.group(1)) == n_prompt + 11       # the prompt and the generated tokens evaluated (not the 12th)
    r = run(model, "-p", PROMPT, "--prompt-cache", str(cache), "--prompt-cache-all", "-i")
    assert r.returncode == 1 and "not supported in interactive mode" in r.stderr
    other = tiny_model("q8_0", seed=3, n_vocab=400)
    r = run(other, "-p", PROMPT, "--prompt-cache", str(cache))
    assert r.returncode == 1 and "not a state file of this model" in r.stderr
    cache.write_bytes(b"junk")
    r = run(model, "-p", PROMPT, "--prompt-cache", str(cache))
    assert r.returncode == 1 and "error: --prompt-cache" in r.stderr
