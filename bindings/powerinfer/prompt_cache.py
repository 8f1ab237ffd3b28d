"""The server's prompt cache in RAM (llama.cpp's --cache-ram): slots' prompts kept beyond their slots.

A slot holds one prompt's KV (its cache); when a request takes a slot whose cache it does not continue, that cache
would be overwritten. With a PromptCache the engine first saves it here (its tokens, the LoRA set that computed it, and
its KV state: Context.kv_seq_state), and a request whose prompt continues a saved one better than its slot's own
gets that state written back into the slot (Context.kv_seq_set_state, the region's own cells: the same bits as
evaluating them, as slot files) before its prompt is evaluated. So with more conversations than slots, a returning
conversation is served from RAM instead of evaluating its whole history again.

As llama.cpp's server_prompt_cache: an entry is kept only if no entry already holds its whole prompt (entries whose
prompt it extends are dropped), the oldest go first when the byte limit is reached, an entry is used only where it
keeps at least a quarter of its own tokens, and using an entry takes it out (it is the slot's cache again).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .request import common_prefix

MIN_KEEP = 0.25        # llama.cpp's: an entry is not worth restoring for less than a quarter of its tokens


@dataclass
class CacheEntry:
    tokens: list[int]
    lora: tuple
    state: bytes


class PromptCache:
    """Entries of (tokens, LoRA set, KV state), oldest first, at most limit_bytes of state (<= 0: no limit)."""

    def __init__(self, limit_bytes: int):
        self.limit = int(limit_bytes)
        self.entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._next = 0
        self.n_saved = self.n_restored = self.n_tokens_restored = 0

    @property
    def size_bytes(self) -> int:
        return sum(len(e.state) for e in self.entries.values())

    def holds(self, tokens: list[int], lora: tuple) -> bool:
        """Whether an entry already holds all of tokens (with the same LoRA set)."""
        return any(e.lora == lora and common_prefix(e.tokens, tokens) == len(tokens) for e in self.entries.values())

    def save(self, tokens: list[int], lora: tuple, state: bytes) -> bool:
        """Keep a slot's prompt; False where it is held already or alone exceeds the limit."""
        if not tokens or self.holds(tokens, lora) or (self.limit > 0 and len(state) > self.limit):
            return False
        for k in [k for k, e in self.entries.items()
                  if e.lora == lora and common_prefix(e.tokens, tokens) == len(e.tokens)]:
            del self.entries[k]                       # a prefix of this one: obsolete
        while self.entries and self.limit > 0 and self.size_bytes + len(state) > self.limit:
            self.entries.popitem(last=False)          # the oldest first
        self.entries[self._next] = CacheEntry(list(tokens), lora, state)
        self._next += 1
        self.n_saved += 1
        return True

    def best(self, tokens: list[int], lora: tuple, have: int, have_len: int) -> int | None:
        """The key of the entry that continues `tokens` better than a slot holding have_len tokens of which `have`
        are a prefix of them (llama.cpp's rule: a larger share of both the entry's tokens and the prompt, and at least
        MIN_KEEP of the entry's), else None."""
        keep_best = have / have_len if have_len else -1.0
        sim_best = have / max(len(tokens), 1)
        found = None
        for k, e in self.entries.items():
            if e.lora != lora:
                continue
            n = common_prefix(e.tokens, tokens)
            keep, sim = n / len(e.tokens), n / max(len(tokens), 1)
            if keep >= MIN_KEEP and keep > keep_best and sim > sim_best:
                keep_best, sim_best, found = keep, sim, k
        return found

    def take(self, key: int) -> CacheEntry:
        return self.entries.pop(key)
