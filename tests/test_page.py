"""The page (`/` on the daemon, `gpuwear report --html`) in a real browser: Debian's Chromium, headless, driven by
ChromeDriver. At desktop and phone widths: screenshots (kept in tests/out/page/), no console error, the verdict and
the answer in words within the first screen, and every figure on the page equal to `gpuwear report --json`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver

from helpers import fetch, free_port, require, run_simulated, slow_fixture, started, wait_for

OUT = Path(__file__).parent / "out" / "page"
WIDTHS = {"desktop": (1280, 900), "phone": (390, 844)}

def gpuwear(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwear", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
@slow_fixture
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About six simulated hours of the demo (a GeForce and an H100), saved."""
    folder = tmp_path_factory.mktemp("state")
    run_simulated(folder, "demo", 3600.0, 6.0)
    return folder


@pytest.fixture(scope="module")
@slow_fixture
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, driver = require("chromium"), require("chromedriver")
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    b = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield b
    finally:
        b.quit()


JARGON = ("central estimate", "arrhenius", "coffin", "manson", " ea ", "ev)", "peak term", "equivalent", "parameter",
          "norris", "miner")


def _look(browser: Any, url: str, name: str) -> dict[str, Any]:
    """The page at each width: screenshot, console errors, what the first screen shows, the figures."""
    from selenium.webdriver.common.by import By

    OUT.mkdir(parents=True, exist_ok=True)
    seen: dict[str, Any] = {}
    for width_name, (width, height) in WIDTHS.items():
        browser.set_window_size(width, height)
        browser.get(url)
        browser.save_screenshot(str(OUT / f"{name}-{width_name}.png"))
        errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        inner = browser.execute_script("return window.innerHeight")
        first = browser.find_element(By.CSS_SELECTOR, "section.gpu")
        verdict = first.find_element(By.CSS_SELECTOR, "[data-figure=status]")
        # the answer in one sentence (issue 53), above the badge, in words without the models' jargon; the badge
        answer = first.find_element(By.CSS_SELECTOR, "[data-figure=answer]")
        assert verdict.location["y"] < inner, f"{width_name}: the verdict is below the first screen"
        assert answer.location["y"] + answer.size["height"] <= inner, f"{width_name}: the answer is not on the first " \
            "screen"
        assert answer.location["y"] < verdict.location["y"], f"{width_name}: the answer comes after the badge"
        assert not [j for j in JARGON if j in answer.text.lower()], answer.text
        overflow = browser.execute_script("return document.documentElement.scrollWidth > window.innerWidth")
        assert not overflow, f"{width_name}: the page is wider than the screen"
        # chart text at least 11 px as drawn (its font size times the SVG's scale on this screen)
        smallest = browser.execute_script(
            "return Math.min(...[...document.querySelectorAll('svg text')].map("
            "t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a))")
        assert smallest >= 11, f"{width_name}: chart text drawn at {smallest:.1f} px"
        # a limit's label is never covered by a column of the histogram
        covered = browser.execute_script(
            "const out = []; for (const t of document.querySelectorAll('svg text.limit')) {"
            " const a = t.getBoundingClientRect();"
            " for (const r of t.closest('svg').querySelectorAll('rect')) { const b = r.getBoundingClientRect();"
            "  if (b.width && b.height && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)"
            "   { out.push(t.textContent); break; } } } return out;")
        assert not covered, f"{width_name}: limit labels covered by columns: {covered}"
        # issue 53: no chart text runs into a bar, a column, a whisker or a limit's line ("gaming 4 h a day" into its
        # bar, a limit's label across another limit's line at 1280 px)
        crossed = browser.execute_script(
            "const out = []; for (const t of document.querySelectorAll('svg text')) {"
            " const a = t.getBoundingClientRect();"
            " for (const r of t.closest('svg').querySelectorAll('rect, line, path')) {"
            "  if (r.tagName === 'line' && r.getAttribute('y1') === r.getAttribute('y2')) continue;"  # the baseline
            "  const b = r.getBoundingClientRect();"
            "  if (a.left < b.right - 0.5 && b.left + 0.5 < a.right"
            "      && a.top < b.bottom - 0.5 && b.top + 0.5 < a.bottom) { out.push(t.textContent); break; } } }"
            " return out;")
        assert not crossed, f"{width_name}: chart text crossing a shape: {crossed}"
        # every bar of an estimate against everyday use carries its band
        unbanded = browser.execute_script(
            "return [...document.querySelectorAll('.card svg')].filter("
            "s => s.querySelectorAll('rect').length !== s.querySelectorAll('path.band').length).length")
        assert unbanded == 0, f"{width_name}: {unbanded} estimate chart(s) with bars without their band"
        seen[width_name] = {
            section.get_attribute("id"): {e.get_attribute("data-figure"): e.get_attribute("data-value")
                                          for e in section.find_elements(By.CSS_SELECTOR, "[data-figure]")}
            for section in browser.find_elements(By.CSS_SELECTOR, "section.gpu")}
        seen[f"{width_name}_text"] = browser.find_element(By.TAG_NAME, "body").text
    return seen


def _same_figures(figures: dict[str, dict[str, str]], doc: dict[str, Any]) -> None:
    assert set(figures) == {g["uuid"] for g in doc["gpus"]}
    for g in doc["gpus"]:
        f = figures[g["uuid"]]
        assert f["status"] == g["health"]["status"]
        assert float(f["observed_seconds"]) == g["observed_seconds"]
        assert float(f["coverage_ratio"]) == g["coverage_ratio"]
        assert float(f["energy_joules"]) == g["energy_joules"]
        assert float(f["thermal_aging_central_hours"]) == g["thermal_aging_equivalent_hours"]["central"]
        assert float(f["cycle_fatigue_central"]) == g["cycle_fatigue_equivalent_cycles"]["central"]


@pytest.mark.slow
def test_the_report_page_in_a_browser(state: Path, browser: Any) -> None:
    page = state / "report.html"
    r = gpuwear("report", "--simulated", "--state-dir", str(state), "--html", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace('href="/metrics"', "")  # self-contained
    seen = _look(browser, page.as_uri(), "report")
    doc = json.loads(gpuwear("report", "--simulated", "--state-dir", str(state), "--json").stdout)
    for width in WIDTHS:
        _same_figures(seen[width], doc)
    assert {p.name for p in OUT.glob("report-*.png")} == {f"report-{w}.png" for w in WIDTHS}
    text = seen["phone_text"]
    assert "Simulated GPUs" in text and "nothing it reports asks for action" in text
    assert "Not known: this card reports neither ECC counters nor memory temperature" in text  # once, not headline
    assert text.count("Not known:") == 1


@pytest.mark.slow
def test_a_cards_passport_in_a_browser(state: Path, browser: Any) -> None:
    """Issue 55, item 5: the passport a buyer reads (`gpuwear passport GPU --html`), at both widths: self-contained,
    the card's verdict and answer on the first screen under the passport's heading, what it cannot know after the
    card, and every figure that of `passport --json`."""
    page = state / "passport.html"
    r = gpuwear("passport", "1", "--simulated", "--state-dir", str(state), "--html", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace('href="/metrics"', "")
    seen = _look(browser, page.as_uri(), "passport")
    doc = json.loads(gpuwear("passport", "1", "--simulated", "--state-dir", str(state), "--json").stdout)
    for width in WIDTHS:
        _same_figures(seen[width], doc)
    text = seen["phone_text"]
    assert text.startswith("Passport of NVIDIA H100 80GB HBM3\n"), text[:80]
    assert text.index("matches the file's content") < text.index("GPU-00000001-5111") < text.index(
        "Not known: the card's age") and "NVML and DCGM keep no power-on hours" in text


@pytest.mark.slow
def test_the_fleets_answer_in_a_browser(browser: Any) -> None:
    """Issue 56, item 3: `gpuwear fleet --html`, the answer as a page, at both widths: no console error, nothing wider
    than the screen (its tables scroll within), each bucket's figures those of the JSON, the association or its
    absence said, and a hostile product name shown as text."""
    from selenium.webdriver.common.by import By

    from gpuwear.fleet.answer import YEAR_SECONDS, Card, answer
    from gpuwear.fleet.html import render

    cards = [Card(f"GPU-{i:03d}", "NVIDIA H100 80GB HBM3" if i < 16 else "<script>x</script>",
                  f"node-{i // 8}:9941 GPU {i % 8}", 100.0 * (i + 1), YEAR_SECONDS, (i % 16) // 12 * 3)
             for i in range(24)]
    doc = answer(cards)
    result = {"schema_version": 1, "store": "https://thanos.example:10902", "source": "recording rules",
              "span_seconds": 90 * 86400.0, "at": 1.79e9, "earliest": None, "retention_short": None,
              "cards": [vars(c) for c in cards], **doc, "cannot_see": ["cards never scraped into this store"],
              "cost": {"queries": 7, "bytes": 4000}}
    OUT.mkdir(parents=True, exist_ok=True)
    page = OUT / "fleet.html"
    page.write_text(render(result, "90d"))
    assert "<script>x" not in page.read_text()
    for width_name, (width, height) in WIDTHS.items():
        browser.set_window_size(width, height)
        browser.get(page.as_uri())
        browser.save_screenshot(str(OUT / f"fleet-{width_name}.png"))
        assert not [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not browser.execute_script("return document.documentElement.scrollWidth > window.innerWidth"), \
            width_name
        rows = [(r.get_attribute("data-bucket"),
                 r.find_element(By.CSS_SELECTOR, "[data-figure=rate]").get_attribute("data-value"))
                for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-bucket]")]
        assert rows == [(str(b["bucket"]), str(b["rate_per_gpu_year"])) for p in doc["products"]
                        for b in p["buckets"]], rows
        text = browser.find_element(By.TAG_NAME, "body").text
        assert "<script>x</script>" in text and "Association, not cause" in text


@pytest.mark.slow
def test_the_daemon_serves_it_at_the_root(state: Path, browser: Any, tmp_path: Path) -> None:
    """`/` on a running daemon (x1: no save for a minute, so the page and `report --json` read the same ledger),
    behind the same door as /metrics."""
    port = free_port()
    with started([sys.executable, "-m", "gpuwear", "run", "--simulate", "--listen", f"127.0.0.1:{port}",
                  "--state-dir", str(state)], tmp_path / "daemon.log", tmp_path):
        wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_gpu_up", 30.0)
        status, body = fetch(f"http://127.0.0.1:{port}/")
        assert status == 200 and "Is deep learning wearing these cards?" in body and "as of the last save" in body
        seen = _look(browser, f"http://127.0.0.1:{port}/", "daemon")
        doc = json.loads(gpuwear("report", "--simulated", "--state-dir", str(state), "--json").stdout)
    _same_figures(seen["desktop"], doc)


@pytest.mark.slow
def test_the_stress_scenario_page_keeps_its_limits_readable(browser: Any, tmp_path: Path) -> None:
    """The stress scenario runs the die at its limits: there the histogram's columns covered the "slowdown" label
    and the max line, at exactly the moment they matter. Its page at both widths: no label covered, no chart text
    under 11 px, every estimate's bar with its band, the figures those of `report --json`."""
    run_simulated(tmp_path, "stress", 3600.0, 7.0)
    page = tmp_path / "stress.html"
    r = gpuwear("report", "--simulated", "stress", "--state-dir", str(tmp_path), "--html", str(page))
    assert r.returncode == 0, r.stderr
    assert 'class="limit"' in page.read_text()
    seen = _look(browser, page.as_uri(), "stress")
    doc = json.loads(gpuwear("report", "--simulated", "stress", "--state-dir", str(tmp_path), "--json").stdout)
    for width in WIDTHS:
        _same_figures(seen[width], doc)


@pytest.mark.slow
def test_the_page_of_real_imported_traces(browser: Any, tmp_path: Path) -> None:
    """Issue 30: the page of real logs, not only of simulated cards. The three traces of tests/fixtures/traces
    (an RTX 4060 laptop and an RTX 6000 Ada at 1 s, an A100 at 12 ms), each imported as its own card: at both
    widths, the verdict and the answer on the first screen, nothing wider than the screen, no chart text under
    11 px, no limit label covered, every estimate's bar with its band, the figures those of `report --json`."""
    traces = Path(__file__).parent / "fixtures" / "traces"
    names = {"rtx4060laptop_gpuburn-cycles_1s_llm-gpu-stress.csv": "GPU-trace-rtx4060",
             "rtx6000ada_burst-then-idle_1s_llm-gpu-stress.csv": "GPU-trace-rtx6000ada",
             "a100_load-pulses_12ms_gpu-power-benchmark.csv": "GPU-trace-a100"}
    for name, uuid in names.items():
        r = gpuwear("import", "nvidia-smi", str(traces / name), "--gpu", uuid, "--timezone", "UTC", "--state-dir",
                    str(tmp_path))
        assert r.returncode == 0, r.stderr
    page = tmp_path / "traces.html"
    r = gpuwear("report", "--state-dir", str(tmp_path), "--html", str(page))
    assert r.returncode == 0, r.stderr
    seen = _look(browser, page.as_uri(), "traces")
    doc = json.loads(gpuwear("report", "--state-dir", str(tmp_path), "--json").stdout)
    assert {g["uuid"] for g in doc["gpus"]} == set(names.values())
    # what a log cannot hold is not claimed as watched: error rates and stalls are the live daemon's
    assert "Its health verdict watches" in seen["phone_text"] and "bleed under load" not in seen["phone_text"]
    for width in WIDTHS:
        _same_figures(seen[width], doc)
