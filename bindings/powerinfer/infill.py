"""Fill-in-the-middle prompts (llama.cpp's /infill): the code before and after the cursor around the model's own FIM
tokens, so that a code model (Qwen2.5-Coder, CodeLlama, StarCoder, DeepSeek-Coder, ...) writes what goes between.

The FIM tokens come from the GGUF metadata (`tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id`; CodeLlama-era
files: `tokenizer.ggml.{prefix,suffix,middle}_token_id`), else from the vocabulary by their usual spellings. The
prompt, as llama.cpp's server documents it:

    with repo-level tokens (FIM_REP and FIM_SEP, arXiv 2409.12186):
        <FIM_REP>myproject\\n<FIM_SEP>{filename}\\n{text} ... <FIM_SEP>filename\\n<FIM_PRE>{prefix}<FIM_SUF>{suffix}<FIM_MID>{prompt}
    without them:
        {extra texts, each after "\\n\\n--- snippet ---\\n\\n"}<FIM_PRE>{prefix}<FIM_SUF>{suffix}<FIM_MID>{prompt}

(BOS first where the tokenizer adds one, after the extra context.) When the whole does not fit the token budget the
extra context goes first (its oldest tokens), then the prefix's start and the suffix's end, the prefix keeping up
to three quarters of what is left, as llama.cpp's server trims.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = ["FimTokens", "InfillError", "fim_tokens", "infill_tokens"]

# the usual spellings of each FIM token, where the metadata names none (llama.cpp's vocabulary detection knows these)
SPELLINGS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>", "<｜fim▁begin｜>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>", "<｜fim▁hole｜>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>", "<｜fim▁end｜>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<repo_name>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>", "<filename>"),
}
OLD_KEYS = {"pre": "prefix", "suf": "suffix", "mid": "middle"}   # tokenizer.ggml.<old>_token_id
SNIPPET = "\n\n--- snippet ---\n\n"   # between extra chunks where the model has no file separator


class InfillError(ValueError):
    """The model cannot infill (no FIM tokens), or a request's fields are unusable."""


@dataclass(frozen=True)
class FimTokens:
    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    @property
    def usable(self) -> bool:
        return None not in (self.pre, self.suf, self.mid)


def fim_tokens(metadata: dict, tokenizer) -> FimTokens:
    """The model's FIM token ids: from the metadata, else found in the vocabulary by spelling (None where absent)."""
    n = tokenizer.n_vocab
    found, texts = {}, None
    for kind, spellings in SPELLINGS.items():
        tid = metadata.get(f"tokenizer.ggml.fim_{kind}_token_id")
        if tid is None and kind in OLD_KEYS:
            tid = metadata.get(f"tokenizer.ggml.{OLD_KEYS[kind]}_token_id")
        if tid is not None and not (isinstance(tid, numbers.Integral) and not isinstance(tid, bool) and 0 <= tid < n):
            tid = None   # out of range or not an id: as if absent
        tid = None if tid is None else int(tid)
        if tid is None:
            if texts is None:   # the special tokens' spellings, once
                texts = {tokenizer.id_to_text(i): i for i in _special_ids(tokenizer)}
            tid = next((texts[s] for s in spellings if s in texts), None)
        found[kind] = tid
    return FimTokens(**found)


def _special_ids(tokenizer) -> list[int]:
    """The ids worth looking at by spelling: control and user-defined tokens (every id where types are unknown)."""
    from .tokenizer import TOKEN_CONTROL, TOKEN_USER_DEFINED
    ids = [i for i in range(tokenizer.n_vocab) if tokenizer.token_type(i) in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    return ids or list(range(tokenizer.n_vocab))


def infill_tokens(tokenizer, fim: FimTokens, prefix: str, suffix: str, extra: list[dict] | None = None,
                  prompt: str = "", budget: int | None = None) -> list[int]:
    """The FIM prompt's tokens (module docstring), at most `budget` of them (None: no limit). extra: [{"filename":
    str, "text": str}]. Raises InfillError where the model has no FIM prefix/suffix/middle tokens or the budget cannot
    hold the FIM tokens and the prompt."""
    if not fim.usable:
        raise InfillError("this model has no fill-in-the-middle tokens (FIM prefix, suffix and middle): /infill needs a "
                          "code model trained for it")

    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=False)

    repo_level = fim.rep is not None and fim.sep is not None
    extra_toks: list[int] = []
    if repo_level:
        extra_toks += [fim.rep] + enc("myproject\n")
    for chunk in extra or []:
        if repo_level:
            extra_toks += [fim.sep] + enc(chunk.get("filename", "tmp") + "\n")
        else:
            extra_toks += enc(SNIPPET)
        extra_toks += enc(chunk.get("text", ""))
    if repo_level:
        extra_toks += [fim.sep] + enc("filename\n")
    pre, suf, tail = enc(prefix), enc(suffix), enc(prompt)
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    fixed = len(bos) + 3 + len(tail)   # BOS, FIM_PRE, FIM_SUF, FIM_MID, the prompt
    if budget is not None:
        room = budget - fixed
        if room < 0:
            raise InfillError(f"the prompt needs {fixed} tokens with the FIM tokens; the budget is {budget}")
        take_pre = min(len(pre), max(room * 3 // 4, room - len(suf)))
        take_suf = min(len(suf), room - take_pre)
        pre, suf = pre[len(pre) - take_pre:], suf[:take_suf]
        room -= take_pre + take_suf
        extra_toks = extra_toks[len(extra_toks) - min(room, len(extra_toks)):]
    return extra_toks + bos + [fim.pre] + pre + [fim.suf] + suf + [fim.mid] + tail
