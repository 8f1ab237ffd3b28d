"""The chat page at GET / in a real headless browser: Debian's chromium, driven by selenium through
Debian's chromium-driver (the same source package, so the driver always matches the browser; nothing
is downloaded). Skips when chromium, chromedriver or selenium is missing (.ci/run installs them
when apt-get can).

The page is loaded from the server, a message is sent, the reply must arrive in several pieces
(streamed: the bubble's text changes more than once), the settings must reach the server (read back
from /slots), and Stop must end a running reply and free its slot.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
webdriver = pytest.importorskip("selenium.webdriver")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402
from powerinfer.server.app import ServerState, create_app  # noqa: E402
from test_server import InProcessServer, get, wait_healthy  # noqa: E402

CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and os.access(p, os.X_OK)), None)
CHROMEDRIVER = shutil.which("chromedriver") or (
    "/usr/bin/chromedriver" if os.access("/usr/bin/chromedriver", os.X_OK) else None)
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs chromium and chromium-driver (apt-get install chromium chromium-driver)")
STEP_DELAY = 0.01      # seconds per engine step: a slow model, so a reply is still running when Stop is pressed


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("webui") / "tiny.gguf"
    write_model(path, dtype="f32", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=1)
    llm = pi.PowerInfer(path, n_ctx=4096, n_parallel=1, n_threads=1)
    step = llm.engine.step

    def slow_step(*a, **kw):
        time.sleep(STEP_DELAY)
        return step(*a, **kw)
    llm.engine.step = slow_step
    srv = InProcessServer(create_app(ServerState(model_path=str(path), llm=llm)))
    wait_healthy(srv.base)
    yield srv.base
    srv.close()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              "--disable-extensions", "--window-size=1200,900"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    drv.set_script_timeout(30)
    yield drv
    drv.quit()


def wait_for(fn, timeout=20.0, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


WATCH = """
window.__states = [];
new MutationObserver(() => {
  const b = document.querySelectorAll('.msg.assistant .content');
  if (b.length) { const t = b[b.length - 1].textContent; const s = window.__states;
                  if (!s.length || s[s.length - 1] !== t) s.push(t); }
}).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
"""


def set_field(drv, id_, value):
    drv.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                       "e.dispatchEvent(new Event('change'));", id_, str(value))


def test_page_is_self_contained(server):
    r = get(server, "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "/v1/chat/completions" in html and 'id="stop"' in html
    for ref in ("http://", "https://", "//cdn", "<link ", "src="):      # nothing fetched from elsewhere
        assert ref not in html.replace("http://www.w3.org", ""), ref


def test_chat_streams_and_stops(server, browser):
    from selenium.webdriver.common.by import By
    drv = browser
    drv.get(server + "/")
    wait_for(lambda: drv.find_element(By.ID, "model").text == "tiny.gguf", what="the model name from /v1/models")
    drv.execute_script(WATCH)
    set_field(drv, "temperature", 0.3)
    set_field(drv, "top_k", 5)
    set_field(drv, "top_p", 0.9)
    set_field(drv, "seed", 1234)
    set_field(drv, "max_tokens", 12)
    drv.find_element(By.ID, "input").send_keys("Hello there")
    drv.find_element(By.ID, "send").click()
    wait_for(lambda: drv.find_element(By.ID, "status").text.startswith("12 tokens"), what="the reply to finish")
    states = drv.execute_script("return window.__states")
    grew = all(states[i + 1].startswith(states[i]) for i in range(len(states) - 1))
    assert len(states) >= 3 and states[-1] and grew, states     # piece by piece: streamed, not delivered at once
    assert [e.text for e in drv.find_elements(By.CSS_SELECTOR, ".msg.user .content")] == ["Hello there"]
    (slot,) = get(server, "/slots").json()
    p = slot["params"]
    assert (p["temperature"], p["top_k"], p["top_p"], p["seed"], p["n_predict"]) == (0.3, 5, 0.9, 1234, 12)
    assert "Hello there" in slot["prompt"]

    # Stop: a long reply, stopped once text has appeared; the slot is freed and the text stops growing
    set_field(drv, "max_tokens", 3000)
    drv.find_element(By.ID, "input").send_keys("Tell me more")
    drv.find_element(By.ID, "send").click()
    wait_for(lambda: len(drv.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")) == 2
             and drv.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")[1].text, what="the second reply")
    assert drv.find_element(By.ID, "send").get_attribute("disabled") is not None
    drv.find_element(By.ID, "stop").click()
    wait_for(lambda: drv.find_element(By.ID, "status").text == "stopped", what="the page to say stopped")
    wait_for(lambda: not get(server, "/slots").json()[0]["is_processing"], timeout=5, what="the slot to be freed")
    text = drv.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")[1].text
    time.sleep(0.3)
    assert drv.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")[1].text == text
    assert get(server, "/slots").json()[0]["next_token"]["n_decoded"] < 3000
    assert drv.find_element(By.ID, "send").get_attribute("disabled") is None


def test_server_errors_show_in_the_page(server, browser):
    from selenium.webdriver.common.by import By
    drv = browser
    drv.get(server + "/")
    set_field(drv, "top_p", -1)                     # the server answers 400: the page shows its message
    drv.find_element(By.ID, "input").send_keys("x")
    drv.find_element(By.ID, "send").click()
    err = wait_for(lambda: drv.find_elements(By.CSS_SELECTOR, ".msg.assistant.error"), what="an error bubble")
    assert "top_p" in err[0].text and drv.find_element(By.ID, "status").text == "error"
    set_field(drv, "top_p", 0.95)


# every request the page sends gets this grammar, so that the tiny model's reply thinks first (test_reasoning.py)
FORCE_THINKING = """
const grammar = arguments[0], plain = window.fetch;
window.fetch = (url, opts) => plain(url, Object.assign({}, opts,
    { body: JSON.stringify(Object.assign(JSON.parse(opts.body), { grammar })) }));
"""


def test_reasoning_shows_in_a_fold(server, browser):
    """A reply's reasoning (delta.reasoning_content) goes into a fold above the answer; the answer alone is the
    bubble's text and the history the next request sends."""
    from selenium.webdriver.common.by import By
    from test_reasoning import THOUGHT
    drv = browser
    drv.get(server + "/")
    drv.execute_script(FORCE_THINKING, THOUGHT)
    set_field(drv, "max_tokens", 60)
    drv.find_element(By.ID, "input").send_keys("Think first")
    drv.find_element(By.ID, "send").click()
    wait_for(lambda: drv.find_element(By.ID, "status").text.startswith(("finish", "stopped", "error"))
             or "tokens" in drv.find_element(By.ID, "status").text, what="the reply to finish")
    fold = drv.find_element(By.CSS_SELECTOR, ".msg.assistant details.thinking")
    assert drv.find_element(By.CSS_SELECTOR, ".msg.assistant details.thinking summary").text == "reasoning"
    text = drv.execute_script("return arguments[0].querySelector('span').textContent", fold)
    assert text in ("the user asks a thing", "the user wants a thing"), text
    assert drv.find_element(By.CSS_SELECTOR, ".msg.assistant .content").text in ("yes.", "no.")
