"""The lesson pages of the built site (mkdocs.yml, make docs) in a real browser: Debian's chromium,
headless, 1366 px wide, opens each page with a script that measures it once the page's own
script has run, and writes what it found into the page, which --dump-dom hands back. For each
framework chosen in turn (one click on its tab, which the linked tabs follow in every row):
nothing wider than the window, no code block that scrolls sideways, no string literal broken
across lines inside a word, every row's tab showing that framework's code; and no error, no
console line, nothing loaded from the network, and the page no taller than its bound."""

import html
import json
import re
import shutil

import pytest

from tools import docs_screenshot

pytest.importorskip("mkdocs", reason="the site is built with mkdocs (.venv/base)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("chromium") is None,
        reason="needs chromium (apt-get install chromium; .ci/run installs it)",
    ),
]

FRAMEWORKS = ["PyTorch", "JAX", "MXNet"]  # the tabs' labels
# Each page's height at 1366 px with the tallest framework's tabs chosen, folds closed: what the
# page needs and a few lines more. What a reader may skip (a helper beside the lesson, the
# numbers behind a curve) goes in a fold, which keeps a page within its bound.
BOUNDS = {"lenet": 4350, "resnet18": 4630, "resnet50": 4100, "zero": 4720}

# First in <head>: every error event (a script's, a resource's) and console.error is kept.
LISTEN = """<script>
window.problems = [];
addEventListener("error", e => problems.push("error: " + (e.message
  || (e.target && (e.target.src || e.target.href)) || e.type)), true);
const consoleError = console.error;
console.error = (...a) => { problems.push("console.error: " + a.join(" ")); consoleError(...a); };
</script>"""

# Last in <body>: once the page has loaded and its script has set the page up, each framework
# is chosen in turn and the page measured; then the folds are opened and it is measured again.
MEASURE = """<script>
const doc = document.documentElement;
const STRING = ".highlight :is(.s, .s1, .s2, .sa, .sb, .sc, .dl, .se, .sh, .si, .sx)";
const shown = el => {
  const r = el.getBoundingClientRect();
  return r.width > 0 && r.height > 0 && el.checkVisibility({visibilityProperty: true});
};
const where = el => el.tagName.toLowerCase() + "." + [...el.classList].join(".") + ": "
  + el.textContent.trim().slice(0, 40);

function choose(framework) {
  const label = [...document.querySelectorAll(".tabbed-labels > label")]
    .find(l => shown(l) && l.textContent.trim() === framework);
  if (label) label.click();
}

function wide() {
  const out = [];
  for (const el of document.querySelectorAll("body *")) {
    if (!shown(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.left < -0.5 || r.right > doc.clientWidth + 0.5) out.push("out: " + where(el));
    if (el.matches("pre, code") && el.scrollWidth > el.clientWidth + 0.5)
      out.push("scrolls: " + where(el));
  }
  return out;
}

// A line break between two characters of a string token, neither of them a space.
function broken() {
  const out = [];
  for (const el of document.querySelectorAll(STRING)) {
    if (!shown(el)) continue;
    let top = null, before = " ";
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node; (node = walk.nextNode());) for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i); range.setEnd(node, i + 1);
      const r = range.getBoundingClientRect(), ch = node.data[i];
      if (!r.height) continue;
      if (top !== null && r.top > top + 2 && !/\\s/.test(before) && !/\\s/.test(ch))
        out.push(el.textContent);
      top = r.top; before = ch;
    }
  }
  return out;
}

// Per tab set: whether the framework's tab is the chosen one and shows code.
function tabs(framework) {
  return [...document.querySelectorAll(".tabbed-set")].filter(shown).map(set => {
    const i = [...set.querySelectorAll(":scope > input")].findIndex(x => x.checked);
    const label = set.querySelectorAll(":scope > .tabbed-labels > label")[i];
    const block = set.querySelectorAll(":scope > .tabbed-content > .tabbed-block")[i];
    const code = block && [...block.querySelectorAll("pre code")].find(shown);
    return Boolean(label && label.textContent.trim() === framework && code
      && code.innerText.trim());
  });
}

function measure(open) {
  if (open) for (const d of document.querySelectorAll("details")) d.open = true;
  return Object.fromEntries(FRAMEWORKS.map(f => {
    choose(f);
    return [f, {height: doc.scrollHeight, wide: wide(), broken: broken(), tabs: tabs(f)}];
  }));
}

addEventListener("load", () => setTimeout(() => {
  const closed = measure(false), open = measure(true);
  const remote = performance.getEntriesByType("resource").map(e => e.name)
    .filter(url => !url.startsWith("file:"));
  const out = document.createElement("pre");
  out.id = "lesson-check";
  out.textContent = JSON.stringify({width: innerWidth, scrollWidth: doc.scrollWidth,
    clientWidth: doc.clientWidth, closed, open, remote, problems});
  document.body.append(out);
}, 500));
</script>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from tests.common.test_lessons import build_site

    return build_site(tmp_path_factory.mktemp("site"))


def measure(site, workload: str, plant: str = "") -> dict:
    """What MEASURE finds on `workload`'s page (with `plant` added to its body), and chromium's
    console lines. The page is measured as a copy beside it, so that its links still resolve."""
    page = (site / "lessons" / f"{workload}.html").read_text()
    page = page.replace("<head>", "<head>" + LISTEN, 1)
    script = f"<script>const FRAMEWORKS = {json.dumps(FRAMEWORKS)};</script>" + MEASURE
    check = f"lessons/{workload}-check.html"
    (site / check).write_text(page.replace("</body>", plant + script + "</body>", 1))
    # The budget lets the timers of the page and of MEASURE run before the page is dumped.
    flags = ["--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom"]
    done = docs_screenshot.browse(site, check, *flags)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="lesson-check">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the page did not run its check: {done.stderr[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    result["console"] = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return result


def height(found: dict) -> int:
    return max(view["height"] for view in found["closed"].values())


@pytest.mark.parametrize("workload", list(BOUNDS))
def test_each_page_fits_1366_px_one_framework_at_a_time(site, workload):
    found = measure(site, workload)
    assert found["width"] == docs_screenshot.WINDOW[0]
    assert found["scrollWidth"] <= found["clientWidth"] <= found["width"], found
    for state in ("closed", "open"):
        for framework, view in found[state].items():
            assert view["wide"] == [], (state, framework)
            assert view["broken"] == [], (state, framework)
    for framework, view in found["open"].items():  # some code is in a fold
        assert view["tabs"] and all(view["tabs"]), (framework, view["tabs"])
    assert height(found) <= BOUNDS[workload], {f: v["height"] for f, v in found["closed"].items()}
    assert found["remote"] == []
    assert found["problems"] == [] and found["console"] == []


def test_the_check_sees_a_planted_fault(site):
    """Code that scrolls sideways, strings broken anywhere, JAX's tabs showing no code, a page
    too tall, an error, a missing image and a file from the network: each is seen (the test
    above can fail)."""
    plant = (
        "<style>.tabbed-block .highlight code{font-size:1.3rem!important}"
        ".side-by-side .highlight code,.side-by-side .highlight code *"
        "{white-space:pre-wrap!important;word-break:break-all!important}"
        ".tabbed-block:nth-child(2) .highlight{display:none}</style>"
        '<div style="height:5000px"></div><img src="missing.png">'
        '<img src="http://127.0.0.1:9/remote.png"><script>console.error("planted")</script>'
    )
    found = measure(site, "resnet18", plant)
    views = found["open"]
    assert any(w.startswith("scrolls: code") for w in views["PyTorch"]["wide"])
    assert views["PyTorch"]["broken"] and views["MXNet"]["broken"]
    assert all(views["PyTorch"]["tabs"]) and not any(views["JAX"]["tabs"])
    assert height(found) > BOUNDS["resnet18"]
    assert any("planted" in p for p in found["problems"])
    assert any("missing.png" in p for p in found["problems"])
    assert any("127.0.0.1:9" in url for url in found["remote"])
    assert any("planted" in line for line in found["console"])
