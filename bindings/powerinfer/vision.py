"""Image input through a multimodal projector file (llama.cpp's `--mmproj`, its tools/mtmd).

An mmproj file is a GGUF with general.architecture = "clip", clip.* keys and v.* / mm.* tensors (llama.cpp's
convert_hf_to_gguf.py --mmproj writes them). This module reads one, turns an image into the text model's input
embeddings and says how mtmd places them in a prompt:

    proj = VisionProjector("mmproj.gguf")
    proj.check_text_model(model)                  # n_embd must match (a clear error at load)
    pixels = proj.preprocess(load_image(data))    # float32 [3, S, S]: resized as mtmd does, normalised
    embd = proj.encode(pixels)                    # float32 [n_image_tokens, n_embd_text]

Supported projector types: "gemma3" (SigLIP ViT + 4x4 average pool + soft-embedding RMS norm + input projection;
Gemma 3 4B / 12B / 27B). Every other type llama.cpp knows is refused by name.

The tower runs through the C core's ops (pi_op_mul_mat on the weights' own types: f32, f16, bf16, Q8_0 ...; layer
norm, attention, GELU), one Python step per layer, none per patch. tests/reference_vision.py is its float64
reference.

Gemma 3 numerics (llama.cpp's clip.cpp / siglip.cpp and mtmd.cpp, checked there):
  - preprocessing (mtmd_image_preprocessor_fixed_size): the image is resized keeping its aspect ratio to fit
    image_size (scale = min(S/w, S/h) in float32, sides ceil(side * scale) capped at S), with Pillow's bilinear
    filter (mtmd ports Pillow's fixed-point resampler; one axis at a time, width first, as mtmd runs it), centred
    on a black S x S canvas (offset (S - side) // 2), then x = (u8 / 255 - mean) / std per channel (the file's
    clip.vision.image_mean / image_std);
  - patch embedding: the conv with stride = patch size as a matmul over unfolded patches ([c][ky][kx] order, the
    weight's own layout), + bias, + the learned position embedding;
  - blocks: x += out(attn(LN1(x))), x += down(gelu(up(LN2(x)))) (LayerNorm with bias, eps clip.vision.attention.
    layer_norm_epsilon; q/k/v/out with biases; bidirectional attention scaled by 1/sqrt(head_dim), K and V rounded to
    f16 as llama.cpp's flash-attention path rounds them (kv_f16=False: f32); GELU the tanh
    approximation, ggml_gelu); then post_ln;
  - the patches (P x P, row-major) average-pooled n_merge x n_merge (4 unless clip.vision.projector.scale_factor
    says otherwise) to (P / n_merge)^2 tokens, RMS-normed (the same eps) times mm.soft_emb_norm.weight, projected by
    mm.input_projection.weight (stored [n_embd_v, n_embd_text], x @ W);
  - in the prompt: "<start_of_image>", the image's embeddings, "<end_of_image>"; the embeddings enter the text model
    unscaled (gemma3 scales token embeddings by sqrt(n_embd), not these: llama.cpp's build_inp_embd) at consecutive
    positions, and attend to each other bidirectionally (mtmd_decode_use_non_causal is true for gemma3).
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from ._ffi import check, ffi, lib
from .gguf_file import ModelLoadError, open_gguf

SUPPORTED_PROJECTORS = ("gemma3",)
# every projector type llama.cpp's clip-impl.h names (refused by name, with the supported list)
KNOWN_PROJECTORS = (
    "mlp", "mlp_norm", "ldp", "ldpv2", "resampler", "adapter", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger",
    "ling3vl", "step3vl", "gemma3", "gemma3nv", "gemma3na", "gemma4v", "gemma4a", "gemma4uv", "gemma4ua", "phi4",
    "idefics3", "pixtral", "ultravox", "internvl", "llama4", "qwen2a", "qwen3a", "glma", "qwen2.5o", "voxtral",
    "meralion", "musicflamingo", "lfm2", "kimivl", "paddleocr", "lightonocr", "cogvlm", "janus_pro", "dots_ocr",
    "dots3note_v", "dots3note_a", "deepseekocr", "deepseekocr2", "deepseek4v", "lfm2a", "glm4v", "glm5v", "youtuvl",
    "yasa2", "kimik25", "nemotron_v2_vl", "exaone4_5", "hunyuanvl", "minicpmv4_6", "granite_speech", "mimovl",
    "minimax_m3", "granite4_vision", "mimo_audio", "parakeet")

IMAGE_BEGIN, IMAGE_END = "<start_of_image>", "<end_of_image>"   # gemma3's markers around an image (mtmd.cpp)
MEDIA_MARKER = "<__media__>"   # mtmd_default_marker(): where a prompt's image goes

_F32, _F16 = 0, 1


class VisionError(ModelLoadError):
    """An mmproj file this package cannot use, or one that does not fit the text model."""


class ImageError(ValueError):
    """An image that cannot be decoded (or Pillow is missing)."""


def _require_pillow():
    try:
        from PIL import Image  # noqa: F401
    except ImportError:
        raise ImageError("image input needs Pillow to decode images (JPEG, PNG, WebP, ...): "
                         "pip install 'powerinfer[vision]' (or pip install pillow)") from None
    from PIL import Image
    return Image


def load_image(src) -> np.ndarray:
    """An image as uint8 RGB [height, width, 3]: src is the file's bytes, a path, a PIL image or such an array.
    Alpha is dropped and grey / palette images become RGB (as stb_image's 3-channel load that mtmd uses)."""
    if isinstance(src, np.ndarray):
        if src.dtype != np.uint8 or src.ndim != 3 or src.shape[2] != 3:
            raise ImageError(f"an image array must be uint8 [height, width, 3], got {src.dtype} {src.shape}")
        return src
    Image = _require_pillow()
    if isinstance(src, (str, os.PathLike)):
        try:
            with open(src, "rb") as f:
                src = f.read()
        except OSError as e:
            raise ImageError(f"cannot read image file {src}: {e.strerror}") from None
    if isinstance(src, (bytes, bytearray, memoryview)):
        try:
            img = Image.open(io.BytesIO(bytes(src)))
            img.load()
        except Exception as e:   # Pillow raises many kinds for a bad file
            raise ImageError(f"cannot decode the image ({len(src)} bytes): {e}") from None
    elif hasattr(src, "convert"):
        img = src
    else:
        raise ImageError(f"an image must be bytes, a path, a PIL image or an array, not {type(src).__name__}")
    if img.width < 1 or img.height < 1:
        raise ImageError(f"empty image ({img.width} x {img.height})")
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


def image_hash(rgb: np.ndarray) -> str:
    """SHA-256 of the decoded pixels and their size: the image's id in prompt-cache keys (llama.cpp's server keys
    its cached image chunks by a hash of the bitmap, so one image in two encodings is one image)."""
    h = hashlib.sha256()
    h.update(np.asarray(rgb.shape[:2], dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(rgb).tobytes())
    return h.hexdigest()


def fit_size(w: int, h: int, size: int) -> tuple[int, int]:
    """The resized (width, height) of a w x h image fitted into size x size keeping its aspect ratio: mtmd's
    img_tool::resize with PAD_CEIL, in float32 arithmetic as it computes it."""
    if (w, h) == (size, size):
        return size, size
    s = min(np.float32(size) / np.float32(w), np.float32(size) / np.float32(h))
    return (min(int(math.ceil(np.float32(w) * s)), size), min(int(math.ceil(np.float32(h) * s)), size))


def resize_letterbox(rgb: np.ndarray, size: int) -> np.ndarray:
    """uint8 [size, size, 3]: rgb resized with Pillow's bilinear filter to fit_size, centred on black."""
    h, w = rgb.shape[:2]
    if (w, h) == (size, size):
        return rgb
    Image = _require_pillow()
    nw, nh = fit_size(w, h, size)
    # one axis at a time, the width first: mtmd's resampler always runs the horizontal pass first (u8 between the
    # passes); Pillow's two-axis resize picks the cheaper order, which rounds differently (one u8 step, 6% of a 20 x 70
    # image's values)
    img = Image.fromarray(rgb)
    if nw != w:
        img = img.resize((nw, h), Image.BILINEAR)
    if nh != h:
        img = img.resize((nw, nh), Image.BILINEAR)
    small = np.asarray(img)
    out = np.zeros((size, size, 3), dtype=np.uint8)
    ox, oy = (size - nw) // 2, (size - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = small
    return out


def normalize(rgb: np.ndarray, mean, std) -> np.ndarray:
    """float32 [3, H, W]: (u8 / 255 - mean) / std per channel, in float32 (clip_image_f32::normalize)."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


# ------------------------------------------------------------------ pi_tensor views over numpy arrays

def _type_sizes(t: int) -> tuple[int, int]:
    """(elements, bytes) per block of ggml type t"""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    return GGML_QUANT_SIZES[GGMLQuantizationType(t)]


def _view(arr: np.ndarray, ne: tuple, t: int = _F32):
    """pi_tensor over contiguous arr (kept alive by the caller) with GGUF dims ne (ne[0] contiguous)."""
    bs, bb = _type_sizes(t)
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = t, len(ne)
    ne = list(ne) + [1] * (4 - len(ne))
    nb = [bb, bb * (ne[0] // bs)]
    for i in range(2, 4):
        nb.append(nb[-1] * ne[i - 1])
    for i in range(4):
        p.ne[i], p.nb[i] = ne[i], nb[i]
    p.data = ffi.cast("void *", arr.__array_interface__["data"][0])
    return p


@dataclass
class VisionHParams:
    proj_type: str
    n_embd: int
    n_head: int
    head_dim: int
    n_ff: int
    n_layer: int
    eps: float
    image_size: int
    patch_size: int
    n_merge: int
    image_mean: tuple
    image_std: tuple
    n_embd_text: int

    @property
    def n_patches_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_image_tokens(self) -> int:
        return (self.n_patches_side // self.n_merge) ** 2


class _Weight:
    """A matmul weight for pi_op_mul_mat: the file's bytes (or an interleaved copy pi_repack makes)."""

    def __init__(self, data: np.ndarray, t: int, ne: tuple, repack: bool = True):
        self.data, self.t = data, t
        self.p = _view(data, ne, t)
        n = lib.pi_repack_bytes(self.p) if repack else 0
        if n > 0:
            self.packed = np.empty(n + 64, dtype=np.uint8)
            off = (-self.packed.ctypes.data) % 64
            out = ffi.new("pi_tensor *")
            check(lib.pi_repack(self.p, ffi.cast("void *", self.packed.ctypes.data + off), n, out), "repacking")
            self.p = out


class VisionProjector:
    """An mmproj file's vision tower and projector, ready to encode images (see the module docstring).

    n_threads: the pool the tower's ops run on (None: the physical cores)."""

    def __init__(self, path, *, n_threads: int | None = None, use_mmap: bool = True, repack: bool = True,
                 kv_f16: bool = True):
        self.path = str(path)
        self.kv_f16 = kv_f16   # K and V rounded to f16 for the attention (llama.cpp's flash-attention path does the
        #                        same; pi_op_attention reads f16 rows ~1.9x faster than f32 ones at 4096 patches)
        f = open_gguf(path, use_mmap=use_mmap)
        self._file = f
        meta, tensors = f.metadata, f.tensors
        arch = meta.get("general.architecture")
        if arch != "clip":
            raise VisionError(f"{path}: not a multimodal projector file (general.architecture = {arch!r}, expected "
                              "'clip': the file --mmproj takes is the mmproj-*.gguf that llama.cpp's "
                              "convert_hf_to_gguf.py --mmproj writes)")
        if not meta.get("clip.has_vision_encoder", False):
            kinds = [k for k in ("audio", "gen_audio") if meta.get(f"clip.has_{k}_encoder")]
            raise VisionError(f"{path}: the projector has no vision encoder" +
                              (f" (it is an {' / '.join(kinds)} encoder; audio input is not supported)" if kinds
                               else ""))
        proj = meta.get("clip.vision.projector_type", meta.get("clip.projector_type"))
        if proj not in SUPPORTED_PROJECTORS:
            known = "a projector type llama.cpp knows, " if proj in KNOWN_PROJECTORS else "an unknown projector type, "
            raise VisionError(f"{path}: projector type {proj!r} is not supported ({known}this build runs "
                              f"{', '.join(SUPPORTED_PROJECTORS)}: Gemma 3's vision tower)")
        self.hp = self._hparams(meta, tensors, proj)
        self._load(tensors, repack)
        self._pool = ffi.new("pi_threadpool **")
        check(lib.pi_threadpool_create(n_threads or 0, self._pool), "creating the vision thread pool")
        self.pool = ffi.gc(self._pool[0], lib.pi_threadpool_free)
        self.lock = threading.Lock()   # one encode at a time on the pool (the server encodes in worker threads)

    # ---------------------------------------------------------------- loading

    def _hparams(self, meta: dict, tensors: dict, proj: str) -> VisionHParams:
        path = self.path

        def get(key, default=None):
            if key in meta:
                return meta[key]
            if default is None:
                raise VisionError(f"{path}: missing key {key}")
            return default

        if not meta.get("clip.use_gelu", False) or meta.get("clip.use_silu", False):
            raise VisionError(f"{path}: the vision MLP's activation is not GELU (clip.use_gelu is not true: "
                              "llama.cpp would run quick-GELU or SiLU, which this build's gemma3 tower does not)")
        n_embd, n_head = int(get("clip.vision.embedding_length")), int(get("clip.vision.attention.head_count"))
        head_dim = int(meta.get("clip.vision.attention.head_dim", 0)) or n_embd // max(n_head, 1)
        if n_head < 1 or head_dim * n_head != n_embd:
            raise VisionError(f"{path}: {n_head} heads of {head_dim} do not make n_embd {n_embd}")
        kv = int(meta.get("clip.vision.attention.head_count_kv", n_head))
        if kv != n_head:
            raise VisionError(f"{path}: grouped KV heads in the vision tower ({kv} of {n_head}) are not supported")
        mean, std = get("clip.vision.image_mean", []), get("clip.vision.image_std", [])
        if len(mean) < 3 or len(std) < 3 or any(s == 0 for s in std[:3]):
            raise VisionError(f"{path}: clip.vision.image_mean / image_std need 3 values (std non-zero)")
        size, patch = int(get("clip.vision.image_size")), int(get("clip.vision.patch_size"))
        n_merge = int(meta.get("clip.vision.projector.scale_factor", 4))
        if patch < 1 or size % patch or n_merge < 1 or (size // patch) % n_merge:
            raise VisionError(f"{path}: image_size {size} is not a whole number of {patch}-pixel patches pooled "
                              f"{n_merge} x {n_merge}")
        t = tensors.get("mm.input_projection.weight")
        if t is None:
            raise VisionError(f"{path}: missing tensor mm.input_projection.weight")
        return VisionHParams(proj_type=proj, n_embd=n_embd, n_head=n_head, head_dim=head_dim,
                             n_ff=int(get("clip.vision.feed_forward_length")),
                             n_layer=int(get("clip.vision.block_count")),
                             eps=float(get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
                             image_size=size, patch_size=patch, n_merge=n_merge,
                             image_mean=tuple(float(v) for v in mean[:3]), image_std=tuple(float(v) for v in std[:3]),
                             n_embd_text=int(t.ne[0]))

    def _tensor(self, tensors: dict, name: str, ne: tuple):
        t = tensors.get(name)
        if t is None:
            raise VisionError(f"{self.path}: missing tensor {name}")
        got = tuple(t.ne) + (1,) * (len(ne) - len(t.ne))
        if got[:len(ne)] != ne or any(x != 1 for x in got[len(ne):]):
            raise VisionError(f"{self.path}: tensor {name} has shape {tuple(t.ne)}, expected {ne}")
        return t

    def _f32(self, tensors: dict, name: str, ne: tuple) -> np.ndarray:
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize
        t = self._tensor(tensors, name, ne)
        try:
            return np.ascontiguousarray(dequantize(t.data, GGMLQuantizationType(t.type)), dtype=np.float32).ravel()
        except Exception as e:
            raise VisionError(f"{self.path}: tensor {name} of type {t.type}: {e}") from None

    def _mat(self, tensors: dict, name: str, ne: tuple, repack: bool) -> _Weight:
        t = self._tensor(tensors, name, ne)
        if not lib.pi_type_supported(t.type):
            raise VisionError(f"{self.path}: tensor {name} has a type (ggml id {t.type}) this build cannot run")
        return _Weight(t.data, t.type, ne, repack)

    def _load(self, tensors: dict, repack: bool) -> None:
        hp = self.hp
        E, F, ps, P = hp.n_embd, hp.n_ff, hp.patch_size, hp.n_patches_side
        K = 3 * ps * ps
        pt = self._tensor(tensors, "v.patch_embd.weight", (ps, ps, 3, E))
        # the conv weight [E][3][ps][ps] is a [3*ps*ps, E] matmul weight over patches unfolded [c][ky][kx]
        self.patch_w = _Weight(pt.data, pt.type, (K, E), repack) if K % _type_sizes(pt.type)[0] == 0 else None
        if self.patch_w is None:
            raise VisionError(f"{self.path}: v.patch_embd.weight's type does not divide its rows of {K}")
        self.patch_b = self._f32(tensors, "v.patch_embd.bias", (E,)) if "v.patch_embd.bias" in tensors else None
        self.pos = self._f32(tensors, "v.position_embd.weight", (E, P * P))
        if "v.pre_ln.weight" in tensors:
            raise VisionError(f"{self.path}: a pre-LayerNorm (v.pre_ln) is not part of Gemma 3's tower")
        self.layers = []
        for il in range(hp.n_layer):
            p = f"v.blk.{il}."
            up, down = p + "ffn_up", p + "ffn_down"
            if tensors.get(down + ".weight") is not None and tuple(tensors[down + ".weight"].ne)[0] == E:
                up, down = down, up   # older files name fc1 ffn_down (llama.cpp swaps them back the same way)
            L = {"ln1_w": self._f32(tensors, p + "ln1.weight", (E,)), "ln1_b": self._f32(tensors, p + "ln1.bias", (E,)),
                 "ln2_w": self._f32(tensors, p + "ln2.weight", (E,)), "ln2_b": self._f32(tensors, p + "ln2.bias", (E,))}
            for k, name in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_out")):
                L[k] = self._mat(tensors, f"{p}{name}.weight", (E, E), repack)
                L["b" + k] = self._f32(tensors, f"{p}{name}.bias", (E,))
            L["up"] = self._mat(tensors, up + ".weight", (E, F), repack)
            L["bup"] = self._f32(tensors, up + ".bias", (F,))
            L["down"] = self._mat(tensors, down + ".weight", (F, E), repack)
            L["bdown"] = self._f32(tensors, down + ".bias", (E,))
            self.layers.append(L)
        self.post_w = self._f32(tensors, "v.post_ln.weight", (E,))
        self.post_b = self._f32(tensors, "v.post_ln.bias", (E,))
        self.soft_norm = self._f32(tensors, "mm.soft_emb_norm.weight", (E,))
        # x @ W with W stored [n_embd_v, n_embd_text] (ne [n_text, n_v]): transposed once into a [n_v, n_text] weight
        w = self._f32(tensors, "mm.input_projection.weight", (hp.n_embd_text, E)).reshape(E, hp.n_embd_text)
        self.proj_t = np.ascontiguousarray(w.T)
        self.proj = _Weight(self.proj_t, _F32, (E, hp.n_embd_text), repack=False)

    # ---------------------------------------------------------------- the model's side

    @property
    def n_image_tokens(self) -> int:
        return self.hp.n_image_tokens

    @property
    def n_embd_text(self) -> int:
        return self.hp.n_embd_text

    def check_text_model(self, model) -> None:
        """VisionError unless the text model takes this projector's embeddings (its n_embd, a gemma3 model)."""
        hp = model.hparams
        if hp.n_embd != self.hp.n_embd_text:
            raise VisionError(f"{self.path}: the projector outputs embeddings of {self.hp.n_embd_text} but the text "
                              f"model's n_embd is {hp.n_embd}: this mmproj file belongs to another model")
        arch = getattr(hp, "arch", None)
        if self.hp.proj_type == "gemma3" and arch not in (None, "gemma3"):
            raise VisionError(f"{self.path}: a gemma3 projector needs a gemma3 text model, not {arch}")
        if getattr(hp, "n_embd_per_layer", 0):
            raise VisionError(f"{self.path}: image embeddings on a model with per-layer embeddings are not supported")

    # ---------------------------------------------------------------- images

    def preprocess(self, image) -> np.ndarray:
        """float32 [3, S, S]: the image (anything load_image takes) resized and normalised as mtmd does."""
        rgb = load_image(image)
        return normalize(resize_letterbox(rgb, self.hp.image_size), self.hp.image_mean, self.hp.image_std)

    def _linear(self, w: _Weight, x: np.ndarray, n_out: int, bias: np.ndarray | None, T: int) -> np.ndarray:
        y = np.empty((T, n_out), dtype=np.float32)
        check(lib.pi_op_mul_mat(self.pool, w.p, _view(x, (x.shape[1], T)), _view(y, (n_out, T))), "vision matmul")
        if bias is not None:
            yv = _view(y, (n_out, T))
            check(lib.pi_op_binary(self.pool, lib.PI_BINARY_ADD, yv, _view(bias, (n_out, 1)), yv), "vision bias")
        return y

    def _layer_norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        E, T = x.shape[1], x.shape[0]
        check(lib.pi_op_layer_norm(self.pool, _view(x, (E, T)), _view(w, (E,)), _view(b, (E,)), self.hp.eps,
                                   _view(out, (E, T))), "vision layer norm")
        return out

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [n_image_tokens, n_embd_text]: the projected embeddings of a preprocessed image [3, S, S]."""
        with self.lock:
            return self._encode(pixels)

    def _encode(self, pixels: np.ndarray) -> np.ndarray:
        hp = self.hp
        S, ps, P, E, H, hd = hp.image_size, hp.patch_size, hp.n_patches_side, hp.n_embd, hp.n_head, hp.head_dim
        pixels = np.asarray(pixels, dtype=np.float32)
        if pixels.shape != (3, S, S):
            raise ValueError(f"encode: pixels of shape {pixels.shape}, expected (3, {S}, {S})")
        T = P * P
        # unfold: patch (py, px) -> its [c][ky][kx] values, patches row-major
        patches = np.ascontiguousarray(pixels.reshape(3, P, ps, P, ps).transpose(1, 3, 0, 2, 4).reshape(T, 3 * ps * ps))
        x = self._linear(self.patch_w, patches, E, self.patch_b, T)
        x += self.pos.reshape(T, E)
        h = np.empty_like(x)
        att = np.empty_like(x)
        xv = _view(x, (E, T))
        for L in self.layers:
            self._layer_norm(x, L["ln1_w"], L["ln1_b"], h)
            q = self._linear(L["q"], h, E, L["bq"], T)
            k = self._linear(L["k"], h, E, L["bk"], T)
            v = self._linear(L["v"], h, E, L["bv"], T)
            kt = _F16 if self.kv_f16 else _F32
            if self.kv_f16:
                k, v = k.astype(np.float16).view(np.uint16), v.astype(np.float16).view(np.uint16)
            check(lib.pi_op_attention(self.pool, _view(q, (hd, H, T)), _view(k, (hd, H, T), kt),
                                      _view(v, (hd, H, T), kt), ffi.NULL, 1.0 / math.sqrt(hd), _view(att, (hd, H, T))),
                  "vision attention")
            o = self._linear(L["o"], att, E, L["bo"], T)
            check(lib.pi_op_binary(self.pool, lib.PI_BINARY_ADD, xv, _view(o, (E, T)), xv), "vision residual")
            self._layer_norm(x, L["ln2_w"], L["ln2_b"], h)
            u = self._linear(L["up"], h, hp.n_ff, L["bup"], T)
            uv = _view(u, (hp.n_ff, T))
            check(lib.pi_op_unary(self.pool, lib.PI_UNARY_GELU, uv, uv), "vision gelu")
            d = self._linear(L["down"], u, E, L["bdown"], T)
            check(lib.pi_op_binary(self.pool, lib.PI_BINARY_ADD, xv, _view(d, (E, T)), xv), "vision residual")
        self._layer_norm(x, self.post_w, self.post_b, x)
        n = P // hp.n_merge
        pooled = x.reshape(n, hp.n_merge, n, hp.n_merge, E).sum(axis=(1, 3), dtype=np.float32)
        pooled = np.ascontiguousarray((pooled / np.float32(hp.n_merge ** 2)).reshape(n * n, E))
        N = n * n
        pv = _view(pooled, (E, N))
        check(lib.pi_op_rms_norm(self.pool, pv, _view(self.soft_norm, (E,)), hp.eps, pv), "vision soft-embedding norm")
        return self._linear(self.proj, pooled, hp.n_embd_text, None, N)

    def encode_image(self, image) -> np.ndarray:
        return self.encode(self.preprocess(image))
