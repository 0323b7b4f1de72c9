"""The chat page in headless Chromium (Debian's, driven by Playwright; no browser download).

Run by tests/page.rs against a live `agentd serve` with the real default model:

    page_check.py LINK CHROMIUM SCRIPTED_EVENTS OUT_DIR

LINK is the `http://HOST:PORT/?token=…` line serve printed; SCRIPTED_EVENTS the research events
of a scripted run (chat `chat_xss`) whose model wrote `<script>` and `<img onerror>`; OUT_DIR
gets the screenshots. Exits non-zero, with what failed, on the first failed check.
"""

import json
import re
import sys
from urllib.parse import urlsplit

from playwright.sync_api import expect, sync_playwright

LONG = 180_000  # ms: a research run on the real model, on a busy 2-core machine


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def norm(s):
    return " ".join(s.split())


def main():
    link, chromium, events_file, out = sys.argv[1:5]
    parts = urlsplit(link)
    origin = f"{parts.scheme}://{parts.netloc}"
    with open(events_file, encoding="utf-8") as f:
        scripted = [json.loads(l) for l in f if l.strip()]
    sse = "".join("data: " + json.dumps(e) + "\n\n" for e in scripted)
    scripted_done = scripted[-1]

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        ctx = browser.new_context(viewport={"width": 1280, "height": 860})
        requests, errors, expected_errors = [], [], []
        ctx.on("request", lambda r: requests.append(r.url))
        page = ctx.new_page()

        def on_console(m):
            if m.type == "error":
                (expected_errors if "422" in m.text else errors).append(m.text)

        page.on("console", on_console)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

        # The token link signs in and leaves the address bar.
        page.goto(link)
        page.wait_for_load_state("load")
        check(page.url == origin + "/", f"after the token link the URL is {page.url}")
        check("token" not in page.url, "the token is still in the URL")
        cookies = [c for c in ctx.cookies() if c["name"].startswith("agentd")]
        check(len(cookies) == 1, f"sign-in cookies: {ctx.cookies()}")
        check(cookies[0]["httpOnly"] and cookies[0]["sameSite"] == "Strict", f"cookie {cookies[0]}")
        check(page.evaluate("document.cookie") == "", "the cookie is readable by script")
        question = page.locator("textarea[name=question]")
        expect(question).to_be_focused()

        # The model picker lists the models served, the default chosen.
        picker = page.get_by_label("Model")
        expect(picker.locator("option")).not_to_have_count(0)
        health = page.evaluate("fetch('/health').then((r) => r.json())")
        check(picker.input_value() == health["model"], f"picked {picker.input_value()!r}, default {health['model']!r}")

        # Settings: the API's bounds (422) are shown; a value inside them is kept.
        page.click("#open-settings")
        rounds = page.get_by_label("Tool research rounds")
        rounds.fill("0")
        page.click("#settings-save")
        expect(page.locator("#settings-error")).to_be_visible()
        expect(page.locator("#settings-error")).to_contain_text("64")
        check(rounds.get_attribute("aria-invalid") == "true", "the refused field is not marked invalid")
        rounds.fill("2")
        page.click("#settings-save")
        expect(page.locator("#settings-saved")).to_contain_text("2")
        page.keyboard.press("Escape")
        expect(page.locator("#settings")).not_to_be_visible()

        # A question over docs/ on the real model, sent with Enter.
        q1 = "What happens when research reaches the round limit?"
        question.fill(q1)
        question.press("Enter")
        done = page.locator('[data-role="done"]')
        done.first.wait_for(timeout=LONG)
        answer = page.locator('[data-role="answer"]').last
        live = answer.inner_text()
        check(live.strip(), "the answer is empty")
        check(done.first.get_attribute("data-outcome") in ("answered", "excerpt"), done.first.inner_text())
        expect(done.first).to_contain_text("Model requests")
        page.screenshot(path=f"{out}/page-desktop.png", full_page=True)

        # Stop cancels a run mid-answer; the reply says so.
        page.click("#new-chat")
        q2 = "Write a long explanation of how sockets work, with many details."
        question.fill(q2)
        question.press("Enter")
        page.wait_for_function(
            "() => { const a = document.querySelectorAll('[data-role=answer]'); "
            "return a.length && a[a.length - 1].textContent.length > 20; }",
            timeout=LONG,
        )
        page.click("#stop")
        done.first.wait_for(timeout=LONG)
        check(done.first.get_attribute("data-outcome") == "cancelled", done.first.inner_text())
        expect(page.locator('[data-status="cancelled"]').first).to_be_visible()

        # After a reload the chats are listed; each reopens with its messages.
        page.reload()
        chat1 = page.locator('[data-role="chat"]', has_text=q1)
        chat1.wait_for()
        chat1.focus()  # the list works from the keyboard
        page.keyboard.press("Enter")
        reopened = page.locator('[data-role="answer"]').last
        expect(reopened).not_to_be_empty()
        check(norm(reopened.inner_text()) == norm(live), f"reopened answer differs:\n{reopened.inner_text()}\n---\n{live}")
        expect(page.locator(".turn.user").first).to_have_text(q1)
        page.locator('[data-role="chat"]', has_text=q2).click()
        expect(page.locator('[data-status="cancelled"]').first).to_be_visible()
        expect(page.locator('[data-role="done"]').first).to_have_attribute("data-outcome", "cancelled")

        # A scripted model writes <script> and <img onerror>: shown as text, never run. The
        # events are the scripted run's own, streamed to the page as the daemon streams them.
        page.click("#new-chat")
        page.route("**/v1/research", lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=sse))
        question.fill("What does the model write?")
        question.press("Enter")
        page.locator('[data-role="done"]').first.wait_for(timeout=LONG)
        page.unroute("**/v1/research")
        reply = page.locator("article.reply").last
        assert_safe(page, reply, "streamed")
        expect(reply.locator('[data-role="tool-call"]')).to_have_count(2)
        expect(reply.locator('[data-role="tool-call"]').first).to_contain_text("search_sources")
        src = reply.locator('[data-role="source"][data-handle="S1"]')
        expect(src).to_contain_text("The daemon and its socket")
        expect(src).to_contain_text(re.compile(r"segment 1 of \d+ read"))
        expect(reply.locator('[data-role="notice"][data-kind="finishing"]')).to_have_text("Finishing the answer")
        expect(reply.locator('[data-role="discarded-call"]')).to_contain_text("search_sources")
        expect(reply.locator(".reasoning")).to_contain_text("Reasoning")
        check(reply.locator(".reasoning").get_attribute("open") is None, "reasoning is not collapsed")
        expect(reply.locator(".reasoning .body")).to_have_text("Search the docs for <b>sockets</b> first.")
        d = reply.locator('[data-role="done"]')
        expect(d).to_contain_text("round_limit")
        expect(d).to_contain_text(str(scripted_done["model_requests"]))
        expect(reply.locator("a.cite")).to_have_attribute("href", re.compile(r"^#r\d+-S1$"))
        reply.locator('[data-role="tool-call"] summary').last.click()
        reply.locator(".reasoning summary").click()
        # Tall enough that the whole reply shows (the conversation scrolls inside the page).
        page.set_viewport_size({"width": 1280, "height": 1500})
        page.screenshot(path=f"{out}/page-desktop-research.png")
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=f"{out}/page-desktop-research-dark.png")
        dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
        page.emulate_media(color_scheme="light")
        light = page.evaluate("getComputedStyle(document.body).backgroundColor")
        check(dark != light, f"no dark scheme: {dark}")
        page.set_viewport_size({"width": 1280, "height": 860})

        # The same chat as persisted, reopened from the list.
        page.reload()
        page.locator('[data-role="chat"][data-chat-id="chat_xss"]').click()
        reply = page.locator("article.reply").last
        expect(reply.locator('[data-role="answer"]')).not_to_be_empty()
        assert_safe(page, reply, "reopened")
        expect(reply.locator('[data-role="tool-call"]')).to_have_count(2)
        expect(reply.locator('[data-role="source"][data-handle="S1"]')).to_contain_text(re.compile(r"segment 1 of \d+ read"))
        expect(reply.locator('[data-role="done"]')).to_contain_text("round_limit")

        # An excerpt fallback is labelled as one.
        page.locator('[data-role="chat"][data-chat-id="chat_excerpt"]').click()
        expect(page.locator(".label.excerpt")).to_be_visible()
        expect(page.locator(".label.excerpt")).to_contain_text("not a verified answer")
        expect(page.locator('[data-role="done"]').first).to_have_attribute("data-outcome", "excerpt")

        # 360 px wide: nothing overflows sideways, the chat list opens from the bar.
        page.set_viewport_size({"width": 360, "height": 740})
        chat1_narrow = page.locator('[data-role="chat"]', has_text=q1)
        page.click("#toggle-side")
        expect(chat1_narrow).to_be_visible()
        page.screenshot(path=f"{out}/page-360-chats.png")
        chat1_narrow.click()
        expect(page.locator("#side")).not_to_be_visible()
        expect(page.locator('[data-role="answer"]').last).not_to_be_empty()
        width = page.evaluate("document.documentElement.scrollWidth")
        check(width <= 360, f"the page is {width} px wide at 360 px")
        tops = page.evaluate("[...document.querySelectorAll('.bar button')].map(b => b.getBoundingClientRect().top)")
        check(max(tops) - min(tops) < 4, f"the bar's buttons wrap at 360 px: {tops}")
        page.screenshot(path=f"{out}/page-360.png", full_page=False)

        outside = [u for u in requests if not (u.startswith(origin + "/") or u.startswith("data:"))]
        check(not outside, f"requests left {origin}: {outside}")
        check(not errors, f"console errors: {errors}")
        check(len(expected_errors) <= 1, f"more 422s than the one asked for: {expected_errors}")
        print(f"page check passed: {len(requests)} requests, all to {origin}; screenshots in {out}")
        browser.close()


def assert_safe(page, reply, when):
    a = reply.locator('[data-role="answer"]')
    text = a.inner_text()
    check("<script>window.pwned = 1</script>" in text, f"{when}: the script is not shown as text: {text}")
    check('onerror="window.pwned = 2"' in text, f"{when}: the img is not shown as text: {text}")
    check(a.locator("script, img, iframe, [onerror]").count() == 0, f"{when}: markup from the model is in the DOM")
    check(page.evaluate("document.images.length") == 0, f"{when}: an image is in the page")
    check(page.evaluate("typeof window.pwned") == "undefined", f"{when}: the model's script ran")
    check(a.locator('a[href^="javascript"]').count() == 0, f"{when}: a javascript: link")
    expect(a.locator("strong")).to_have_text("Bold")
    expect(a.locator("li")).to_have_count(2)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"page check FAILED: {e}", file=sys.stderr)
        sys.exit(1)
