"""The browser view in a real headless Chromium (Debian's package, driven by
Playwright) against a real `polyc serve` on loopback: compile an example, expand a
band, read its schedule, apply a legal tile edit and an illegal fusion edit (and see
isl's reason), open the shareable /k/{key}, run on random inputs, and render names
holding markup as text. Screenshots go to artifacts/screenshots/ (kept by CI)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from polyc.server.testing import ServerProcess

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not "
                                "installed (.ci/run installs it: apt-get install chromium)")
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
TIMEOUT_MS = 30_000

# exp -> relu -> transpose: relu and exp share their loops; the transpose reads y
# across rows, so fusing it into relu's kernel would reverse a flow dependence
GRAPH = {"name": "relu_transpose", "inputs": [{"name": "x", "shape": [32, 48]}],
         "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["e"]},
                   {"op": "relu", "inputs": ["e"], "outputs": ["y"]},
                   {"op": "transpose", "inputs": ["y"], "outputs": ["z"]},
                   {"op": "add", "inputs": ["z", "z"], "outputs": ["out"]}],
         "outputs": ["out"]}
EVIL = "<script>alert(1)</script>"
EVIL_GRAPH = {"name": "x<img src=x>", "inputs": [{"name": EVIL, "shape": [4, 8]}],
              "nodes": [{"op": "exp", "inputs": [EVIL], "outputs": ["<b>y</b>"]}],
              "outputs": ["<b>y</b>"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    with ServerProcess(f"sqlite:///{tmp}/cache.sqlite3", workers=1, log_dir=tmp,
                       env={"POLYC_CACHE_DIR": str(tmp)}) as s:
        yield s


@pytest.fixture(scope="module")
def page(server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox"] if os.geteuid() == 0 else [])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # a 4xx the page asked for (an illegal edit) is logged by Chromium: not an error
        page.on("console", lambda m: errors.append(m.text) if m.type == "error"
                and not m.text.startswith("Failed to load resource") else None)
        page.errors = errors
        yield page
        browser.close()


def compile_in_page(page, graph: dict) -> None:
    page.fill("#graph", __import__("json").dumps(graph))
    page.click("#compile-button")
    page.wait_for_url("**/k/*")
    page.wait_for_selector("#result:not([hidden]) details.kernel")


def test_compile_inspect_edit_share_and_run(server, page):
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("#example option").count() >= 3
    page.screenshot(path=str(SHOTS / "01_form.png"))
    compile_in_page(page, GRAPH)
    key = page.url.rsplit("/", 1)[1]
    assert len(key) == 64
    # the fusion decisions, with the oracle's answers
    fusion = page.locator("#fusion li").all_text_contents()
    assert any("fused y into" in line and "legal at depth" in line for line in fusion), fusion
    # the graph before and after decomposition
    assert page.locator("#graph-view svg").count() == 2
    # the transpose's kernel: expand its band and read the schedule
    kernel = page.locator("details.kernel", has_text="_z ·")
    if not kernel.evaluate("d => d.open"):
        kernel.locator("summary").first.click()
    band = kernel.locator(".tree details[data-kind='band']").first
    band.locator("summary").first.click()
    band.locator("summary").first.click()  # closed then open again: it is collapsible
    schedule = band.locator(":scope > .attr").first.text_content()
    assert schedule.startswith("schedule: ") and "S0[i0, i1]" in schedule
    page.screenshot(path=str(SHOTS / "02_compiled.png"), full_page=True)

    # a legal tile edit: recompiled, the tree after the tile pass is offered
    name = kernel.get_attribute("data-kernel")
    kernel.locator(".tile-sizes").fill("8, 16")
    kernel.locator(".tile-apply").click()
    # (no wait_for_function: the page's CSP forbids evaluating strings, as it should)
    page.wait_for_url(lambda url: "/k/" in url and not url.endswith(key))
    page.wait_for_selector(f"details.kernel[data-kernel='{name}'] button[data-pass='tile']")
    tiled_key = page.url.rsplit("/", 1)[1]
    assert "kernel_tile_sizes" in page.locator("#summary").text_content()
    tiled = page.locator(f"details.kernel[data-kernel='{name}']")
    tiled.locator("button[data-pass='tile']").click()
    assert "mod 8" in tiled.locator(".tree-box").text_content()
    # the diff between two passes shows what tiling added
    tiled.locator(".diff-from").select_option("schedule")
    tiled.locator(".diff-to").select_option("tile")
    tiled.locator(".diff-button").click()
    assert tiled.locator(".diff .add").count() > 0

    # an illegal fusion edit: the reason names the dependence, the view stays
    page.fill("#fuse-a", "y")
    page.fill("#fuse-b", "z")
    page.click("#fuse-force")
    page.wait_for_selector("#edit-error:not([hidden])")
    reason = page.locator("#edit-error").text_content()
    assert "fusing z into y is illegal" in reason
    assert "would reverse the flow dependence" in reason and "(y -> z)" in reason
    assert page.url.endswith(tiled_key)
    page.locator("#fusion-edit").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "03_illegal_fusion.png"))

    # provenance: a statement marks its lines of C
    tiled.locator(".stmt").first.click()
    assert page.locator("#csource span.hot").count() >= 1

    # run on random inputs: checked against the reference, time per kernel
    page.click("#run-button")
    page.wait_for_selector("#run table.outputs")
    assert "matches the reference" in page.locator("#run").text_content()
    assert page.locator("#run table.kernel-times tr").count() == 1 + len(
        page.locator("details.kernel").all())

    # the shareable link, opened fresh
    page.goto(f"{server.url}/k/{tiled_key}")
    page.wait_for_selector("details.kernel")
    assert "kernel_tile_sizes" in page.locator("#summary").text_content()
    page.screenshot(path=str(SHOTS / "04_shared_link.png"), full_page=True)
    assert page.errors == []


def test_names_holding_markup_render_as_text(server, page):
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    compile_in_page(page, EVIL_GRAPH)
    # no element was made from a name: the only scripts are the page's own module
    assert page.locator("script").count() == 1
    assert page.locator("img, b").count() == 0
    assert EVIL in page.locator("#graph-view").text_content()
    assert "<b>y</b>" in page.locator("#kernels").text_content()
    assert "x<img src=x>" in page.locator("#summary").text_content()
    page.screenshot(path=str(SHOTS / "05_markup_names.png"))
    assert page.errors == []


def test_unknown_key_says_so(server, page):
    page.goto(f"{server.url}/k/{'0' * 64}")
    page.wait_for_selector("#error:not([hidden])")
    assert "no compiled result is stored" in page.locator("#error").text_content()
    assert httpx.get(server.url + "/").headers["content-security-policy"].startswith("default-src")
