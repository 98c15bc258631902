"""A person at the console, in headless Chromium (Debian's, at /usr/bin/chromium or
$CHROMIUM) driven by Playwright for Python: one step per run, named by the first argument,
with a JSON object of parameters; prints a JSON object of what it saw. Driven by
examples/demo/tests/console.rs, which plays the agent between the steps.

Fails (exit status 1) when Chromium cannot be found: the browser tests never skip.
"""

import json
import os
import sys
import time

from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


class Browser:
    """A context whose requests carry `Authorization: Bearer <token>`, recording every
    dialog, console error and page error."""

    def __init__(self, playwright, token, width=1100):
        if not os.access(CHROMIUM, os.X_OK):
            sys.exit(f"Chromium not found at {CHROMIUM}: install Debian's chromium (scripts/test does)")
        self.browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        self.context = self.browser.new_context(
            extra_http_headers={"Authorization": f"Bearer {token}"},
            viewport={"width": width, "height": 900},
        )
        self.page = self.context.new_page()
        self.dialogs, self.errors = [], []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on(
            "console",
            lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def goto(self, url):
        return self.page.goto(url)

    def close(self):
        self.browser.close()


def approval_url(p):
    return f"{p['base']}/console/approvals/{p['approval_id']}"


def state(page):
    return page.locator("main > p strong").first.inner_text()


def approve(pw, p):
    b = Browser(pw, p["token"])
    listing = b.goto(f"{p['base']}/console/")
    link = b.page.locator(f"a[href='/console/approvals/{p['approval_id']}']")
    listed = link.count()
    link.first.click()
    b.page.wait_for_load_state()
    headline = b.page.locator("h1").inner_text()
    fingerprint = b.page.locator("input[name=fingerprint]").get_attribute("value")
    b.page.screenshot(path=os.path.join(p["shots"], "console-approval.png"), full_page=True)
    b.page.set_viewport_size({"width": 360, "height": 800})
    narrow = b.page.evaluate("document.documentElement.scrollWidth")
    b.page.screenshot(path=os.path.join(p["shots"], "console-approval-360.png"), full_page=True)
    b.page.set_viewport_size({"width": 1100, "height": 900})
    # Keyboard: the Approve button is reachable and pressed with the keyboard.
    b.page.focus("#approve")
    with b.page.expect_navigation():
        b.page.keyboard.press("Enter")
    out = {
        "list_status": listing.status,
        "listed": listed,
        "headline": headline,
        "fingerprint": fingerprint,
        "width_at_360": narrow,
        "state": state(b.page),
        "url": b.page.url,
        "dialogs": b.dialogs,
        "errors": b.errors,
    }
    b.close()
    return out


def operation(pw, p):
    b = Browser(pw, p["token"])
    url = f"{p['base']}/console/operations/{p['operation_id']}"
    deadline = time.time() + 30
    while True:
        response = b.goto(url)
        verification = b.page.locator("#verification").inner_text()
        if verification.startswith("Verified") or time.time() > deadline:
            break
        time.sleep(0.5)
    events = b.page.locator("#events tbody tr td:nth-child(2)").all_inner_texts()
    proofs = b.page.locator("#events tbody tr td:nth-child(6)").all_inner_texts()
    b.page.screenshot(path=os.path.join(p["shots"], "console-operation.png"), full_page=True)
    out = {
        "status": response.status,
        "verification": verification,
        "events": events,
        "proofs": proofs,
        "text": b.page.locator("main").inner_text(),
        "dialogs": b.dialogs,
        "errors": b.errors,
    }
    b.close()
    return out


def stale(pw, p):
    b = Browser(pw, p["token"])
    b.goto(approval_url(p))
    conflict = b.page.locator(".notice.warn").all_inner_texts()
    # The page as it was before the command changed: another fingerprint.
    b.page.evaluate(
        "f => document.querySelector('input[name=fingerprint]').value = f", p["fingerprint"]
    )
    with b.page.expect_response(lambda r: r.url.endswith("/approve")) as posted:
        b.page.click("#approve")
    b.page.wait_for_load_state()
    out = {
        "conflict": conflict,
        "status": posted.value.status,
        "alert": b.page.locator("[role=alert]").all_inner_texts(),
        "state": state(b.page),
        "errors": b.errors,
    }
    b.close()
    return out


def deny(pw, p):
    b = Browser(pw, p["token"])
    b.goto(approval_url(p))
    b.page.get_by_label("Reason for denying").fill(p["reason"])
    with b.page.expect_navigation():
        b.page.click("#deny")
    out = {"state": state(b.page), "text": b.page.locator("main").inner_text(), "errors": b.errors}
    b.close()
    return out


def hostile(pw, p):
    b = Browser(pw, p["token"])
    pages = {}
    for name, url in [("list", f"{p['base']}/console/approvals"), ("approval", approval_url(p))]:
        response = b.goto(url)
        b.page.wait_for_timeout(300)
        pages[name] = {
            "status": response.status,
            "text": b.page.locator("main").inner_text(),
            "images": b.page.locator("main img").count(),
            "scripts": b.page.locator("script").count(),
        }
    out = {"pages": pages, "dialogs": b.dialogs, "errors": b.errors}
    b.close()
    return out


EVIL = """<!doctype html><title>win a prize</title>
<form method="post" action="{action}">
<input type="hidden" name="csrf" value="{csrf}">
<input type="hidden" name="fingerprint" value="{fingerprint}">
<button id="go">Claim</button></form>"""


def forgery(pw, p):
    b = Browser(pw, p["token"])
    b.goto(approval_url(p))
    csrf = b.page.locator("input[name=csrf]").first.get_attribute("value")
    fingerprint = b.page.locator("input[name=fingerprint]").get_attribute("value")
    # Another origin's page posting the real form, with a valid token even.
    evil = EVIL.format(action=approval_url(p) + "/approve", csrf=csrf, fingerprint=fingerprint)
    b.page.route(
        "http://evil.test/**",
        lambda route: route.fulfill(status=200, content_type="text/html", body=evil),
    )
    b.goto("http://evil.test/")
    with b.page.expect_response(lambda r: r.url.endswith("/approve")) as posted:
        b.page.click("#go")
    cross_origin = posted.value.status
    # The console's own page without its token.
    b.goto(approval_url(p))
    b.page.evaluate("document.querySelectorAll('input[name=csrf]').forEach(e => e.remove())")
    with b.page.expect_response(lambda r: r.url.endswith("/approve")) as posted:
        b.page.click("#approve")
    b.page.wait_for_load_state()
    out = {
        "cross_origin": cross_origin,
        "without_token": posted.value.status,
        "text": b.page.locator("main").inner_text(),
    }
    b.close()
    # Another account asking for this approval id.
    other = Browser(pw, p["other_token"])
    out["other_account"] = other.goto(approval_url(p)).status
    out["other_text"] = other.page.locator("main").inner_text()
    other.close()
    return out


def login(pw, p):
    """Without a header: the demo's login form sets the console's cookie."""
    if not os.access(CHROMIUM, os.X_OK):
        sys.exit(f"Chromium not found at {CHROMIUM}: install Debian's chromium (scripts/test does)")
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
    page = browser.new_page()
    before = page.goto(f"{p['base']}/console/").status
    page.goto(f"{p['base']}/console/login")
    page.get_by_label("Demo token").fill(p["token"])
    with page.expect_navigation():
        page.click("button[type=submit]")
    cookies = [
        {k: c[k] for k in ("name", "path", "httpOnly", "sameSite")}
        for c in page.context.cookies()
    ]
    out = {
        "before": before,
        "url": page.url,
        "h1": page.locator("h1").inner_text(),
        "listed": page.locator(f"a[href='/console/approvals/{p['approval_id']}']").count(),
        "cookies": cookies,
        "api": page.request.get(f"{p['base']}/v1/deploys").status,
    }
    browser.close()
    return out


STEPS = {
    "login": login,
    "approve": approve,
    "operation": operation,
    "stale": stale,
    "deny": deny,
    "hostile": hostile,
    "forgery": forgery,
}

if __name__ == "__main__":
    step, params = sys.argv[1], json.loads(sys.argv[2])
    with sync_playwright() as pw:
        print(json.dumps(STEPS[step](pw, params)))
