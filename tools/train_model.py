#!/usr/bin/env python3
"""Train the bundled small ReLU-LLaMA from scratch with torch on the CPU and save it as a
Hugging Face style llama checkpoint.

    python tools/train_model.py [--text data/corpus/train.txt] [--val data/heldout.txt]
        [--tokenizer models/tinyrelu-hf/tokenizer.model] [--out models/tinyrelu-hf]
        [--steps 640] [--stage-ends E1,..] [--batch 8] [--ctx 256] [--threads 2] [--seed 0] [--resume]
        [--n-embd 192 --n-layer 4 --n-head 6 --n-head-kv 2 --n-ff 768] [--l1 0.02] [--act relu|silu]

Model (HF ``LlamaForCausalLM`` semantics, hidden_act relu): token embedding, n_layer blocks
of [RMSNorm -> attention (RoPE, HF rotate_half convention, GQA) -> residual, RMSNorm ->
ReGLU FFN down(relu(gate x) * up x) -> residual], final RMSNorm, untied lm_head. No biases.
n_ff must be a multiple of 256 (the original hot-neuron solver) and every matrix row length a
multiple of 32 (Q4_0 blocks): the script checks both.

Data: the text is tokenized whole with the sentencepiece model (no BOS inside). A training
sample is [BOS] + ctx-1 consecutive tokens from a random offset, which is exactly how the
profiler, the predictor trainer and the perplexity tool window text. The batch of step s is
drawn from a generator seeded with (seed, s), so a resumed run sees the same batches.

Optimisation: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices only), linear warm-up then
cosine decay from --lr to --lr/10, gradient clipping at 1.0. With --stage-ends E1,E2,... the
schedule has warm restarts: for a step s the cosine runs from the warm-up's end to the first
stage end > s (so each stage ends at --lr/10, and the next one jumps back to the value of the
longer cosine at that step); a finished run can thus be continued with --resume --steps N
--stage-ends OLD_N. The bundled model is the default run (640 steps, one cycle). Loss = cross-entropy +
--l1 * mean over layers of mean(relu(gate x)) (a small L1 penalty on the ReLU gate outputs
that nudges the FFN toward sparser activations; 0 disables it). float32 throughout,
torch.manual_seed(seed), torch.set_num_threads(--threads), deterministic algorithms.

Checkpoints: every --save-every steps OUT/train_state.pt (model + optimiser + step) is
written atomically and the HF files (config.json, model.safetensors, tokenizer.model) are
refreshed, so a crash loses at most --save-every steps; --resume continues from
train_state.pt. The log prints step, loss, learning rate, tokens/s and, every --eval-every
steps, the loss / perplexity on --val and the mean FFN activation rate per layer.

    --bench 20: run 20 steps only, print the throughput, write nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def log(msg: str) -> None:
    print(msg, flush=True)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        hd = c["head_dim"]
        self.q_proj = nn.Linear(c["n_embd"], c["n_head"] * hd, bias=False)
        self.k_proj = nn.Linear(c["n_embd"], c["n_head_kv"] * hd, bias=False)
        self.v_proj = nn.Linear(c["n_embd"], c["n_head_kv"] * hd, bias=False)
        self.o_proj = nn.Linear(c["n_head"] * hd, c["n_embd"], bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        c = self.c
        hd = c["head_dim"]
        q = self.q_proj(x).view(B, T, c["n_head"], hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, c["n_head_kv"], hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c["n_head_kv"], hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = c["n_head"] // c["n_head_kv"]
        if g > 1:
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, c["n_head"] * hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["n_embd"], c["n_ff"], bias=False)
        self.up_proj = nn.Linear(c["n_embd"], c["n_ff"], bias=False)
        self.down_proj = nn.Linear(c["n_ff"], c["n_embd"], bias=False)
        self.act = {"relu": torch.relu, "silu": torch.nn.functional.silu}[c.get("act", "relu")]

    def forward(self, x):
        g = self.act(self.gate_proj(x))
        return self.down_proj(g * self.up_proj(x)), g


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["n_embd"], c["eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["n_embd"], c["eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, g = self.mlp(self.post_attention_layernorm(x))
        return x + y, g


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["n_embd"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.norm = RMSNorm(c["n_embd"], c["eps"])


class ReluLlama(nn.Module):
    """Parameter names are exactly HF LlamaForCausalLM's."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab"], bias=False)
        hd = c["head_dim"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(c["ctx"], dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], -1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * c["n_layer"]) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.model.embed_tokens(idx)
        gates = []
        for blk in self.model.layers:
            x, g = blk(x, cos, sin)
            gates.append(g)
        return self.lm_head(self.model.norm(x)), gates


# --------------------------------------------------------------------------------------

def hf_config(c) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": c.get("act", "relu"),
        "vocab_size": c["vocab"],
        "hidden_size": c["n_embd"],
        "intermediate_size": c["n_ff"],
        "num_hidden_layers": c["n_layer"],
        "num_attention_heads": c["n_head"],
        "num_key_value_heads": c["n_head_kv"],
        "head_dim": c["head_dim"],
        "max_position_embeddings": c["ctx"],
        "rms_norm_eps": c["eps"],
        "rope_theta": c["rope_theta"],
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }


def save_hf(model: ReluLlama, out: str, tokenizer: str, extra: dict) -> None:
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    tmp = os.path.join(out, "model.safetensors.tmp")
    save_file(sd, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out, "model.safetensors"))
    cfg = hf_config(model.c)
    cfg["training"] = extra
    tmp = os.path.join(out, "config.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "config.json"))
    dst = os.path.join(out, "tokenizer.model")
    if os.path.abspath(tokenizer) != os.path.abspath(dst):
        shutil.copyfile(tokenizer, dst)


def tokenize(sp, path: str) -> torch.Tensor:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # whole lines in chunks of about 1 MiB, like tools/hf_llama_torch.tokenize_text
    ids, chunk, size = [], [], 0
    for line in text.splitlines(keepends=True):
        chunk.append(line)
        size += len(line)
        if size >= 1 << 20:
            ids.extend(sp.encode("".join(chunk)))
            chunk, size = [], 0
    if chunk:
        ids.extend(sp.encode("".join(chunk)))
    return torch.tensor(ids, dtype=torch.long)


def get_batch(data: torch.Tensor, step: int, seed: int, batch: int, ctx: int, bos: int):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - ctx, (batch,), generator=g)
    rows = torch.stack([data[s:s + ctx] for s in starts.tolist()])       # ctx tokens + 1 target
    x = torch.cat([torch.full((batch, 1), bos, dtype=torch.long), rows[:, :ctx - 1]], 1)
    y = rows                                                             # next token of each x
    return x, y


@torch.no_grad()
def evaluate(model, val: torch.Tensor, ctx: int, bos: int, max_windows: int = 24):
    """Mean NLL over the second half of [BOS]+ctx-1 windows (llama.cpp perplexity style) and
    the per-layer activation rate (fraction of gate outputs > 0)."""
    model.eval()
    step = ctx - 1
    nll, n = 0.0, 0
    rates = None
    wins = [val[i:i + step] for i in range(0, len(val) - step, step)][:max_windows]
    for i in range(0, len(wins), 8):
        w = torch.stack(wins[i:i + 8])
        x = torch.cat([torch.full((w.shape[0], 1), bos, dtype=torch.long), w[:, :-1]], 1)
        logits, gates = model(x)
        lp = F.log_softmax(logits[:, ctx // 2 - 1:], -1)
        tgt = w[:, ctx // 2 - 1:]
        nll += -lp.gather(-1, tgt[..., None]).sum().item()
        n += tgt.numel()
        r = torch.stack([(g > 0).float().mean() for g in gates])
        rates = r * w.shape[0] if rates is None else rates + r * w.shape[0]
    model.train()
    return nll / max(n, 1), (rates / len(wins)).tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default="data/corpus/train.txt")
    ap.add_argument("--val", default="data/heldout.txt")
    ap.add_argument("--tokenizer", default="models/tinyrelu-hf/tokenizer.model")
    ap.add_argument("--out", default="models/tinyrelu-hf")
    ap.add_argument("--steps", type=int, default=640)
    ap.add_argument("--stage-ends", default="",
                    help="comma-separated steps where a cosine cycle ends and the next one starts "
                         "(warm restart); the last cycle ends at --steps (default: one cycle)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--l1", type=float, default=0.02, help="L1 penalty on the ReLU gate outputs (relu only)")
    ap.add_argument("--act", choices=["relu", "silu"], default="relu",
                    help="FFN activation: relu (the bundled ReLU-LLaMA) or silu (a SwiGLU llama: the dense model "
                         "tools/sparsify.py is measured on)")
    ap.add_argument("--n-embd", type=int, default=192)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-head-kv", type=int, default=2)
    ap.add_argument("--n-ff", type=int, default=768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-every", type=int, default=80)
    ap.add_argument("--eval-every", type=int, default=80)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--bench", type=int, default=0, help="time this many steps, write nothing")
    a = ap.parse_args(argv)

    import sentencepiece as spm
    if not a.bench:
        try:   # needed only at the end: say so before minutes of training, not after
            import safetensors.torch  # noqa: F401
        except ImportError:
            print("train_model: error: safetensors is not installed (pip install '.[tools]')", file=sys.stderr)
            return 1
    if not os.path.isfile(a.tokenizer):
        print(f"train_model: error: tokenizer not found: {a.tokenizer}", file=sys.stderr)
        return 1
    sp = spm.SentencePieceProcessor(model_file=a.tokenizer)
    c = dict(vocab=sp.get_piece_size(), n_embd=a.n_embd, n_layer=a.n_layer, n_head=a.n_head,
             n_head_kv=a.n_head_kv, head_dim=a.n_embd // a.n_head, n_ff=a.n_ff, ctx=a.ctx,
             eps=1e-5, rope_theta=10000.0, act=a.act)
    if a.n_ff % 256 or a.n_embd % 32 or (a.n_head * c["head_dim"]) % 32 or a.n_head % a.n_head_kv:
        print("train_model: error: n_ff must be a multiple of 256, n_embd and the attention "
              "width multiples of 32, n_head a multiple of n_head_kv", file=sys.stderr)
        return 1

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    bos = sp.bos_id()
    t0 = time.time()
    data = tokenize(sp, a.text)
    val = tokenize(sp, a.val) if a.val and os.path.isfile(a.val) else data[-50000:]
    log(f"train tokens {len(data)}, val tokens {len(val)} ({time.time() - t0:.1f}s)")

    model = ReluLlama(c)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"config {json.dumps(c)}; {n_params / 1e6:.2f}M parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    state_path = os.path.join(a.out, "train_state.pt")
    step0, elapsed0 = 0, 0.0
    if a.resume and os.path.isfile(state_path):
        st = torch.load(state_path, map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step0, elapsed0 = st["step"], st.get("elapsed", 0.0)
        log(f"resumed at step {step0}")

    total = a.bench if a.bench else a.steps
    ends = sorted({int(e) for e in a.stage_ends.split(",") if e.strip() and 0 < int(e) < total} | {total})

    def lr_at(s):
        if s < a.warmup:
            return a.lr * (s + 1) / a.warmup
        end = next(e for e in ends if s < e)
        p = min(1.0, (s - a.warmup) / max(1, end - a.warmup))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    model.train()
    t_start = time.time()
    tok_per_step = a.batch * a.ctx
    ema = None
    for s in range(step0, total):
        for gp in opt.param_groups:
            gp["lr"] = lr_at(s)
        x, y = get_batch(data, s, a.seed, a.batch, a.ctx, bos)
        logits, gates = model(x)
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        loss = ce
        if a.l1 > 0 and a.act == "relu":
            loss = ce + a.l1 * torch.stack([g.mean() for g in gates]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = ce.item() if ema is None else 0.95 * ema + 0.05 * ce.item()
        done = s + 1
        dt = time.time() - t_start
        if done % 10 == 0 or done == total:
            rate = (done - step0) * tok_per_step / dt
            log(f"step {done}/{total} loss {ce.item():.4f} (ema {ema:.4f}) lr {lr_at(s):.2e} "
                f"{rate:.0f} tok/s elapsed {(elapsed0 + dt) / 60:.1f} min")
        if a.bench:
            continue
        if done % a.eval_every == 0 or done == total:
            vl, rates = evaluate(model, val, a.ctx, bos)
            log(f"eval step {done}: val loss {vl:.4f} ppl {math.exp(vl):.2f}; "
                f"activation rate per layer {[round(r, 3) for r in rates]}")
        if done % a.save_every == 0 or done == total:
            extra = {"steps": done, "stage_ends": ends, "batch": a.batch, "ctx": a.ctx, "lr": a.lr, "l1": a.l1,
                     "seed": a.seed, "tokens_seen": done * tok_per_step,
                     "train_minutes": round((elapsed0 + dt) / 60, 1), "last_loss_ema": round(ema, 4)}
            save_hf(model, a.out, a.tokenizer, extra)
            tmp = state_path + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": done,
                        "elapsed": elapsed0 + dt, "config": c}, tmp)
            os.replace(tmp, state_path)
            log(f"saved step {done} -> {a.out}")
    if a.bench:
        dt = time.time() - t_start
        log(f"bench: {a.bench} steps, {a.bench * tok_per_step / dt:.0f} tok/s, "
            f"{dt / a.bench:.2f} s/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
