"""The playground at ``/``: served as a locked-down static page, and played in a real browser.

The browser is headless Chromium from the distribution's packages driven by selenium
(``.ci/run`` installs ``chromium`` and ``chromium-driver``); where either is missing the
browser tests skip, saying why.  Each browser test saves a screenshot: under
``$INDEXTTS_ARTEFACTS`` when it is set, else the test's tmp dir; the path is printed.
"""

from __future__ import annotations

import os
import re
import shutil
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from http_support import KEY, TIMEOUT, server  # noqa: E402

from indextts_sidecar.engines.fake import render  # noqa: E402

TEXT = "Streamed into a browser."


def _browser_missing() -> str:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the test extra)"
    for binary in ("chromium", "chromedriver"):
        if shutil.which(binary) is None:
            return f"{binary} is not on PATH (apt-get install chromium chromium-driver)"
    return ""


@pytest.fixture
def browser() -> Iterator[Any]:
    reason = _browser_missing()
    if reason:
        print(f"skipping the browser test: {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,1100"):
        options.add_argument(flag)
    options.add_argument("--autoplay-policy=no-user-gesture-required")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or ""))
    driver.set_page_load_timeout(TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()


def _artefact(tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("INDEXTTS_ARTEFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _screenshot(driver: Any, path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
    with capsys.disabled():
        print(f"\nscreenshot: {path}")


def _finished(driver: Any) -> str:
    """The page's state once it leaves ``loading``/``playing``."""
    from selenium.webdriver.support.ui import WebDriverWait

    facts = driver.find_element("id", "facts")
    WebDriverWait(driver, TIMEOUT).until(
        lambda _: facts.get_attribute("data-state") not in ("idle", "loading", "playing")
    )
    return str(facts.get_attribute("data-state"))


def _console_errors(driver: Any) -> list[str]:
    """Script errors and CSP violations; not the 4xx answers the page expects (a voice list
    asked before the key was typed, the favicon the browser asks for)."""
    messages = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return [m for m in messages if "Failed to load resource: the server responded with a status of 4" not in m]


def test_the_page_streams_pcm_and_reports_its_duration(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = len(render(TEXT))  # samples at 24 kHz: the fake engine's rate is pcm's
    with server("--engine", "fake", "-O", "chunk_seconds=0.2", "--api-key", KEY) as s:
        browser.get(s.base + "/")
        assert browser.title == "indextts playground"
        browser.find_element("id", "key").send_keys(KEY)
        text = browser.find_element("id", "text")
        text.clear()
        text.send_keys(TEXT)
        browser.find_element("id", "play").click()
        state = _finished(browser)
        facts = browser.find_element("id", "facts")
        status = browser.find_element("id", "status").text
        _screenshot(browser, _artefact(tmp_path, "playground-pcm.png"), capsys)
        assert state == "done", status
        assert int(facts.get_attribute("data-samples")) == expected
        assert float(facts.get_attribute("data-seconds")) == pytest.approx(expected / 24000, abs=1e-6)
        result = browser.execute_script("return window.playground")
        assert result["samples"] == expected and result["error"] is None
        assert 0 < result["firstAudioMs"] < TIMEOUT * 1000
        assert re.fullmatch(r"\d+ ms", browser.find_element("id", "ttfa").text)
        assert _console_errors(browser) == []  # no CSP violation, no script error


def test_the_page_plays_pieces_as_they_arrive(browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 8 chunks of 0.2 s, each after 0.2 s of simulated compute: the first audio comes at least
    # 7 x 0.2 s before the end, and the page schedules it then, piece by piece.
    text = "abcdefghijklmnopqrstuvwxyz0"  # 27 x 0.06 s = 1.62 s: 8 chunks of 0.2 s and a short one
    with server("--engine", "fake") as s:
        browser.get(s.base + "/")
        box = browser.find_element("id", "text")
        box.clear()
        box.send_keys(text)
        browser.find_element("id", "options").send_keys('{"chunk_seconds": 0.2, "delay": 0.2}')
        browser.find_element("id", "play").click()
        assert _finished(browser) == "done", browser.find_element("id", "status").text
        _screenshot(browser, _artefact(tmp_path, "playground-pieces.png"), capsys)
        result = browser.execute_script("return window.playground")
        assert result["samples"] == len(render(text))
        assert result["pieces"] >= 2
        assert result["doneMs"] - result["firstAudioMs"] >= 7 * 200
        browser.find_element("id", "options").send_keys("not json")
        browser.find_element("id", "play").click()
        assert _finished(browser) == "error"
        assert browser.find_element("id", "status").text == "error: engine options: not JSON"


def test_a_wrong_key_shows_the_servers_reason(browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with server("--engine", "fake", "--api-key", KEY) as s:
        browser.get(s.base + "/")
        browser.find_element("id", "key").send_keys("not-the-key")
        browser.find_element("id", "play").click()
        assert _finished(browser) == "error"
        _screenshot(browser, _artefact(tmp_path, "playground-401.png"), capsys)
        assert "missing or wrong API key" in browser.find_element("id", "status").text
        assert browser.execute_script("return window.playground.samples") == 0


def test_a_voice_uploaded_from_the_page_is_chosen_and_spoken(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = tmp_path / "alice.wav"
    with wave.open(str(clip), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(render("voice", 16000).tobytes())
    voices = tmp_path / "voices"
    voices.mkdir()
    with server("--engine", "fake", "--voice-dir", str(voices)) as s:
        browser.get(s.base + "/")
        browser.find_element("id", "voice-name").send_keys("alice")
        browser.find_element("id", "voice-file").send_keys(str(clip))
        browser.find_element("id", "upload").click()
        from selenium.webdriver.support.ui import WebDriverWait

        status = browser.find_element("id", "status")
        WebDriverWait(browser, TIMEOUT).until(lambda _: status.text.startswith(("uploaded", "error")))
        assert status.text.startswith("uploaded voice "), status.text
        chosen = browser.execute_script("return document.getElementById('voice').value")
        listed = httpx.get(s.base + "/v1/audio/voices", timeout=TIMEOUT).json()["data"]
        assert [v["id"] for v in listed if v["source"] == "uploaded"] == [chosen]
        browser.find_element("id", "play").click()
        assert _finished(browser) == "done", status.text
        _screenshot(browser, _artefact(tmp_path, "playground-voice.png"), capsys)
        text = browser.find_element("id", "text").get_attribute("value")
        assert browser.execute_script("return window.playground.samples") == len(render(text))


def test_the_page_offers_the_engines_own_voices_with_their_languages(browser: Any) -> None:
    pytest.importorskip("espeakng_loader")
    from selenium.webdriver.support.ui import WebDriverWait

    with server("--engine", "espeak", "--voice", "narrator=en-gb") as s:
        browser.get(s.base + "/")
        box = browser.find_element("id", "voice")
        WebDriverWait(browser, TIMEOUT).until(lambda _: len(box.find_elements("css selector", "option.listed")) > 1)
        offered = {o.get_attribute("value"): o.text for o in box.find_elements("css selector", "option.listed")}
        assert offered["narrator"] == "narrator (mapped, en-gb en)"
        assert offered["English (Great Britain)"] == "English (Great Britain) (engine, en-gb en)"
        browser.execute_script("document.getElementById('voice').value = 'English (Great Britain)'")
        browser.find_element("id", "play").click()
        assert _finished(browser) == "done"


def test_the_pages_emotion_reaches_the_server(browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # espeak has no emotion: the server's 400 for each kind the page sends shows on the page.
    pytest.importorskip("espeakng_loader")
    from selenium.webdriver.support.ui import Select

    with server("--engine", "espeak") as s:
        browser.get(s.base + "/")
        Select(browser.find_element("id", "emotion")).select_by_visible_text("happy")
        browser.find_element("id", "play").click()
        assert _finished(browser) == "error"
        status = browser.find_element("id", "status")
        assert status.text == "error: engine 'espeak' has no emotion weights (emotion)"
        browser.find_element("id", "instructions").send_keys("cheerful")
        browser.find_element("id", "play").click()
        assert _finished(browser) == "error"
        _screenshot(browser, _artefact(tmp_path, "playground-emotion.png"), capsys)
        assert status.text == "error: engine 'espeak' has no emotion from a description (instructions)"
        Select(browser.find_element("id", "emotion")).select_by_visible_text("none")
        browser.find_element("id", "instructions").clear()
        browser.find_element("id", "play").click()
        assert _finished(browser) == "done"
        assert browser.execute_script("return window.playground.samples") > 24000 // 2  # real speech


def test_the_page_is_static_locked_down_and_off_with_a_flag() -> None:
    with server("--engine", "fake", "--api-key", KEY) as s:
        page = httpx.get(s.base + "/", timeout=TIMEOUT)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        # The page needs no key (it holds nothing); what it fetches does.
        assert httpx.get(s.base + "/v1/audio/voices", timeout=TIMEOUT).status_code == 401
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]{44}';", policy)
        assert "'unsafe-inline'" not in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        # Nothing fetched from elsewhere: no absolute URL anywhere in the page.
        assert not re.search(r"https?:|//[A-Za-z0-9]", page.text)
        assert re.findall(r"(?:src|href)=\"([^\"]*)\"", page.text) == []
        assert KEY not in page.text
    with server("--engine", "fake", "--no-playground") as s:
        answer = httpx.get(s.base + "/", timeout=TIMEOUT)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


_FOREIGN_PAGE = """<!doctype html><html><body><script>
(async () => {
  const server = new URLSearchParams(location.search).get("server");
  const result = {};
  try {
    const answer = await fetch(server + "/v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ input: "hi", response_format: "pcm" }) });
    result.fetch = answer.status;
  } catch (error) { result.fetch = "blocked"; }
  result.socket = await new Promise((resolve) => {
    const ws = new WebSocket(server.replace("http", "ws") + "/v1/audio/speech/stream");
    ws.onmessage = (event) => { resolve(JSON.parse(event.data).type); ws.close(); };
    ws.onerror = () => resolve("refused");
  });
  document.title = JSON.stringify(result);
})();
</script></body></html>"""


@pytest.fixture
def foreign_site() -> Iterator[str]:
    """A page on another origin (``http://localhost:PORT``) that calls the server given in its query."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = _FOREIGN_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    site = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{site.server_address[1]}"
    finally:
        site.shutdown()
        site.server_close()


def _visit(driver: Any, page: str) -> Any:
    import json

    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page)
    WebDriverWait(driver, TIMEOUT).until(lambda d: d.title.startswith("{"))
    return json.loads(driver.title)


def test_a_page_on_another_origin_reaches_the_api_only_when_allowed(browser: Any, foreign_site: str) -> None:
    with server("--engine", "fake") as s:
        assert _visit(browser, f"{foreign_site}/?server={s.base}") == {"fetch": "blocked", "socket": "refused"}
    with server("--engine", "fake", "--cors-origin", foreign_site) as s:
        assert _visit(browser, f"{foreign_site}/?server={s.base}") == {"fetch": 200, "socket": "session.ready"}


def test_the_pages_ssml_box_sends_text_format(browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ssml = '<speak>ab<break time="125ms"/>cd</speak>'
    expected = len(render("ab")) + 3000 + len(render("cd"))  # samples at 24 kHz, the break exact
    with server("--engine", "fake", "--api-key", KEY) as s:
        browser.get(s.base + "/")
        browser.find_element("id", "key").send_keys(KEY)
        text = browser.find_element("id", "text")
        text.clear()
        text.send_keys(ssml)
        browser.find_element("id", "ssml").click()
        browser.find_element("id", "play").click()
        assert _finished(browser) == "done", browser.find_element("id", "status").text
        assert browser.execute_script("return window.playground.samples") == expected
        text.clear()
        text.send_keys("<speak><audio/></speak>")
        browser.find_element("id", "play").click()
        assert _finished(browser) == "error"
        _screenshot(browser, _artefact(tmp_path, "playground-ssml.png"), capsys)
        assert "line 1, column 8" in browser.find_element("id", "status").text
        assert _console_errors(browser) == []
