"""The chat page at `/` in headless Chromium (Debian's, driven by Playwright): send a message and
see the answer stream in (the same text as the API gives), stop a generation halfway, reload and
find the conversation; a screenshot is saved to target/web-chat.png. Passes are slowed to 40 ms
(STRATA_FAULT_PASS_DELAY_MS, debug builds) so that stopping happens mid-answer."""

import os
import shutil

import pytest

from conftest import REPO, Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def page_and_server(fixtures_dir):
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed (.ci/run installs Debian's)")
    from playwright.sync_api import sync_playwright

    s = Server(fixtures_dir / "qwen3-moe-tiny", env={"STRATA_FAULT_PASS_DELAY_MS": "40"})
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )
        # The page's policy forbids eval; Playwright's waits evaluate expressions.
        page = browser.new_page(bypass_csp=True)
        try:
            yield page, s
        finally:
            browser.close()
            s.stop()


def last_answer(page):
    return page.locator(".msg.assistant .content").last.text_content()


def test_send_stream_stop_and_reload(page_and_server):
    page, s = page_and_server
    page.goto(s.url + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    page.locator("summary").click()
    page.fill("#temperature", "0")
    page.dispatch_event("#temperature", "change")
    page.fill("#max-tokens", "8")
    page.dispatch_event("#max-tokens", "change")

    page.fill("#input", "Hello there")
    page.click("#send")
    page.wait_for_function("!document.querySelector('#send').disabled", timeout=30000)
    answer = last_answer(page)
    api = s.client().chat.completions.create(
        model=s.model.name, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, temperature=0)
    assert answer == (api.choices[0].message.content or "")

    # A long answer stopped halfway: marked, shorter than asked, the page ready again.
    page.fill("#max-tokens", "400")
    page.dispatch_event("#max-tokens", "change")
    page.fill("#input", "Tell me more")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('.msg.assistant').length == 2 && "
                           "document.querySelectorAll('.msg.assistant')[1].querySelector('.content').textContent.length > 3")
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .note")
    assert page.locator(".msg.assistant .note").last.text_content() == "stopped"
    assert not page.locator("#send").is_disabled()

    # Reload: the conversation is still there.
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.locator(".msg.user").count() == 2
    assert last_answer(page) != "" and page.locator("#chats li").count() == 1
    shot = REPO / "target" / "web-chat.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 1000
