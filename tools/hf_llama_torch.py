#!/usr/bin/env python3
"""A small, readable float32 torch implementation of a Hugging Face llama-family causal LM,
with per-layer hooks for activation profiling and predictor training.

Offline tool only: the inference path of PowerInfer-py never imports this (or torch).
Used by ``tools/profile_activations.py`` and ``tools/train_predictor.py``.

Checkpoint directory (HF layout):
  config.json            model_type "llama" (or "mistral", ...) or "bamboo"; hidden_size,
                         intermediate_size, num_hidden_layers, num_attention_heads,
                         num_key_value_heads (default = heads), head_dim (default
                         hidden/heads), rms_norm_eps, rope_theta (10000), rope_scaling
                         (None or linear), hidden_act (relu | silu | gelu[_new | _pytorch_tanh]), tie_word_embeddings
  weights                model.safetensors, sharded model-*.safetensors (with or without the
                         .index.json), else pytorch_model.bin / pytorch_model-*.bin (torch.load)
  tokenizer.model        sentencepiece model (used by the tools, not by the model)

The math (HF ``LlamaForCausalLM``; every tensor is float32, shapes [T, ...] for one sequence):
  x = embed_tokens[tokens]
  per layer:
    a = rmsnorm(x) * input_layernorm             rmsnorm(x) = x / sqrt(mean(x^2) + eps)
    q, k, v = a Wq^T, a Wk^T, a Wv^T              (optional biases when the checkpoint has them)
    RoPE in HF "rotate_half" convention on q and k, per head:
        inv_freq[j] = rope_theta^(-2j/head_dim),  j < head_dim/2
        angle[t, j] = (pos[t] / factor) * inv_freq[j]       (factor: linear rope_scaling, else 1)
        cos/sin = cat([angle, angle]) ; q <- q*cos + rotate_half(q)*sin,
        rotate_half([x1, x2]) = [-x2, x1]  (the halves of the head vector)
    causal attention with scale 1/sqrt(head_dim); GQA: query head h reads kv head
        h // (n_head / n_head_kv)
    ffn_inp = x + o_proj(attention)              <- the predictor input (spec 4.1: BEFORE ffn_norm)
    f = rmsnorm(ffn_inp) * post_attention_layernorm
    llama:  h = act(gate(f)) * up(f)             act = config.hidden_act
    bamboo: h = relu(gate(f)) * relu(up(f))      (dReLU, whatever hidden_act says)
    x = ffn_inp + down(h)
  logits = lm_head(rmsnorm(x) * norm)            lm_head = embed_tokens when tie_word_embeddings

"Neuron i is active for token t" (what PowerInfer's predictor must predict):
    llama:  act(gate f)[t, i] != 0               (for relu: gate f > 0; the gate decides even if
                                                  up f happens to be exactly 0)
    bamboo: relu(gate f)[t, i] > 0 and relu(up f)[t, i] > 0
For non-ReLU activations (silu, gelu) the same rule gives an almost all-active mask: such
models are not sparse, PowerInfer's sparse mode needs ReLU.

Hooks: ``model.forward(tokens, ffn_hook=fn)`` calls ``fn(layer, ffn_inp, h, active)`` once per
layer with ffn_inp [T, n_embd] float32, h [T, n_ff] float32 and active [T, n_ff] bool.
"""
from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch


class ToolError(Exception):
    """A user-facing error: the tools print it as one line and exit non-zero."""


# --------------------------------------------------------------------------------------
# config and weights
# --------------------------------------------------------------------------------------

@dataclass
class LlamaConfig:
    model_type: str
    vocab_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    norm_eps: float
    rope_theta: float
    rope_scale: float      # positions are divided by this (linear rope_scaling factor), 1 = none
    hidden_act: str        # activation of the gate; "relu" for bamboo (dReLU)
    tie_word_embeddings: bool
    bos_token_id: Optional[int]

    @property
    def is_drelu(self) -> bool:
        return self.model_type == "bamboo"

    @classmethod
    def from_dict(cls, cfg: dict) -> "LlamaConfig":
        try:
            n_embd = int(cfg["hidden_size"])
            n_head = int(cfg["num_attention_heads"])
            model_type = str(cfg.get("model_type", "llama"))
            rope_scale = 1.0
            rs = cfg.get("rope_scaling")
            if rs:
                kind = rs.get("type", rs.get("rope_type", "linear"))
                if kind == "linear":
                    rope_scale = float(rs["factor"])
                elif kind != "default":
                    raise ToolError(f"rope_scaling type {kind!r} is not supported (only linear)")
            act = str(cfg.get("hidden_act", "silu")).lower()
            if model_type == "bamboo":
                act = "relu"
            if act not in _ACTIVATIONS:
                raise ToolError(f"hidden_act {act!r} is not supported "
                                f"(expected one of {', '.join(_ACTIVATIONS)})")
            n_head_kv = int(cfg.get("num_key_value_heads") or n_head)
            if n_head % n_head_kv:
                raise ToolError(f"num_attention_heads {n_head} is not a multiple of "
                                f"num_key_value_heads {n_head_kv}")
            bos = cfg.get("bos_token_id")
            return cls(
                model_type=model_type,
                vocab_size=int(cfg["vocab_size"]),
                n_embd=n_embd,
                n_ff=int(cfg["intermediate_size"]),
                n_layer=int(cfg["num_hidden_layers"]),
                n_head=n_head,
                n_head_kv=n_head_kv,
                head_dim=int(cfg.get("head_dim") or n_embd // n_head),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rope_scale=rope_scale,
                hidden_act=act,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                bos_token_id=int(bos) if isinstance(bos, int) else None,
            )
        except KeyError as e:
            raise ToolError(f"config.json lacks {e.args[0]!r}") from None


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "swish": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,            # HF "gelu" is the exact (erf) one
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
}


def _weight_files(model_dir: str) -> tuple[str, list[str]]:
    """("safetensors" | "torch", files) for the checkpoint in model_dir."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return "safetensors", [os.path.join(model_dir, s) for s in shards]
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(single):
        return "safetensors", [single]
    shards = sorted(glob.glob(os.path.join(model_dir, "model-*-of-*.safetensors")))
    if shards:
        return "safetensors", shards
    index = os.path.join(model_dir, "pytorch_model.bin.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return "torch", [os.path.join(model_dir, s) for s in shards]
    single = os.path.join(model_dir, "pytorch_model.bin")
    if os.path.isfile(single):
        return "torch", [single]
    shards = sorted(glob.glob(os.path.join(model_dir, "pytorch_model-*-of-*.bin")))
    if shards:
        return "torch", shards
    raise ToolError(f"no model.safetensors / model-*.safetensors / pytorch_model*.bin in {model_dir}")


def load_state_dict(model_dir: str) -> dict[str, torch.Tensor]:
    """All checkpoint tensors, as float32 (the weights of a 7B model: ~28 GB of RAM)."""
    kind, files = _weight_files(model_dir)
    out: dict[str, torch.Tensor] = {}
    for path in files:
        if kind == "safetensors":
            from safetensors.torch import load_file
            part = load_file(path, device="cpu")
        else:
            part = torch.load(path, map_location="cpu", weights_only=True)
        for name, t in part.items():
            out[name] = t.to(torch.float32) if t.is_floating_point() else t
        del part
    return out


def read_config(model_dir: str) -> dict:
    if not os.path.isdir(model_dir):
        raise ToolError(f"model directory not found: {model_dir}")
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ToolError(f"no config.json in {model_dir}")
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ToolError(f"{path}: invalid JSON ({e})") from None


# --------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------

FfnHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LlamaTorch:
    """Plain-tensor llama/bamboo forward pass (no nn.Module), float32, no KV cache."""

    def __init__(self, config: LlamaConfig, weights: dict[str, torch.Tensor]):
        self.config = config
        c = config
        w = dict(weights)
        if "model.embed_tokens.weight" not in w and "embed_tokens.weight" in w:
            w = {("model." + k if not k.startswith("lm_head") else k): v for k, v in w.items()}

        def take(name: str, shape: Sequence[int], optional: bool = False) -> Optional[torch.Tensor]:
            t = w.get(name)
            if t is None:
                if optional:
                    return None
                raise ToolError(f"checkpoint lacks tensor {name}")
            if tuple(t.shape) != tuple(shape):
                raise ToolError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
            return t.to(torch.float32).contiguous()

        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self.embed = take("model.embed_tokens.weight", (c.vocab_size, c.n_embd))
        self.norm = take("model.norm.weight", (c.n_embd,))
        head = None if c.tie_word_embeddings else take("lm_head.weight", (c.vocab_size, c.n_embd), True)
        self.lm_head = self.embed if head is None else head
        self.layers = []
        for i in range(c.n_layer):
            p = f"model.layers.{i}."
            self.layers.append({
                "attn_norm": take(p + "input_layernorm.weight", (c.n_embd,)),
                "wq": take(p + "self_attn.q_proj.weight", (q_dim, c.n_embd)),
                "wk": take(p + "self_attn.k_proj.weight", (kv_dim, c.n_embd)),
                "wv": take(p + "self_attn.v_proj.weight", (kv_dim, c.n_embd)),
                "wo": take(p + "self_attn.o_proj.weight", (c.n_embd, q_dim)),
                "bq": take(p + "self_attn.q_proj.bias", (q_dim,), True),
                "bk": take(p + "self_attn.k_proj.bias", (kv_dim,), True),
                "bv": take(p + "self_attn.v_proj.bias", (kv_dim,), True),
                "bo": take(p + "self_attn.o_proj.bias", (c.n_embd,), True),
                "ffn_norm": take(p + "post_attention_layernorm.weight", (c.n_embd,)),
                "gate": take(p + "mlp.gate_proj.weight", (c.n_ff, c.n_embd)),
                "up": take(p + "mlp.up_proj.weight", (c.n_ff, c.n_embd)),
                "down": take(p + "mlp.down_proj.weight", (c.n_embd, c.n_ff)),
            })
        self.act = _ACTIVATIONS[c.hidden_act]

    @classmethod
    def from_pretrained(cls, model_dir: str) -> "LlamaTorch":
        config = LlamaConfig.from_dict(read_config(model_dir))
        return cls(config, load_state_dict(model_dir))

    # ---- building blocks -------------------------------------------------------------

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [T, heads, head_dim] rotated by positions pos [T] (HF rotate_half convention)."""
        d = self.config.head_dim
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angle = (pos.to(torch.float64) / self.config.rope_scale)[:, None] * inv_freq[None, :]
        emb = torch.cat([angle, angle], dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
        return x * cos + rotate_half(x) * sin

    def attention(self, L: dict, a: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        c = self.config
        T = a.shape[0]

        def proj(w, b):
            y = a @ w.T
            return y if b is None else y + b
        q = proj(L["wq"], L["bq"]).view(T, c.n_head, c.head_dim)
        k = proj(L["wk"], L["bk"]).view(T, c.n_head_kv, c.head_dim)
        v = proj(L["wv"], L["bv"]).view(T, c.n_head_kv, c.head_dim)
        q, k = self.rope(q, pos), self.rope(k, pos)
        group = c.n_head // c.n_head_kv
        k = k.repeat_interleave(group, dim=1)            # [T, n_head, head_dim]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(c.head_dim)
        causal = pos[None, :] <= pos[:, None]             # key j visible to query i
        scores = scores.masked_fill(~causal[None], float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, c.n_head * c.head_dim)
        out = out @ L["wo"].T
        return out if L["bo"] is None else out + L["bo"]

    def ffn_hidden(self, L: dict, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h [T, n_ff], active mask [T, n_ff]) for the normed FFN input f."""
        g = self.act(f @ L["gate"].T)
        u = f @ L["up"].T
        if self.config.is_drelu:
            u = torch.relu(u)
            return g * u, (g != 0) & (u != 0)
        return g * u, g != 0

    # ---- forward -------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, tokens, ffn_hook: Optional[FfnHook] = None,
                n_layers: Optional[int] = None, logits: bool = True) -> Optional[torch.Tensor]:
        """Logits [T, vocab] for one sequence of token ids (positions 0..T-1).

        ffn_hook(layer, ffn_inp, h, active) is called for every layer. ``n_layers`` stops after
        that many layers (no logits then), ``logits=False`` skips the output head.
        """
        c = self.config
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= c.vocab_size):
            raise ToolError(f"token id out of range for vocab_size {c.vocab_size}")
        pos = torch.arange(tokens.numel())
        x = self.embed[tokens]
        stop = c.n_layer if n_layers is None else min(n_layers, c.n_layer)
        for il in range(stop):
            L = self.layers[il]
            ffn_inp = x + self.attention(L, rms_norm(x, L["attn_norm"], c.norm_eps), pos)
            h, active = self.ffn_hidden(L, rms_norm(ffn_inp, L["ffn_norm"], c.norm_eps))
            if ffn_hook is not None:
                ffn_hook(il, ffn_inp, h, active)
            x = ffn_inp + h @ L["down"].T
        if stop < c.n_layer or not logits:
            return None
        return rms_norm(x, self.norm, c.norm_eps) @ self.lm_head.T

    __call__ = forward


def load_model(model_dir: str) -> LlamaTorch:
    return LlamaTorch.from_pretrained(model_dir)


# --------------------------------------------------------------------------------------
# text -> token windows (shared by the profiler and the predictor trainer)
# --------------------------------------------------------------------------------------

def load_tokenizer(path: str):
    """A sentencepiece processor for ``path`` (ToolError when missing or unreadable)."""
    if not os.path.isfile(path):
        raise ToolError(f"tokenizer not found: {path}")
    import sentencepiece as spm
    try:
        return spm.SentencePieceProcessor(model_file=path)
    except Exception as e:  # sentencepiece raises OSError/RuntimeError with long messages
        raise ToolError(f"cannot load sentencepiece model {path}: {str(e).splitlines()[0]}") from None


def read_text(path: str) -> str:
    if not os.path.isfile(path):
        raise ToolError(f"text file not found: {path}")
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if not text.strip():
        raise ToolError(f"text file is empty: {path}")
    return text


_CHUNK_CHARS = 1 << 20


def tokenize_text(sp, text: str, max_tokens: Optional[int] = None) -> list[int]:
    """Token ids of ``text`` without BOS/EOS.

    The text is encoded in chunks of whole lines of about 1 MiB (so a huge file is never
    encoded at once, and encoding stops once ``max_tokens`` ids are there); the ids of the
    chunks are concatenated and cut to ``max_tokens``.
    """
    ids: list[int] = []
    lines = text.splitlines(keepends=True)
    chunk: list[str] = []
    size = 0

    def flush():
        nonlocal chunk, size
        if chunk:
            ids.extend(sp.encode("".join(chunk)))
        chunk, size = [], 0

    for line in lines:
        chunk.append(line)
        size += len(line)
        if size >= _CHUNK_CHARS:
            flush()
            if max_tokens is not None and len(ids) >= max_tokens:
                break
    flush()
    return ids if max_tokens is None else ids[:max_tokens]


def bos_id(sp, config: LlamaConfig) -> Optional[int]:
    b = sp.bos_id()
    if b is not None and b >= 0:
        return int(b)
    return config.bos_token_id


def make_windows(ids: Sequence[int], ctx: int, bos: Optional[int]) -> list[list[int]]:
    """Split ids into windows of at most ``ctx`` tokens, each starting with BOS (when given):
    [BOS] + the next ctx-1 text tokens. The last window may be shorter."""
    if ctx < 2:
        raise ToolError("--ctx must be at least 2")
    step = ctx - 1 if bos is not None else ctx
    head = [bos] if bos is not None else []
    return [head + list(ids[i:i + step]) for i in range(0, len(ids), step)]


def prepare_tokens(model_dir: str, text_file: str, tokenizer: Optional[str],
                   max_tokens: Optional[int], config: LlamaConfig) -> tuple[list[int], Optional[int]]:
    """(text token ids, BOS id) for a model dir + text file, checking everything the tools need."""
    text = read_text(text_file)
    sp = load_tokenizer(tokenizer or os.path.join(model_dir, "tokenizer.model"))
    if sp.get_piece_size() > config.vocab_size:
        raise ToolError(f"tokenizer has {sp.get_piece_size()} pieces but the model's vocab_size "
                        f"is {config.vocab_size}")
    if max_tokens is not None and max_tokens <= 0:
        raise ToolError("--max-tokens must be positive")
    ids = tokenize_text(sp, text, max_tokens)
    if not ids:
        raise ToolError(f"text file gives no tokens: {text_file}")
    return ids, bos_id(sp, config)


def check_inputs(model_dir: str, text_file: str) -> None:
    """Cheap path checks done before anything heavy is loaded."""
    read_config(model_dir)
    read_text(text_file)


def error_exit(prog: str, err: BaseException) -> int:
    import sys
    msg = " ".join(str(err).split()) or type(err).__name__
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 1
