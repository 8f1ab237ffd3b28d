"""The server's prompt cache in RAM (llama.cpp's --cache-ram, powerinfer.prompt_cache): with more conversations than
slots, a returning prompt is written back from RAM instead of evaluated again, and the output is the same bits."""
from __future__ import annotations

import pytest

import powerinfer as pi
from powerinfer.prompt_cache import PromptCache

STORY = ("Once upon a time there was a little cat who lived in a house by the sea. Every morning the cat walked "
         "along the shore and watched the boats. ")
OTHER = "The weather report for tomorrow says rain in the north and sun in the south, with wind from the west. "


def complete(llm, prompt, n=8):
    text = llm.create_completion(prompt, max_tokens=n, temperature=0, ignore_eos=True)["choices"][0]["text"]
    return text, llm.last_result


def test_a_returning_prompt_comes_back_from_ram(tiny_model):
    path = tiny_model("q8_0", seed=3)
    plain = pi.PowerInfer(path, n_ctx=512, n_threads=1, verbose=False)              # one slot, no RAM cache
    cached = pi.PowerInfer(path, n_ctx=512, n_threads=1, verbose=False, cache_ram_mib=16)
    n_story = len(cached.tokenize(STORY))
    for llm in (plain, cached):
        complete(llm, STORY)
        complete(llm, OTHER)                  # takes the one slot: the story's KV is overwritten (saved first)
    want, res_plain = complete(plain, STORY)
    got, res = complete(cached, STORY)
    assert got == want
    assert res_plain.n_cached < 5 and res.n_cached == n_story - 1   # the last prompt token is evaluated for logits
    pc = cached.engine.prompt_cache
    assert pc.n_restored == 1 and pc.n_tokens_restored >= n_story - 1
    longer = STORY + got + " Then one day"    # a conversation that goes on
    complete(plain, OTHER)
    complete(cached, OTHER)
    want2, _ = complete(plain, longer)
    got2, res2 = complete(cached, longer)
    assert got2 == want2 and res2.n_cached >= n_story
    assert complete(cached, OTHER)[1].n_cached > len(cached.tokenize(OTHER)) // 2    # the other one came back too


def test_entries_limit_and_choice():
    pc = PromptCache(limit_bytes=100)
    assert pc.save([1, 2, 3], (), b"x" * 40)
    assert not pc.save([1, 2], (), b"x" * 10)                 # held whole by an entry already
    assert pc.save([1, 2, 3, 4], (), b"x" * 40)               # extends [1, 2, 3]: that one is dropped
    assert [e.tokens for e in pc.entries.values()] == [[1, 2, 3, 4]]
    assert pc.save([7, 8], (), b"x" * 40) and pc.save([9, 9], (), b"x" * 40)   # over 100 bytes: the oldest goes
    assert [e.tokens for e in pc.entries.values()] == [[7, 8], [9, 9]] and pc.size_bytes == 80
    assert not pc.save([5], (), b"x" * 101)                   # alone over the limit
    k = pc.best([7, 8, 1], (), 0, 0)
    assert pc.entries[k].tokens == [7, 8]
    assert pc.best([7, 8, 1], ("lora",), 0, 0) is None        # computed under other adapters
    assert pc.best([7, 8, 1], (), 2, 2) is None               # the slot holds as much already
    assert pc.save(list(range(100)), (), b"x" * 10)
    assert pc.best([0, 1, 2, 3, 50], (), 0, 0) is None        # keeps 4 of its 100 tokens: under a quarter
    assert pc.take(k).tokens == [7, 8] and k not in pc.entries


def test_flags(tiny_model):
    with pytest.raises(ValueError, match="cache_ram_mib"):
        pi.PowerInfer(tiny_model("q8_0", seed=3), n_ctx=128, verbose=False, cache_ram_mib=-2)
    from powerinfer.server.cli import parse_args
    assert parse_args(["-m", str(tiny_model("q8_0", seed=3))]).cache_ram == 8192       # llama.cpp's default
    assert parse_args(["-m", str(tiny_model("q8_0", seed=3)), "-cram", "0"]).cache_ram == 0
    with pytest.raises(SystemExit):
        parse_args(["-m", str(tiny_model("q8_0", seed=3)), "--cache-ram", "-5"])
