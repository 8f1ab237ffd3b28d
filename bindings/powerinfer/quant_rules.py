"""Which type each tensor of a file gets when it is quantized: llama.cpp's rules (src/llama-quant.cpp,
tensor_allows_quantization, llama_tensor_get_type and its _impl, tensor_type_fallback; the file types of
tools/quantize/quantize.cpp), re-derived for the file types this package can write (tools/quantize.py,
powerinfer.quantize writes the file).

    types = plan_types(tensors, hparams, QuantOptions(ftype=FTYPE["Q4_K_M"]))

The order matters: llama.cpp's counters (i_attention_wv, i_ffn_down: the "use_more_bits" layers of Q4_K_M's attn_v and
ffn_down) advance in the order of its weights map, which `llama_order` gives (layer, then name). The branches of the
IQ file types are left out (those files are refused: FTYPE_REFUSED); Q2_K_S's and has_imatrix's (the Q4_0 / Q5_0
ffn_down guard) are in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# ggml type ids and ggml_type_name (ggml/include/ggml.h, ggml/src/ggml.c)
GGML_TYPE_NAMES = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1", 10: "q2_K", 11: "q3_K",
    12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K", 16: "iq2_xxs", 17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s",
    20: "iq4_nl", 21: "iq3_s", 22: "iq2_s", 23: "iq4_xs", 24: "i8", 25: "i16", 26: "i32", 27: "i64", 28: "f64",
    29: "iq1_m", 30: "bf16", 34: "tq1_0", 35: "tq2_0", 39: "mxfp4", 40: "nvfp4", 41: "q1_0", 42: "q2_0",
}
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, MXFP4 = 20, 23, 18, 21, 39
# elements per block (ggml_blck_size) of the types above; 1 for the float types
BLOCK_SIZE = {F32: 1, F16: 1, BF16: 1, Q4_0: 32, Q4_1: 32, Q5_0: 32, Q5_1: 32, Q8_0: 32,
              Q2_K: 256, Q3_K: 256, Q4_K: 256, Q5_K: 256, Q6_K: 256, IQ4_NL: 32, IQ4_XS: 256, IQ3_XXS: 256,
              IQ3_S: 256, MXFP4: 32}
# the types this package writes: pi_quantize_rows_imatrix's quantizers, which are llama.cpp's bit for bit (its
# reference ones without an importance matrix, quantize_row_*_impl with one; the IQ types: quantize_iq4_nl, _iq4_xs,
# _iq3_xxs, _iq3_s; MXFP4 its reference quantizer, with or without one, as quantize_mxfp4)
WRITABLE = frozenset(BLOCK_SIZE)
FLOAT_TYPES = frozenset({F32, F16, BF16})
_BLOCK_SIZE_OTHER = {9: 32, 15: 256, 16: 256, 17: 256, 19: 256, 22: 256,
                     29: 256, 34: 256, 35: 256, 39: 32, 40: 64, 41: 128, 42: 64}


def block_size(t: int) -> int:
    return BLOCK_SIZE.get(t) or _BLOCK_SIZE_OTHER.get(t, 1)


def is_quantized(t: int) -> bool:
    """ggml_is_quantized: a block type (the float and integer types are not)."""
    return block_size(t) > 1 or t in (9, 15)


def type_name(t: int) -> str:
    return GGML_TYPE_NAMES.get(t, f"type {t}")


def parse_ggml_type(s: str) -> int | None:
    """A ggml type by its name, any case (llama-quantize's parse_ggml_type); None when there is none."""
    for t, name in GGML_TYPE_NAMES.items():
        if name.lower() == s.lower():
            return t
    return None


# llama_ftype ids (include/llama.h)
FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
         "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18,
         "IQ2_XXS": 19, "IQ2_XS": 20, "Q2_K_S": 21, "IQ3_XS": 22, "IQ3_XXS": 23, "IQ1_S": 24, "IQ4_NL": 25,
         "IQ3_S": 26, "IQ3_M": 27, "IQ2_S": 28, "IQ2_M": 29, "IQ4_XS": 30, "IQ1_M": 31, "BF16": 32, "TQ1_0": 36,
         "TQ2_0": 37, "MXFP4_MOE": 38, "Q1_0": 40, "Q2_0": 41}
LLAMA_FTYPE_GUESSED = 1024

# llama-quantize's QUANT_OPTIONS, in its order (a number names the first entry of that id: 15 is "Q4_K")
QUANT_OPTIONS = [
    ("Q1_0", 40), ("Q2_0", 41), ("Q4_0", 2), ("Q4_1", 3), ("MXFP4_MOE", 38), ("Q5_0", 8), ("Q5_1", 9),
    ("IQ2_XXS", 19), ("IQ2_XS", 20), ("IQ2_S", 28), ("IQ2_M", 29), ("IQ1_S", 24), ("IQ1_M", 31), ("TQ1_0", 36),
    ("TQ2_0", 37), ("Q2_K", 10), ("Q2_K_S", 21), ("IQ3_XXS", 23), ("IQ3_S", 26), ("IQ3_M", 27), ("Q3_K", 12),
    ("IQ3_XS", 22), ("Q3_K_S", 11), ("Q3_K_M", 12), ("Q3_K_L", 13), ("IQ4_NL", 25), ("IQ4_XS", 30), ("Q4_K", 15),
    ("Q4_K_S", 14), ("Q4_K_M", 15), ("Q5_K", 17), ("Q5_K_S", 16), ("Q5_K_M", 17), ("Q6_K", 18), ("Q8_0", 7),
    ("F16", 1), ("BF16", 32), ("F32", 0), ("COPY", 0),
]

# llama_ftype_get_default_type of the file types written here
DEFAULT_TYPE = {0: F32, 1: F16, 2: Q4_0, 3: Q4_1, 7: Q8_0, 8: Q5_0, 9: Q5_1, 10: Q2_K, 11: Q3_K, 12: Q3_K, 13: Q3_K,
                14: Q4_K, 15: Q4_K, 16: Q5_K, 17: Q5_K, 18: Q6_K, 21: Q2_K, 22: IQ3_S, 25: IQ4_NL, 26: IQ3_S,
                27: IQ3_S, 30: IQ4_XS, 32: BF16, 38: MXFP4}

_IMATRIX = "needs an importance matrix and quantizers (IQ1 / IQ2) this core does not have"
_NO_QUANTIZER = "has no quantizer in this core (files of it are read, not written)"
FTYPE_REFUSED = {
    "IQ2_XXS": _IMATRIX, "IQ2_XS": _IMATRIX, "IQ2_S": _IMATRIX, "IQ2_M": _IMATRIX,
    "IQ1_S": _IMATRIX, "IQ1_M": _IMATRIX,
    "IQ3_XXS": "puts attn_q / attn_k in IQ2_S, which " + _NO_QUANTIZER,
    "TQ1_0": _NO_QUANTIZER, "TQ2_0": _NO_QUANTIZER,
    "Q1_0": _NO_QUANTIZER, "Q2_0": _NO_QUANTIZER,
}


def parse_ftype(s: str) -> tuple[str, int] | None:
    """(name, llama_ftype) of a file type given by name (any case) or number, as llama-quantize's try_parse_ftype;
    None when it is neither."""
    for name, ft in QUANT_OPTIONS:
        if name.lower() == s.lower():
            return name, ft
    m = re.match(r"\s*([+-]?\d+)", s)   # std::stoi: leading blanks, a sign, digits (what follows is ignored)
    if not m:
        return None
    n = int(m.group(1))
    for name, ft in QUANT_OPTIONS:
        if ft == n:
            return name, ft
    return None


@dataclass
class HParams:
    """What llama.cpp's rules read of the model: the architecture, block_count (n_layer_all), layer 0's head
    counts, expert_count, and whether its loader calls the model 70B (llama / qwen2 / olmo / deci of 80 layers
    (llama: with GQA), jais2 of 68)."""
    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0

    @classmethod
    def from_metadata(cls, meta: dict) -> "HParams":
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise ValueError("the file has no general.architecture")
        n_layer = meta.get(f"{arch}.block_count")
        if not isinstance(n_layer, int) or isinstance(n_layer, bool) or n_layer <= 0:
            raise ValueError(f"the file has no valid {arch}.block_count")

        def first(key, default):
            v = meta.get(key, default)
            if isinstance(v, (list, tuple)):
                v = v[0] if len(v) else default
            return int(v)
        n_head = first(f"{arch}.attention.head_count", 0)
        n_head_kv = first(f"{arch}.attention.head_count_kv", n_head)
        return cls(arch, n_layer, n_head, n_head_kv, first(f"{arch}.expert_count", 0))

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        if self.arch == "llama":
            return self.n_expert != 8 and self.n_layer == 80 and self.n_head != self.n_head_kv
        if self.arch in ("qwen2", "olmo", "deci"):
            return self.n_layer == 80
        return self.arch == "jais2" and self.n_layer == 68


@dataclass
class QuantOptions:
    """llama_model_quantize_params: ftype (a llama_ftype of DEFAULT_TYPE), output_tensor_type /
    token_embedding_type (ggml types or None), tensor_types ([(pattern, ggml type)], --tensor-type, searched as a
    regex in the name, the first match wins), pure, quantize_output_tensor (not --leave-output-tensor), only_copy
    (COPY). pwri: the file is a PowerInfer one, whose predictors (fc1, fc2) keep their type unless a tensor_types
    pattern names them."""
    ftype: int
    output_tensor_type: int | None = None
    token_embedding_type: int | None = None
    tensor_types: list = field(default_factory=list)
    pure: bool = False
    quantize_output_tensor: bool = True
    only_copy: bool = False
    pwri: bool = False
    has_imatrix: bool = False   # llama.cpp's qs.has_imatrix: an importance matrix is given (--imatrix)


# categories (tensor_get_category)
TOKEN_EMBD, ATTN_Q, ATTN_V, ATTN_K, ATTN_QKV, ATTN_KV_B, ATTN_OUTPUT, FFN_UP, FFN_GATE, FFN_DOWN, OUTPUT, OTHER = \
    range(12)


def category(name: str) -> int:
    if name == "output.weight":
        return OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return TOKEN_EMBD
    for part, cat in (("attn_qkv.weight", ATTN_QKV), ("attn_kv_b.weight", ATTN_KV_B), ("attn_v.weight", ATTN_V),
                      ("attn_k.weight", ATTN_K), ("attn_q.weight", ATTN_Q), ("attn_output.weight", ATTN_OUTPUT),
                      ("ffn_up", FFN_UP), ("ffn_gate", FFN_GATE), ("ffn_down", FFN_DOWN)):
        if part in name:
            return cat
    return OTHER


def _is_attn_v(cat: int) -> bool:
    return cat in (ATTN_V, ATTN_QKV, ATTN_KV_B)


_LAYER = re.compile(rb"blk\.\s*([+-]?\d+)")


def layer_of(name: str) -> int | None:
    """sscanf(name, "blk.%d.", &il): the layer number, None when the name does not start so."""
    m = _LAYER.match(name.encode())
    return int(m.group(1)) if m else None


def llama_order(names):
    """The names in llama.cpp's weights-map order (weight_name_comparer): tensors of no layer first, then by layer,
    each group by name (bytewise)."""
    def key(n):
        il = layer_of(n)
        return (-1 if il is None else il, n.encode())
    return sorted(names, key=key)


def n_dims(ne) -> int:
    """ggml_n_dims: the dimensions up to the last one above 1 (at least 1)."""
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return max(n, 1)


_NOT_QUANTIZED_PARTS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
    "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
    "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_",
    ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_GLM5_NEXT_PARTS = ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
                    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
                    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight")
_PREDICTOR = re.compile(r"(^|\.)fc[12]\.weight$")


def allows_quantization(name: str, ne, arch: str, opts: QuantOptions) -> bool:
    """tensor_allows_quantization: matrices (2-D and 3-D) named *weight, but for norms, the output with
    --leave-output-tensor, MoE routers, positional and token-type embeddings and the other small tensors llama.cpp
    names."""
    if opts.only_copy or n_dims(ne) < 2 or not name.endswith("weight"):
        return False
    if not opts.quantize_output_tensor and name == "output.weight":
        return False
    if name in ("position_embd.weight", "token_types.weight"):   # LLM_TN(arch)(POS_EMBD / TOKEN_TYPES)
        return False
    if any(p in name for p in _NOT_QUANTIZED_PARTS):
        return False
    if arch == "glm5-next" and any(p in name for p in _GLM5_NEXT_PARTS):
        return False
    return True


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


class _Chooser:
    """llama_tensor_get_type over the tensors in llama_order, with quantize_state_impl's counters."""

    def __init__(self, names, hp: HParams, opts: QuantOptions):
        self.hp, self.opts = hp, opts
        self.default = DEFAULT_TYPE[opts.ftype] if not opts.only_copy else F32
        self.patterns = [(re.compile(p), t) for p, t in opts.tensor_types]
        self.n_attention_wv = sum(_is_attn_v(category(n)) for n in names)
        self.has_tied_embeddings = "output.weight" not in names
        self.n_ffn_down = self.n_ffn_gate = self.n_ffn_up = hp.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.n_fallback = 0
        self.fallbacks: list[str] = []

    def _manual(self, name: str):
        for pat, t in self.patterns:
            if pat.search(name):
                return t
        return None

    def get_type(self, name: str, ne, cur_type: int) -> int:
        opts, cat = self.opts, category(name)
        if opts.pwri and _PREDICTOR.search(name):
            manual = self._manual(name) if not opts.only_copy and n_dims(ne) >= 2 else None
            return cur_type if manual is None else self._fallback(name, ne, manual)
        if not allows_quantization(name, ne, self.hp.arch, opts):
            return cur_type
        if opts.token_embedding_type is not None and cat == TOKEN_EMBD:
            if not (name == "per_layer_token_embd.weight" and self._manual(name) is not None):
                return opts.token_embedding_type
        if opts.output_tensor_type is not None and cat == OUTPUT:
            return opts.output_tensor_type
        new_type = self.default
        if is_quantized(self.default):
            manual = self._manual(name)
            if manual is not None:
                new_type = manual
            elif not opts.pure:
                new_type = self._impl(new_type, name, ne, cat)
            new_type = self._fallback(name, ne, new_type)
        return new_type

    def _layer_info(self, i_layer: int, n_layer: int, name: str) -> tuple[int, int]:
        if max(1, self.hp.n_expert) > 1:   # experts' tensors are not in layer order: the layer is in the name
            il = layer_of(name)
            if il is None:
                raise ValueError(f"Failed to determine layer for tensor {name}")
            if il < 0 or il >= n_layer:
                raise ValueError(f"Bad layer {il} for tensor {name}. Must be in [0, {n_layer})")
            i_layer = il
        return i_layer, n_layer

    def _impl(self, new_type: int, name: str, ne, cat: int) -> int:
        ft, hp, arch, F = self.opts.ftype, self.hp, self.hp.arch, FTYPE
        falcon = arch == "falcon"
        if arch == "glm5-next" and any(p in name for p in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
            if new_type not in (F32, BF16, F16):
                return Q8_0
        if cat == OUTPUT or (self.has_tied_embeddings and cat == TOKEN_EMBD):
            if self.opts.output_tensor_type is not None:
                new_type = self.opts.output_tensor_type
            elif ft == F["MXFP4_MOE"] or falcon or ne[0] % block_size(new_type) != 0:
                new_type = Q8_0
            elif new_type != Q8_0:
                new_type = Q6_K
        elif ft == F["MXFP4_MOE"]:   # the experts' tensors MXFP4 (bailingmoe3: its FFN experts only), the rest Q8_0
            expert = len(ne) > 2 and ne[2] > 1
            if arch == "bailingmoe3":
                expert = expert and cat in (FFN_UP, FFN_GATE, FFN_DOWN)
            new_type = MXFP4 if expert else Q8_0
        elif cat == TOKEN_EMBD:
            if self.opts.token_embedding_type is not None:
                new_type = self.opts.token_embedding_type
        elif _is_attn_v(cat):
            if ft == F["Q2_K"]:
                new_type = Q4_K if hp.n_gqa >= 4 else Q3_K
            elif ft == F["Q2_K_S"] and hp.n_gqa >= 4:
                new_type = Q4_K
            elif ft == F["Q3_K_M"]:
                new_type = Q5_K if self.i_attention_wv < 2 else Q4_K
            elif ft == F["Q3_K_L"]:
                new_type = Q5_K
            elif ft in (F["IQ3_XS"], F["IQ3_S"]) and hp.n_gqa >= 4:
                new_type = Q4_K
            elif ft == F["IQ3_M"]:
                new_type = Q4_K
            elif ft in (F["IQ4_NL"], F["IQ4_XS"]) and hp.n_gqa >= 4:
                new_type = Q5_K
            elif ft in (F["Q4_K_M"], F["Q5_K_M"]) and _use_more_bits(self.i_attention_wv, self.n_attention_wv):
                new_type = Q6_K
            elif ft == F["Q4_K_S"] and self.i_attention_wv < 4:
                new_type = Q5_K
            if hp.is_70b and new_type in (Q3_K, Q4_K):
                new_type = Q5_K
            if hp.n_expert == 8:
                new_type = Q8_0
            self.i_attention_wv += 1
        elif cat == ATTN_K:
            if hp.n_expert == 8:
                new_type = Q8_0
            elif ft == F["IQ3_XS"]:
                new_type = IQ3_XXS
        elif cat == ATTN_Q:
            if ft == F["IQ3_XS"]:
                new_type = IQ3_XXS
        elif cat == FFN_DOWN:
            i_layer, n_layer = self._layer_info(self.i_ffn_down, self.n_ffn_down, name)
            if ft == F["Q2_K"]:
                new_type = Q3_K
            elif ft == F["Q2_K_S"]:
                if i_layer < n_layer // 8:
                    new_type = Q4_K
            elif ft == F["Q3_K_M"]:
                new_type = (Q5_K if i_layer < n_layer // 16 else
                            Q4_K if not falcon or _use_more_bits(i_layer, n_layer) else Q3_K)
            elif ft == F["IQ3_M"] and (i_layer < n_layer // 8
                                       or (hp.n_expert == 8 and _use_more_bits(i_layer, n_layer))):
                new_type = Q4_K
            elif ft == F["Q3_K_L"]:
                new_type = Q4_K if falcon else Q5_K
            elif ft == F["Q4_K_M"]:
                if falcon:
                    new_type = (Q6_K if i_layer < n_layer // 16 else
                                Q5_K if _use_more_bits(i_layer, n_layer) else Q4_K)
                elif _use_more_bits(i_layer, n_layer):
                    new_type = Q6_K
            elif i_layer < n_layer // 8 and ft in (F["IQ4_NL"], F["IQ4_XS"]) and not self.opts.has_imatrix:
                new_type = Q5_K
            elif ft == F["Q5_K_M"] and _use_more_bits(i_layer, n_layer):
                new_type = Q6_K
            elif ft == F["Q4_K_S"] and not falcon and i_layer < n_layer // 8:
                new_type = Q5_K
            elif ft in (F["Q4_0"], F["Q5_0"]) and self.opts.has_imatrix and i_layer < n_layer // 8:
                # llama.cpp guards the first ffn_down layers of Q4_0 / Q5_0 when it has an imatrix
                new_type = Q4_1 if ft == F["Q4_0"] else Q5_1
            self.i_ffn_down += 1
        elif cat == ATTN_OUTPUT:
            if not falcon:
                if hp.n_expert == 8:
                    if ft in (F["Q2_K"], F["Q3_K_S"], F["Q3_K_M"], F["Q4_K_S"], F["Q4_K_M"], F["IQ4_NL"], F["IQ4_XS"],
                              F["IQ3_XS"], F["IQ3_S"], F["IQ3_M"]):
                        new_type = Q5_K
                elif ft == F["Q2_K"]:
                    new_type = Q3_K
                elif ft == F["Q3_K_M"]:
                    new_type = Q4_K
                elif ft == F["Q3_K_L"]:
                    new_type = Q5_K
                elif ft == F["IQ3_M"]:
                    new_type = Q4_K
            elif ft == F["Q3_K_L"]:
                new_type = Q4_K
        # (llama.cpp's ATTENTION_QKV branch after this one is never reached: attn_qkv is attn_v-like above)
        elif cat in (FFN_GATE, FFN_UP):
            gate = cat == FFN_GATE
            i_layer, n_layer = self._layer_info(self.i_ffn_gate if gate else self.i_ffn_up,
                                                self.n_ffn_gate if gate else self.n_ffn_up, name)
            if ft == F["IQ3_XS"] and n_layer // 8 <= i_layer < 7 * n_layer // 8:
                new_type = IQ3_XXS
            if gate:
                self.i_ffn_gate += 1
            else:
                self.i_ffn_up += 1
        return new_type

    def _fallback(self, name: str, ne, target: int) -> int:
        """tensor_type_fallback: a type whose blocks fit rows of ne[0] elements."""
        ncols, qk = ne[0], block_size(target)
        if ncols % qk == 0:
            return target
        self.n_fallback += 1
        ret = {Q2_K: Q4_0, Q3_K: Q4_0, Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0,
               16: 20, 17: 20, 18: 20, 19: 20, 29: 20, 21: 20, 22: 20, 23: 20, 34: Q4_0, 35: Q4_0, 42: Q4_0
               }.get(target)
        if ret is None:
            if qk > 32:
                raise ValueError(f"no tensor type fallback is defined for type {type_name(target)}")
            ret = target
        if ncols % block_size(ret) != 0:
            ret = F16
        self.fallbacks.append(f"{name}: ncols {ncols} not divisible by {qk} (required for type {type_name(target)}) "
                              f"-> falling back to {type_name(ret)}")
        return ret


IMATRIX_TYPES = frozenset({16, 17, 18, 19, 22, 29})   # IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ2_S, IQ1_M


def requires_imatrix(name: str, t: int, ftype: int) -> bool:
    """tensor_requires_imatrix: the very low-bit types (and Q2_K in a Q2_K_S file), not for token_embd / output."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return t in IMATRIX_TYPES or (t == Q2_K and ftype == FTYPE["Q2_K_S"])


def plan_types(tensors, hp: HParams, opts: QuantOptions) -> tuple[list[int], list[str]]:
    """The output type of each tensor and the fallback notes. tensors: [(name, ne, ggml type)] in llama_order."""
    names = [t[0] for t in tensors]
    ch = _Chooser(names, hp, opts)
    return [ch.get_type(name, tuple(ne), cur) for name, ne, cur in tensors], ch.fallbacks


def guessed_ftype(tensors) -> int:
    """The loader's file type of a file without general.file_type (COPY writes it): that of its most frequent tensor
    type (the first to reach the highest count, in llama_order), marked LLAMA_FTYPE_GUESSED."""
    by_type = {F32: 0, F16: 1, BF16: 32, Q4_0: 2, Q4_1: 3, Q5_0: 8, Q5_1: 9, Q8_0: 7, Q2_K: 10, Q3_K: 12, Q4_K: 15,
               Q5_K: 17, Q6_K: 18, 34: 36, 35: 37, 16: 19, 17: 20, 22: 28, 18: 23, 19: 24, 29: 31, 20: 25, 23: 30,
               21: 26, 40: 39, 41: 40, 42: 41}
    counts: dict[int, int] = {}
    best, best_n = None, 0
    for _, _, t in tensors:
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > best_n:
            best, best_n = t, counts[t]
    return by_type.get(best, 0) | LLAMA_FTYPE_GUESSED
