"""report.html: one self-contained page, opened in a real headless Chromium (Debian's `chromium`).

How the browser is driven: `chromium --headless --dump-dom` loads a copy of the page to which the test
adds one small script; on the window's load event (which waits for every image to be decoded) it
writes each image's state into the DOM, and --dump-dom prints the DOM after that event. One process
per check, no driver or DevTools client to install, and nothing in the page itself runs a script.
"""
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlaunch.cli import app
from prerequisites import require
from test_analysis import write_run
from test_report import NO_RAPL, PROFILE, SITE, embedded

# Chromium as root in a container: no sandbox, no GPU, nothing fetched from the network, a fresh profile.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
IMAGE_STATE = ("<script>window.addEventListener('load', () => document.body.setAttribute('data-images', "
               "JSON.stringify(Array.from(document.images, i => [i.alt, i.complete, i.naturalWidth]))))</script>")
WINDOW = (1280, 2000)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    browser = shutil.which("chromium")
    require(browser is not None, "chromium is not installed (scripts/bootstrap.sh full installs it)")
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run([browser, *CHROMIUM_FLAGS, "--user-data-dir=%s" % profile, *args],
                          capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture
def report(tmp_path):
    """A report with every figure: a sweep with profiles, accuracies and energy, a diverged run, a link-free page."""
    runs = tmp_path / "runs"
    for gpus, x, top1 in ((4, 950.0, 0.70), (8, 1700.0, 0.68), (16, 3000.0, 0.65)):
        write_run(runs, "g%d" % gpus, gpus, [100.0, x], top1=[0.3, top1], profile=PROFILE,
                  energy=[{"gpu": 1000.0 * gpus, "cpu": NO_RAPL}] * 2)
    write_run(runs, "<i>odd|<i>-g8", 8, [100.0, 99999.0], end=dict(status="diverged", reason="the loss was not finite"))
    site = tmp_path / "testsite.toml"
    site.write_text(SITE)
    out = tmp_path / "report"
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["report", str(runs), "-o", str(out), "--site", str(site)])
    assert result.exit_code == 0, result.output
    return out


class Page(HTMLParser):
    """What a page refers to and says: tags, the values of src/href, its visible text."""

    def __init__(self):
        super().__init__()
        self.tags, self.references, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.references += [value for name, value in attrs if name in ("src", "href") and value]

    def handle_data(self, data):
        self.text.append(data)


def test_the_page_is_self_contained(report):
    page = Page()
    page.feed((report / "report.html").read_text())
    figures = embedded((report / "report.md").read_text())
    assert len(figures) == 7  # throughput, speed-up, E_G, energy, time shares, accuracy against batch and epoch
    images = [r for r in page.references if r.startswith("data:image/png;base64,")]
    anchors = [r for r in page.references if r.startswith("#")]
    assert len(images) == len(figures) and sorted(images + anchors) == sorted(page.references)  # nothing outside
    assert "script" not in page.tags
    text = "".join(page.text)
    for wanted in ("Scaling", "Runs", "Plots", "Diverged runs", "Provenance", "<i>odd|<i>-g8", "PASS -5.0%", "1700.0"):
        assert wanted in text  # the run name's markup shown as text, not obeyed


def test_chromium_loads_every_image_of_the_page(report, tmp_path):
    page = (report / "report.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", IMAGE_STATE + "</body>"))
    dom = chromium(tmp_path, "--dump-dom", probe.as_uri()).stdout
    state = re.search(r'data-images="([^"]*)"', dom)
    assert state, dom[:2000]
    images = json.loads(state.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    figures = embedded((report / "report.md").read_text())
    assert len(images) == len(figures) == 7
    assert all(complete and width > 0 for _, complete, width in images), images  # every image decoded
    assert re.search(r"<td>g16</td>", dom) and "<h1" in dom  # the page is not empty


def test_a_screenshot_of_the_page_shows_more_than_a_blank_window(report, tmp_path):
    """The screenshot the README describes: title, contents, the scaling and runs tables, then the first plots."""
    from PIL import Image

    shot = tmp_path / "report.png"
    chromium(tmp_path, "--screenshot=%s" % shot, "--window-size=%d,%d" % WINDOW, (report / "report.html").as_uri())
    with Image.open(shot) as image:
        assert image.size == WINDOW
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # text, tables and plots, not one blank colour
