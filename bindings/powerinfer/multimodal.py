"""Prompts with images: mtmd's chunking (tools/mtmd/mtmd.cpp) over our token lists.

A prompt's text holds MEDIA_MARKER ("<__media__>", mtmd's default marker) where each image goes. The text between
markers is tokenized piece by piece with special tokens parsed (mtmd_tokenize: each piece on its own, BOS before
the first), and each marker becomes the projector's begin text ("<start_of_image>" for gemma3), the image's
embeddings, then its end text ("<end_of_image>").

In a token list the image's rows are placeholder ids: negative ints, one per row, that carry the image's hash
(image_hash, 48 bits of SHA-256 of the decoded pixels) and the row's index, so a cached prefix (a slot's, the RAM
prompt cache's) matches another prompt only where the same image sits at the same place (llama.cpp's server
compares its image chunks by the bitmap's hash the same way); a hash collision needs 2^-48 luck.
The embeddings travel with the prompt as {hash: embeddings} (a Task's `images`; eval_prompt takes such a dict or an
ImageStore, a bounded hash -> embeddings map).
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


# ---------------------------------------------------------------- chat messages (the server's OpenAI / Anthropic)

MAX_IMAGE_BYTES = 20 << 20


def image_bytes_of_url(url: str, where: str) -> bytes:
    """The bytes of an OpenAI image_url: a data: URL with base64 data, or raw base64 (llama.cpp's server takes both).
    http(s) URLs are refused: this server makes no outbound requests on a client's behalf (no fetching of arbitrary
    addresses from inside the host's network); the client sends the image inline."""
    import base64
    import binascii

    from .request import RequestError
    if not isinstance(url, str) or not url:
        raise RequestError(f"{where}: image_url.url must be a non-empty string", param="messages")
    if url.startswith(("http://", "https://")):
        raise RequestError(f"{where}: remote image URLs are not fetched by this server; send the image inline as a "
                           "data: URL (data:image/png;base64,...)", param="messages", code="not_supported")
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or not head.endswith(";base64"):
            raise RequestError(f"{where}: a data: URL must be base64-encoded (data:<type>;base64,<data>)",
                               param="messages")
        if not head[5:].startswith("image/"):
            raise RequestError(f"{where}: {head[5:].split(';')[0] or 'untyped'} data is not an image",
                               param="messages")
    elif "://" in url:
        raise RequestError(f"{where}: unsupported image URL scheme {url.split('://')[0]!r} (data: URLs only)",
                           param="messages")
    else:
        data = url
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise RequestError(f"{where}: the image is larger than {MAX_IMAGE_BYTES >> 20} MiB", param="messages")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{where}: invalid base64 image data", param="messages") from None


def take_images(messages, vision: bool) -> tuple[list, list[bytes]]:
    """Chat messages with OpenAI image_url parts -> (messages whose content is text with one MEDIA_MARKER per image,
    the images' bytes in order). A message with images becomes one string, its parts joined as llama.cpp's chat code
    joins them (a newline between text parts, none before or after a marker). vision False (no --mmproj): a request
    with an image is a RequestError (400)."""
    from .request import RequestError
    if not isinstance(messages, list):
        return messages, []
    out, images = [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "image_url"
                                                    for p in content):
            out.append(m)
            continue
        if not vision:
            raise RequestError(f"messages[{i}]: images are not supported: the server has no multimodal projector "
                               "(start it with --mmproj)", param="messages", code="not_supported")
        text, last_marker = "", False
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "image_url":
                iu = p.get("image_url")
                url = iu.get("url") if isinstance(iu, dict) else iu
                images.append(image_bytes_of_url(url, f"messages[{i}].content[{j}]"))
                text += MEDIA_MARKER
                last_marker = True
            elif kind == "text" and isinstance(p.get("text"), str):
                if text and not last_marker:
                    text += "\n"
                text += p["text"]
                last_marker = False
            else:
                raise RequestError(f"messages[{i}].content[{j}]: content part {kind!r} is not supported (text and "
                                   "image_url only)", param="messages")
        out.append(dict(m, content=text))
    return out, images


def chat_tokens(tokenizer, projector: VisionProjector, text: str, images: list[bytes], bos: str | None):
    """(tokens, {hash: embeddings}) of a rendered chat prompt holding MEDIA_MARKERs: BOS added unless the template
    wrote it (as the text path's chat_prompt does). ImageError for an image that does not decode."""
    return build_prompt(tokenizer, projector, text, images, add_bos=not (bos and text.startswith(bos)))
