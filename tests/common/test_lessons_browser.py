"""The lesson pages (tools/lessons.py) in a real browser: Debian's chromium, headless, 1366 px
wide, opens each HTML page with a script that opens every fold, measures the page and writes what
it found into it, which --dump-dom hands back. Nothing may be wider than the window (the page, a
pre, a code), every row must show every framework's code (and one framework alone when its view
is chosen), and nothing may reach the console."""

import html
import json
import re
import shutil

import pytest

from tools import lessons, lessons_render

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="needs chromium (apt-get install chromium; .ci/run installs it)",
)

# First in <head>: every error event (a script's, a resource's) and console.error is kept.
LISTEN = """<script>
window.problems = [];
addEventListener("error", e => problems.push("error: " + (e.message
  || (e.target && (e.target.src || e.target.href)) || e.type)), true);
const consoleError = console.error;
console.error = (...a) => { problems.push("console.error: " + a.join(" ")); consoleError(...a); };
</script>"""

# Last in <body>, run once the page has loaded: the folds opened (their code must fit too), then
# the page measured.
MEASURE = """<script>addEventListener("load", () => {
  for (const d of document.querySelectorAll("details")) d.open = true;
  const doc = document.documentElement, wide = [];
  const where = el => el.tagName.toLowerCase() + "." + el.className + " in #"
    + (el.closest("section") || {id: "header"}).id;
  for (const el of document.querySelectorAll("body *")) {
    const r = el.getBoundingClientRect();
    if (r.width && (r.left < -0.5 || r.right > doc.clientWidth + 0.5))
      wide.push("out: " + where(el));
    if (el.matches("pre, code, .code") && el.clientWidth && el.scrollWidth > el.clientWidth)
      wide.push("scrolls: " + where(el));
  }
  const rows = [...document.querySelectorAll("main section")].map(s => [s.id,
    Object.fromEntries(FRAMEWORKS.map(f => {
      const code = s.querySelector(".col." + f + " .code");
      const file = s.querySelector(".col." + f + " h3");
      const r = code ? code.getBoundingClientRect() : {width: 0, height: 0};
      return [f, Boolean(r.width > 0 && r.height > 0 && code.innerText.trim()
        && getComputedStyle(code).visibility === "visible"
        && file && file.textContent.startsWith(f + "_impl/"))];
    }))]);
  // One framework at a time (the radio buttons at the top): its column alone, still fitting.
  const views = Object.fromEntries(FRAMEWORKS.map(f => {
    document.getElementById("v-" + f).checked = true;
    const alone = [...document.querySelectorAll("main section")].every(s =>
      FRAMEWORKS.every(g => (s.querySelector(".col." + g).offsetWidth > 0) === (g === f)));
    return [f, alone && doc.scrollWidth <= doc.clientWidth];
  }));
  document.getElementById("v-all").checked = true;
  const out = document.createElement("pre");
  out.id = "lesson-check";
  out.textContent = JSON.stringify({width: innerWidth, scrollWidth: doc.scrollWidth,
    clientWidth: doc.clientWidth, wide: wide.slice(0, 20), rows, views, problems});
  document.body.append(out);
});</script>"""


def measure(page: str, tmp_path) -> dict:
    """What MEASURE finds in `page` (HTML text) at WINDOW, and chromium's console lines."""
    frameworks = f"<script>const FRAMEWORKS = {json.dumps(lessons.FRAMEWORKS)};</script>"
    path = tmp_path / "page.html"
    page = page.replace("<head>", "<head>" + LISTEN, 1)
    path.write_text(page.replace("</body>", frameworks + MEASURE + "</body>", 1))
    done = lessons_render.chromium("--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="lesson-check">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the page did not run its check: {done.stderr[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    result["console"] = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return result


@pytest.mark.parametrize("workload", list(lessons.ROWS))
def test_each_page_fits_1366_px_and_shows_every_framework(workload, tmp_path):
    found = measure(lessons.html_page(workload), tmp_path)
    assert found["width"] == lessons_render.WINDOW[0]
    assert found["scrollWidth"] <= found["clientWidth"] <= found["width"], found
    assert found["wide"] == []
    rows = [lessons_render.slug(row.concept) for row in lessons.ROWS[workload]]
    assert [row for row, _ in found["rows"]] == rows
    for row, seen in found["rows"]:
        assert seen == dict.fromkeys(lessons.FRAMEWORKS, True), row
    assert found["views"] == dict.fromkeys(lessons.FRAMEWORKS, True)
    assert found["problems"] == [] and found["console"] == []


def test_the_check_sees_a_planted_fault(tmp_path):
    """Code that does not wrap, a framework's code hidden in one row, a view that shows another
    framework's too, an error and a missing image: each is seen (the test above can fail)."""
    plant = (
        "<style>.code pre{white-space:pre}#train .col.jax .code{visibility:hidden}"
        "#v-jax:checked~main .col.torch{display:block}</style>"
        '<img src="missing.png"><script>console.error("planted")</script></body>'
    )
    found = measure(lessons.html_page("resnet18").replace("</body>", plant, 1), tmp_path)
    assert found["scrollWidth"] > found["width"] or any("scrolls" in w for w in found["wide"])
    assert any(w.startswith("scrolls: pre") for w in found["wide"])
    assert dict(found["rows"])["train"]["jax"] is False
    assert dict(found["rows"])["train"]["torch"] is True
    assert found["views"]["jax"] is False
    assert any("planted" in p for p in found["problems"])
    assert any("missing.png" in p for p in found["problems"])
    assert any("planted" in line for line in found["console"])
