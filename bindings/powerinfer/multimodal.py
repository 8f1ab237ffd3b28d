"""Prompts with images: mtmd's chunking (tools/mtmd/mtmd.cpp) over our token lists.

A prompt's text holds MEDIA_MARKER ("<__media__>", mtmd's default marker) where each image goes. The text between
markers is tokenized piece by piece with special tokens parsed (mtmd_tokenize: each piece on its own, BOS before
the first), and each marker becomes the projector's begin text ("<start_of_image>" for gemma3), the image's
embeddings, then its end text ("<end_of_image>").

In a token list the image's rows are placeholder ids: negative ints, one per row, that carry the image's hash
(image_hash, 48 bits of SHA-256 of the decoded pixels) and the row's index, so a cached prefix (a slot's, the RAM
prompt cache's) matches another prompt only where the same image sits at the same place (llama.cpp's server
compares its image chunks by the bitmap's hash the same way); a hash collision needs 2^-48 luck.
The embeddings are looked up by hash in an ImageStore (the engine's).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .vision import IMAGE_BEGIN, IMAGE_END, MEDIA_MARKER, ImageError, VisionProjector, image_hash, load_image

_ROW_BITS = 12          # rows per image < 4096 (gemma3: 256)
_HASH_BITS = 48


def placeholder_ids(h48: int, n: int) -> list[int]:
    """The n placeholder token ids of image h48's rows."""
    base = h48 << _ROW_BITS
    return [-(1 + base + j) for j in range(n)]


def split_placeholder(t: int) -> tuple[int, int]:
    """(image hash, row) of a placeholder id (t < 0)."""
    v = -t - 1
    return v >> _ROW_BITS, v & ((1 << _ROW_BITS) - 1)


def image_run(tokens: list[int], start: int = 0) -> int:
    """How many tokens from `start` are rows of the one image tokens[start] belongs to (0: not an image row)."""
    if start >= len(tokens) or tokens[start] >= 0:
        return 0
    h, j = split_placeholder(tokens[start])
    n = 1
    while start + n < len(tokens) and tokens[start + n] == -(1 + (h << _ROW_BITS) + j + n):
        n += 1
    return n


def first_image_row(tokens: list[int]) -> int:
    """Index of the first placeholder in tokens (len(tokens) if none)."""
    a = np.asarray(tokens, dtype=np.int64)
    neg = np.flatnonzero(a < 0)
    return int(neg[0]) if len(neg) else len(tokens)


class ImageStore:
    """hash -> embeddings [n_rows, n_embd] of the images the engine's prompts hold, the most recent `cap` kept."""

    def __init__(self, cap: int = 64):
        self.cap = cap
        self._d: OrderedDict[int, np.ndarray] = OrderedDict()

    def put(self, h48: int, embd: np.ndarray) -> None:
        self._d[h48] = embd
        self._d.move_to_end(h48)
        while len(self._d) > self.cap:
            self._d.popitem(last=False)

    def rows(self, token: int, n: int) -> np.ndarray:
        h, j = split_placeholder(token)
        e = self._d.get(h)
        if e is None:
            raise KeyError(f"image {h:012x} is no longer held (more than {self.cap} images since)")
        return e[j:j + n]

    def update(self, images: dict) -> None:
        for h, e in images.items():
            self.put(h, e)


def encode_images(projector: VisionProjector, images) -> list[tuple[int, np.ndarray]]:
    """(hash, embeddings) of each image (anything load_image takes)."""
    out = []
    for img in images:
        rgb = load_image(img)
        h = int(image_hash(rgb)[:_HASH_BITS // 4], 16)
        out.append((h, projector.encode(projector.preprocess(rgb))))
    return out


def build_prompt(tokenizer, projector: VisionProjector | None, text: str, images=(), *, add_bos: bool = True,
                 encoded=None) -> tuple[list[int], dict[int, np.ndarray]]:
    """(token ids with placeholders, {hash: embeddings}) for text with one MEDIA_MARKER per image, as mtmd_tokenize
    places them. encoded: encode_images' result, if the caller has it already."""
    parts = text.split(MEDIA_MARKER)
    images = list(images)
    if encoded is None:
        if images and projector is None:
            raise ImageError("image input needs a multimodal projector (--mmproj)")
        encoded = encode_images(projector, images) if images else []
    if len(parts) - 1 != len(encoded):
        raise ImageError(f"the prompt has {len(parts) - 1} image markers ({MEDIA_MARKER}) for {len(encoded)} images")
    tokens: list[int] = []
    store: dict[int, np.ndarray] = {}
    for i, part in enumerate(parts):
        if part:
            tokens += tokenizer.encode(part, add_special=False, parse_special=True)
        if i < len(encoded):
            h, e = encoded[i]
            tokens += tokenizer.encode(IMAGE_BEGIN, add_special=False, parse_special=True)
            tokens += placeholder_ids(h, len(e))
            tokens += tokenizer.encode(IMAGE_END, add_special=False, parse_special=True)
            store[h] = e
    if add_bos and tokenizer.add_bos and tokenizer.bos_id is not None and tokenizer.bos_id >= 0:
        tokens = [tokenizer.bos_id] + tokens
    return tokens, store


def eval_prompt(ctx, tokens: list[int], store, *, seq_id: int = 0, n_past: int = 0) -> int:
    """Evaluate a token list with placeholders into ctx (text in decode calls, each image in one bidirectional
    decode_embd call); the last row's logits are kept. Returns the new n_past."""
    get = store.rows if isinstance(store, ImageStore) else (lambda t, n: _rows(store, t, n))
    i = 0
    while i < len(tokens):
        n = image_run(tokens, i)
        last = False
        if n:
            last = i + n == len(tokens)
            ctx.decode_embd(get(tokens[i], n), pos=np.arange(n_past, n_past + n), seq_id=seq_id, span=1,
                            logits="last" if last else "none")
        else:
            n = first_image_row(tokens[i:])
            last = i + n == len(tokens)
            ctx.decode(tokens[i:i + n], pos=np.arange(n_past, n_past + n), seq_id=seq_id,
                       logits="last" if last else "none")
        i += n
        n_past += n
    return n_past


def _rows(store: dict, token: int, n: int) -> np.ndarray:
    h, j = split_placeholder(token)
    return store[h][j:j + n]
