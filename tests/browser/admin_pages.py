"""Drives the admin pages in headless Chromium through chromedriver, as an
operator would, and prints what it saw as JSON (tests/admin.rs asserts it).

    admin_pages.py walk BASE TOKEN PENDING_ID BACKED_OFF_ID STARTED_PROVIDER_ID EVIL_ORIGIN
    admin_pages.py screenshot URL PNG [WIDTH HEIGHT]
    admin_pages.py install BASE MACHINE_ID SERVED_IMAGE PNG
    admin_pages.py live BASE MACHINE_ID READY_FILE PNG
    admin_pages.py console BASE MACHINE_ID PNG
"""

import json
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.support.ui import Select, WebDriverWait


def browser(width=1280, height=900):
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
              "--disable-background-networking", "--disable-component-update",
              "--disable-sync", f"--window-size={width},{height}",
              f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def navigate(d, act):
    """Runs act (a click, a submit) and waits until the next page loaded:
    the old page's window carries a mark the new one does not."""
    d.execute_script("window.__shepherd_old_page = true")
    act()
    WebDriverWait(d, 10, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(
            "return window.__shepherd_old_page === undefined"
            " && document.readyState === 'complete'"))


def rows(d):
    return [r.get_attribute("data-machine")
            for r in d.find_elements(By.CSS_SELECTOR, "#machine-list tr.machine")]


def walk(base, token, pending, backed_off, started_provider, evil):
    seen = {}
    d = browser()
    try:
        # Not logged in: the login form; log in with the token.
        d.get(base + "/")
        seen["login_form"] = len(d.find_elements(By.NAME, "token")) == 1
        d.find_element(By.NAME, "token").send_keys(token)
        navigate(d, d.find_element(By.CSS_SELECTOR, "form button[type=submit]").click)
        seen["after_login_title"] = d.title

        # Filter by state, with the form.
        Select(d.find_element(By.NAME, "state")).select_by_value("backoff")
        navigate(d, d.find_element(By.CSS_SELECTOR, "form.filters button").click)
        seen["state_backoff"] = rows(d)
        # Filter by heartbeat.
        d.get(base + "/")
        Select(d.find_element(By.NAME, "heartbeat")).select_by_value("no-agent")
        navigate(d, d.find_element(By.CSS_SELECTOR, "form.filters button").click)
        seen["heartbeat_no_agent"] = sorted(rows(d))
        # Search: a provider ID, then a machine ID's prefix.
        d.get(base + "/")
        box = d.find_element(By.NAME, "q")
        box.send_keys(started_provider)
        navigate(d, box.submit)
        seen["search_provider_id"] = rows(d)
        d.get(base + "/")
        box = d.find_element(By.NAME, "q")
        box.send_keys(pending[:8])
        navigate(d, box.submit)
        seen["search_machine_prefix"] = rows(d)
        seen["chart"] = {g.get_attribute("data-series"): g.get_attribute("data-total")
                         for g in d.find_elements(By.CSS_SELECTOR, "svg#chart g.series")}

        # The drawn life cycle: a click on a state filters the fleet.
        d.get(base + "/")
        state = d.find_element(By.CSS_SELECTOR, 'svg g.state[data-state="backoff"]')
        seen["drawn_count"] = state.get_attribute("data-count")
        navigate(d, state.click)
        seen["drawn_state_url"] = d.current_url
        seen["drawn_state_rows"] = rows(d)

        # A bulk action: check two machines, choose hold, review, confirm.
        # (Of the machines without an agent, the two other than the one
        # held below.)
        d.get(base + "/?heartbeat=no-agent")
        chosen = [m for m in rows(d) if m != pending]
        seen["bulk_chosen"] = sorted(chosen)
        for m in chosen:
            d.find_element(By.CSS_SELECTOR, f'#machine-list input[name=machine][value="{m}"]').click()
        Select(d.find_element(By.ID, "bulk-action")).select_by_value("hold")
        navigate(d, d.find_element(By.ID, "button-bulk").click)
        seen["bulk_title"] = d.title
        seen["bulk_listed"] = sorted(r.get_attribute("data-machine")
                                     for r in d.find_elements(By.CSS_SELECTOR, "#bulk-machines tr.machine"))
        seen["bulk_button"] = d.find_element(By.ID, "button-confirm").text
        d.find_element(By.CSS_SELECTOR, "#form-bulk input[name=reason]").send_keys("power work")
        navigate(d, d.find_element(By.ID, "button-confirm").click)
        seen["bulk_done"] = d.find_element(By.ID, "bulk-done").text
        seen["bulk_outcomes"] = {r.get_attribute("data-machine"): r.get_attribute("class")
                                 for r in d.find_elements(By.CSS_SELECTOR, "#bulk-outcomes tr[data-machine]")}
        d.get(base + "/?state=held")
        seen["held_after_bulk"] = sorted(rows(d))

        # The machine page: hold it with a reason, by the button.
        d.get(base + "/machines/" + pending)
        form = d.find_element(By.ID, "form-hold")
        form.find_element(By.NAME, "reason").send_keys("rack move")
        navigate(d, form.find_element(By.TAG_NAME, "button").click)
        seen["after_hold_url"] = d.current_url
        seen["notice"] = d.find_element(By.ID, "done").text
        seen["state"] = d.find_element(By.ID, "state").text
        seen["operator_rows"] = [r.text for r in d.find_elements(By.CSS_SELECTOR, "#history tr.operator")]
        seen["buttons"] = [b.get_attribute("id") for b in d.find_elements(By.CSS_SELECTOR, "#actions button")]

        # Another site's page posting to the release button (the cookie
        # goes along: same site, another port).
        d.get(evil)
        navigate(d, d.find_element(By.ID, "go").click)
        seen["cross_site_body"] = d.find_element(By.TAG_NAME, "body").text
        d.get(base + "/machines/" + pending)
        seen["state_after_cross_site"] = d.find_element(By.ID, "state").text
    finally:
        d.quit()
    print(json.dumps(seen))


def live(base, machine, ready, png):
    """Loads the fleet page, says so (READY_FILE), and waits for the
    machine's row in the installations under way to show a progress bar,
    which the page's live updates draw: the page is never reloaded."""
    import time
    seen = {}
    d = browser(1280, 1400)
    try:
        d.get(base + "/")
        row = f'#progress tr[data-machine="{machine}"]'
        d.execute_script("window.__shepherd_same_page = true")
        seen["before"] = text(d, row)
        seen["bars_before"] = len(d.find_elements(By.CSS_SELECTOR, row + " progress"))
        open(ready, "w").close()
        deadline = time.time() + 30
        while time.time() < deadline:
            bars = d.find_elements(By.CSS_SELECTOR, row + " progress")
            if bars:
                seen["value"] = bars[0].get_attribute("value")
                seen["after"] = text(d, row)
                break
            time.sleep(0.2)
        seen["same_page"] = d.execute_script("return window.__shepherd_same_page === true")
        seen["live"] = text(d, "#live")
        d.save_screenshot(png)
    finally:
        d.quit()
    print(json.dumps(seen))


def console(base, machine, png):
    """Opens a machine's console view on its page (the last boot's tail,
    open) and downloads what the console kept, as its link does."""
    seen = {}
    d = browser(1280, 1400)
    try:
        d.get(f"{base}/machines/{machine}#console")
        opened = d.find_elements(By.CSS_SELECTOR, "#console details.console[open] pre.console-tail")
        seen["tail"] = opened[0].text if opened else None
        seen["captures"] = len(d.find_elements(By.CSS_SELECTOR, "#console details.console"))
        link = d.find_element(By.CSS_SELECTOR, "#console details.console[open] a.console-download")
        seen["download"] = d.execute_async_script(
            "var done = arguments[arguments.length - 1];"
            "fetch(arguments[0]).then(function (r) { return r.text().then(function (t) {"
            " done({status: r.status, type: r.headers.get('content-type'),"
            " disposition: r.headers.get('content-disposition'), text: t}); }); });",
            link.get_attribute("href"))
        d.find_element(By.ID, "console").location_once_scrolled_into_view
        d.save_screenshot(png)
    finally:
        d.quit()
    print(json.dumps(seen))


def screenshot(url, png, width=1280, height=2400):
    d = browser(int(width), int(height))
    try:
        d.get(url)
        d.save_screenshot(png)
        print(json.dumps({"title": d.title}))
    finally:
        d.quit()


def text(d, css):
    found = d.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else None


def install(base, machine, image, png):
    """Asks for an installation with the machine page's form (no token:
    the loopback's anonymous operator), then reloads the page until the
    installation ends, noting every state, phase and progress seen."""
    import time
    seen = {"states": [], "phases": [], "progress": []}
    d = browser(1280, 1800)
    try:
        d.get(f"{base}/machines/{machine}")
        seen["before"] = text(d, "#install-none")
        Select(d.find_element(By.NAME, "served")).select_by_value(image)
        d.find_element(By.CSS_SELECTOR, "#form-install input[name=reason]").send_keys("from the page")
        navigate(d, d.find_element(By.ID, "button-install").click)
        seen["done_notice"] = text(d, "#done")
        deadline = time.time() + 90
        while True:
            state = text(d, "#install-state")
            if not seen["states"] or seen["states"][-1] != state:
                seen["states"].append(state)
            phase = text(d, "#install-phase")
            if phase and (not seen["phases"] or seen["phases"][-1] != phase):
                seen["phases"].append(phase)
            bars = d.find_elements(By.ID, "install-progress")
            if bars:
                seen["progress"].append([bars[0].get_attribute("value"), bars[0].get_attribute("max")])
            if state in ("installed", "install-failed") or time.time() > deadline:
                break
            time.sleep(0.3)
            navigate(d, d.refresh)
        seen["machine_state"] = text(d, "#state")
        seen["bytes"] = text(d, "#install-bytes")
        seen["result"] = text(d, "#install-result")
        seen["by"] = text(d, "#install-by")
        seen["events"] = [r.find_elements(By.TAG_NAME, "td")[2].text
                          for r in d.find_elements(By.CSS_SELECTOR, "#install-history tr.install-event")]
        d.save_screenshot(png)
    finally:
        d.quit()
    print(json.dumps(seen))


if __name__ == "__main__":
    if sys.argv[1] == "walk":
        walk(*sys.argv[2:8])
    elif sys.argv[1] == "screenshot":
        screenshot(*sys.argv[2:])
    elif sys.argv[1] == "install":
        install(*sys.argv[2:6])
    elif sys.argv[1] == "live":
        live(*sys.argv[2:6])
    elif sys.argv[1] == "console":
        console(*sys.argv[2:5])
    else:
        sys.exit("walk, screenshot, install, live or console")
