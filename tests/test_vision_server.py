"""Images through the engine (slot and prompt-cache reuse keyed by the image) and the server (--mmproj: OpenAI
image_url parts, Anthropic image blocks, /props and /v1/models), on the tiny Gemma 3 text model and mmproj of
tests/vision_files.py."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest

pytest.importorskip("PIL")
pytest.importorskip("starlette")
pytest.importorskip("httpx")

import powerinfer as pi  # noqa: E402
from powerinfer.engine import Engine  # noqa: E402
from powerinfer.multimodal import build_prompt, chat_tokens, eval_prompt, take_images  # noqa: E402
from powerinfer.request import RequestError, Task  # noqa: E402
from powerinfer.sampling import SamplingParams  # noqa: E402
from powerinfer.vision import MEDIA_MARKER, VisionProjector  # noqa: E402

from vision_files import image_array, write_mmproj, write_vision_text_model  # noqa: E402

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
GREEDY = SamplingParams(temperature=0.0)


def png(seed: int, w: int = 40, h: int = 30) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(image_array(w, h, seed)).save(buf, format="PNG")
    return buf.getvalue()


def data_url(b: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(b).decode()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vsrv")
    return write_vision_text_model(d / "text.gguf"), write_mmproj(d / "mm.gguf", "tiny") and d / "mm.gguf"


def greedy(ctx, tokens, store, n: int) -> list[int]:
    n_past = eval_prompt(ctx, tokens, store)
    out = []
    for _ in range(n):
        t = int(np.argmax(ctx.logits()))
        out.append(t)
        ctx.decode([t], pos=[n_past])
        n_past += 1
    return out


def text_of(tok, ids) -> str:
    d = pi.StreamDecoder(tok, strip_leading_space=False)
    return "".join(d.push(t) for t in ids) + d.flush()


def run(engine, tokens, store, n=6):
    task = Task(tokens, GREEDY, n_predict=n, want_ids=True)
    task.images = store
    ids, res = [], None
    for ev in engine.events(task):
        if ev[0] == "token" and ev[2] is not None:
            ids.append(ev[2]["id"])
        elif ev[0] == "done":
            res = ev[1]
        elif ev[0] == "error":
            raise ev[1]
    return ids, res


@pytest.mark.parametrize("regions", [True, False])
def test_slot_reuse_is_keyed_by_the_image(files, regions):
    """The same prompt with the same image reuses the slot's cells; with another image only the text before it;
    every reply equals a fresh context's."""
    text, mm = files
    model = pi.Model(text)
    proj = VisionProjector(mm, n_threads=2)
    tok = model.tokenizer
    ctx = pi.Context(model, n_ctx=256, n_batch=64, n_seq_max=2)
    engine = Engine(ctx, tok, 2 if regions else 1, regions=regions)
    prompts = {k: build_prompt(tok, proj, "the cat <__media__> is a", [png(s)]) for k, s in ((1, 1), (2, 5))}
    ref = {}
    for k, (tokens, store) in prompts.items():
        fresh = pi.Context(model, n_ctx=256, n_batch=64)
        ref[k] = greedy(fresh, tokens, store, 6)
    assert ref[1] != ref[2]   # the images matter
    i0 = next(i for i, t in enumerate(prompts[1][0]) if t < 0)
    ids, res = run(engine, *prompts[1])
    assert ids == ref[1] and res.n_cached == 0
    ids, res = run(engine, *prompts[1])
    assert ids == ref[1] and res.n_cached == len(prompts[1][0]) - 1
    ids, res = run(engine, *prompts[2])
    assert ids == ref[2] and res.n_cached == i0        # the text before the image only
    ids, res = run(engine, *prompts[1])
    assert ids == ref[1] and res.n_cached == i0


def test_prompt_cache_keyed_by_the_image(files):
    """The RAM prompt cache (server default): a saved prompt with image 1 is restored for image 1, not for 2."""
    from powerinfer.prompt_cache import PromptCache
    text, mm = files
    model = pi.Model(text)
    proj = VisionProjector(mm, n_threads=2)
    tok = model.tokenizer
    ctx = pi.Context(model, n_ctx=256, n_batch=64, n_seq_max=1)
    engine = Engine(ctx, tok, 1, prompt_cache=PromptCache(64 << 20))
    p1 = build_prompt(tok, proj, "the cat <__media__> is a", [png(1)])
    p2 = build_prompt(tok, proj, "the cat <__media__> is a", [png(2)])
    other = build_prompt(tok, proj, "once upon a time the", [])
    run(engine, *p1)
    run(engine, *other)          # the slot now holds another prompt; p1's state went to the RAM cache
    ids, res = run(engine, *p2)
    i0 = next(i for i, t in enumerate(p2[0]) if t < 0)
    assert res.n_cached <= i0
    ids1, res = run(engine, *p1)
    assert res.n_cached <= i0    # p2's run overwrote from the image on; p1's image must be evaluated again
    assert ids1 == greedy(pi.Context(model, n_ctx=256, n_batch=64), *p1, 6)


def test_engine_refusals(files):
    text, mm = files
    model = pi.Model(text)
    proj = VisionProjector(mm, n_threads=2)
    ctx = pi.Context(model, n_ctx=256, n_batch=8)
    engine = Engine(ctx, model.tokenizer, 1)
    tokens, store = build_prompt(model.tokenizer, proj, "a <__media__> b", [png(1)])
    task = Task(tokens, GREEDY, n_predict=1)
    task.images = store
    with pytest.raises(RequestError, match="does not fit a batch of 8"):
        engine.check(task)
    task = Task(tokens, GREEDY, n_predict=1)
    with pytest.raises(RequestError, match="out of range"):   # placeholders without images
        engine.check(task)


def test_take_images_joins_parts_as_llama_cpp():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url":
                                          {"url": data_url(png(1))}}, {"type": "text", "text": "and"},
                                         {"type": "text", "text": "this"}]}]
    out, imgs = take_images(msgs, True)
    assert out[0]["content"] == f"look{MEDIA_MARKER}and\nthis" and imgs == [png(1)]
    with pytest.raises(RequestError, match="--mmproj"):
        take_images(msgs, False)
    for url, words in (("https://example.com/x.png", "not fetched"), ("data:image/png,abc", "base64"),
                       ("data:text/plain;base64,aGk=", "not an image"), ("data:image/png;base64,@@@", "invalid base64"),
                       ("ftp://x/y", "unsupported image URL scheme")):
        bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
        with pytest.raises(RequestError, match=words):
            take_images(bad, True)


# ---------------------------------------------------------------- the server

@pytest.fixture(scope="module")
def servers(files):
    from powerinfer.server.app import ServerState, create_app
    from test_server import InProcessServer, wait_healthy
    text, mm = files
    out = {}
    for name in ("vision", "text"):
        llm = pi.PowerInfer(text, n_ctx=512, n_threads=2, verbose=False, chat_template=TEMPLATE)
        if name == "vision":
            llm.set_projector(mm, n_threads=2)
        srv = InProcessServer(create_app(ServerState(model_path="tiny-gemma3", llm=llm)))
        wait_healthy(srv.base)
        out[name] = (srv, llm)
    yield {k: v[0].base for k, v in out.items()}, {k: v[1] for k, v in out.items()}
    for srv, _ in out.values():
        srv.close()


def image_chat(url: str, text: str = "what is it?") -> list:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text",
                                                                                           "text": text}]}]


def test_props_and_models_report_vision(servers):
    from test_server import get
    bases, _ = servers
    assert get(bases["vision"], "/props").json()["modalities"] == {"vision": True, "audio": False}
    assert get(bases["text"], "/props").json()["modalities"] == {"vision": False, "audio": False}
    assert "multimodal" in get(bases["vision"], "/v1/models").json()["models"][0]["capabilities"]
    assert "multimodal" not in get(bases["text"], "/v1/models").json()["models"][0]["capabilities"]


def test_chat_with_image(servers, files):
    from test_server import post
    bases, llms = servers
    llm = llms["vision"]
    body = {"messages": image_chat(data_url(png(3))), "max_tokens": 6, "temperature": 0}
    r = post(bases["vision"], "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    got = r.json()
    # the same prompt by hand: rendered with the marker, the image's rows in its place, greedy
    msgs, imgs = take_images(image_chat(data_url(png(3))), True)
    text = llm.chat_prompt(msgs)[0]
    assert text.startswith("user: " + MEDIA_MARKER + "what is it?")
    tokens, store = chat_tokens(llm.tokenizer, llm.projector, text, imgs, llm.chat_formatter.bos_token)
    assert got["usage"]["prompt_tokens"] == len(tokens)
    ids = greedy(pi.Context(pi.Model(files[0]), n_ctx=256, n_batch=64), tokens, store, 6)
    assert got["choices"][0]["message"]["content"] == text_of(llm.tokenizer, ids)
    # another image, same text: another answer (the image is not taken from the cache)
    r2 = post(bases["vision"], "/v1/chat/completions", dict(body, messages=image_chat(data_url(png(2)))))
    tokens2, store2 = chat_tokens(llm.tokenizer, llm.projector, text, [png(2)], llm.chat_formatter.bos_token)
    ids2 = greedy(pi.Context(pi.Model(files[0]), n_ctx=256, n_batch=64), tokens2, store2, 6)
    assert r2.json()["choices"][0]["message"]["content"] == text_of(llm.tokenizer, ids2)
    assert ids != ids2


def test_anthropic_image_block(servers):
    from test_server import post
    bases, _ = servers
    b64 = base64.b64encode(png(3)).decode()
    msg = {"model": "x", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
        {"type": "text", "text": "what is it?"}]}]}
    r = post(bases["vision"], "/v1/messages", msg)
    assert r.status_code == 200, r.text
    oa = post(bases["vision"], "/v1/chat/completions", {"messages": image_chat(data_url(png(3))), "max_tokens": 6,
                                                         "temperature": 0}).json()
    assert r.json()["content"][0]["text"] == oa["choices"][0]["message"]["content"]
    bad = dict(msg, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}])
    assert post(bases["vision"], "/v1/messages", bad).status_code == 400
    r = post(bases["text"], "/v1/messages", msg)
    assert r.status_code == 400 and "--mmproj" in r.text


@pytest.mark.parametrize("url,words", [("https://example.com/cat.png", "not fetched"),
                                       ("data:image/png;base64,AAAA", "cannot decode the image")])
def test_bad_image_requests_are_400(servers, url, words):
    from test_server import post
    bases, _ = servers
    r = post(bases["vision"], "/v1/chat/completions", {"messages": image_chat(url), "max_tokens": 2})
    assert r.status_code == 400 and words in r.text, r.text


def test_image_without_mmproj_is_400(servers):
    from test_server import post
    bases, _ = servers
    r = post(bases["text"], "/v1/chat/completions", {"messages": image_chat(data_url(png(1))), "max_tokens": 2})
    assert r.status_code == 400 and "--mmproj" in r.text


def test_ollama_chat_images(servers):
    """Ollama's /api/chat images (base64 strings) are the same image_url parts: the same reply as OpenAI's."""
    from test_server import post
    bases, _ = servers
    b64 = base64.b64encode(png(3)).decode()
    r = post(bases["vision"], "/api/chat", {"model": "x", "stream": False,
                                            "options": {"temperature": 0, "num_predict": 6},
                                            "messages": [{"role": "user", "content": "what is it?", "images": [b64]}]})
    assert r.status_code == 200, r.text
    oa = post(bases["vision"], "/v1/chat/completions", {"messages": image_chat(data_url(png(3))), "max_tokens": 6,
                                                         "temperature": 0}).json()
    assert r.json()["message"]["content"] == oa["choices"][0]["message"]["content"]
    r = post(bases["text"], "/api/chat", {"model": "x", "stream": False,
                                          "messages": [{"role": "user", "content": "hi", "images": [b64]}]})
    assert r.status_code == 400 and "--mmproj" in r.text
