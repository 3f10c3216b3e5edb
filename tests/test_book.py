"""The book builds with warnings as errors, executing every chapter, and reads well in a browser.

The book is built once per test session, into a temporary folder; the browser tests open
its pages in headless Chromium (``tests/browser.py``), served from 127.0.0.1 with every other
host unreachable, and write a screenshot of each page to ``<build>/_build/screenshots/``.
"""

import html as html_module
import re
from urllib.parse import unquote, urldefrag, urlparse

import pytest
import yaml

from autograder.paths import REPO, chapter_ids
from tests.browser import Browser, Site
from tests.figures import alt_text_problems
from tests.notebooks import CHAPTERS

pytestmark = pytest.mark.slow

CONFIG = yaml.safe_load((REPO / "_config.yml").read_text())
ROOT = yaml.safe_load((REPO / "_toc.yml").read_text())["root"]  # the landing page
REPOSITORY = CONFIG["repository"]["url"]
# Papers the chapters rely on: each is in references.bib and cited on the landing page.
PAPERS = {
    "sutskever2014sequence": "Sutskever",
    "cho2014learning": "Cho",
    "bahdanau2015neural": "Bahdanau",
    "luong2015effective": "Luong",
    "vaswani2017attention": "Vaswani",
    "shaw2018self": "Shaw",
    "su2021roformer": "Su",
    "press2022train": "Press",
    "raffel2020exploring": "Raffel",
    "rabe2021self": "Rabe",
    "dao2022flashattention": "Dao",
    "katharopoulos2020transformers": "Katharopoulos",
    "choromanski2021rethinking": "Choromanski",
    "wang2020linformer": "Wang",
    "beltagy2020longformer": "Beltagy",
    "ainslie2023gqa": "Ainslie",
    "dosovitskiy2021image": "Dosovitskiy",
    "velickovic2018graph": "Veli",
    "sukhbaatar2015end": "Sukhbaatar",
    "lewis2020retrieval": "Lewis",
    "jaegle2021perceiver": "Jaegle",
    "abnar2020quantifying": "Abnar",
    "jain2019attention": "Jain",
    "wiegreffe2019attention": "Wiegreffe",
    "zhang2019root": "Zhang",
    "shazeer2020glu": "Shazeer",
    "holtzman2020curious": "Holtzman",
    "tillet2019triton": "Tillet",
}


def _text(page: str) -> str:
    return re.sub(r"<[^>]+>", "", page)


def _toc_pages() -> list[str]:
    """Every page of the table of contents, as its path in the built book."""
    toc = (REPO / "_toc.yml").read_text()
    return [f"{ROOT}.html"] + [
        f"{name}.html" for name in re.findall(r"file:\s*(\S+)", toc)
    ]


@pytest.mark.parametrize("chapter", chapter_ids())
def test_every_chapter_page_exists(html, chapter):
    assert (html / "chapters" / chapter / f"{chapter}.html").exists()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_complete_chapter_page_shows_figures_and_no_errors(html, chapter):
    page = (html / "chapters" / chapter / f"{chapter}.html").read_text()
    assert len(re.findall(r'<img [^>]*src="[^"]*_images/[^"]+\.png"', page)) >= 2
    assert "Traceback" not in page and "output traceback" not in page
    assert "BEGIN SOLUTION" not in page and "run_hidden_test" not in page
    assert "raise NotImplementedError" in _text(
        page
    )  # the page shows the stubs, not the answers
    assert "\N{CHECK MARK}" in page  # the visible checks ran (on the reference)


def _figure_alts(page_html: str) -> list[tuple[str, str | None]]:
    """``(src, alt)`` of every figure an executed cell or a figure directive put on a page."""
    found = []
    for tag in re.findall(r"<img\b[^>]*>", page_html):
        src = re.search(r'\bsrc="([^"]*)"', tag)
        if src and "_images/" in src.group(1):
            alt = re.search(r'\balt="([^"]*)"', tag)
            found.append(
                (src.group(1), html_module.unescape(alt.group(1)) if alt else None)
            )
    return found


@pytest.mark.parametrize("page", _toc_pages())
def test_every_figure_says_what_it_shows(html, page):
    """A text alternative of a sentence or more, not a file name, and no two the same."""
    alts = _figure_alts((html / page).read_text())
    assert not alt_text_problems([(f"{page}: {src}", alt) for src, alt in alts])


def test_citations_resolve_to_the_bibliography(html):
    refs = _text((html / "references.html").read_text())
    assert "Attention is all you need" in refs and "Vaswani" in refs
    page = (
        html / "chapters" / "03_self_attention" / "03_self_attention.html"
    ).read_text()
    assert 'href="../../references.html#id' in page


def test_the_landing_page_cites_every_paper_the_course_relies_on(html):
    bib = (REPO / "references.bib").read_text()
    intro = (REPO / f"{ROOT}.md").read_text()
    landing = (html / f"{ROOT}.html").read_text()
    # a citation is a link to its entry, titled with the entry's text
    cited = " ".join(
        re.findall(r'href="references.html#[^"]+" title="([^"]+)"', landing)
    )
    for key, author in PAPERS.items():
        assert re.search(rf"@\w+\{{{key},", bib), (
            f"{key} is missing from references.bib"
        )
        assert f"`{key}`" in intro, (
            f"the landing page's reading list does not cite {key}"
        )
        assert author in cited, f"{author}'s citation on the landing page is not a link"


@pytest.mark.parametrize("page", _toc_pages())
def test_every_page_footer_shows_version_licences_and_the_about_page(html, page):
    text = (html / page).read_text()
    footer = re.search(r'<p class="course-footer">(.*?)</p>', text, re.S)
    assert footer, f"{page} has no course footer"
    version = (REPO / "VERSION").read_text().strip()
    assert f"Course version {version}" in footer.group(1)
    assert "CC BY 4.0" in footer.group(1) and "MIT" in footer.group(1)
    link = re.search(r'href="([^"]*)">Licence, changes', footer.group(1)).group(1)
    here = html / page
    about = here if link == "#" else here.parent.joinpath(urldefrag(link)[0])
    assert about.resolve() == (html / "book" / "about.html").resolve()


def test_about_page_cites_the_course_as_citation_cff_does(html):
    from autograder.release import bibtex

    text = (html / "book" / "about.html").read_text()
    assert "Cite this course" in text
    assert bibtex() in html_module.unescape(_text(text))


def test_book_is_offline_ready(html):
    """Scripts and styles come with the book (MathJax too), never from a CDN."""
    for page in _toc_pages():
        text = (html / page).read_text()
        for tag in re.findall(r"<(?:script|link)\b[^>]*>", text):
            if 'rel="canonical"' in tag:  # names the published address, loads nothing
                continue
            url = re.search(r'\b(?:src|href)="([^"]+)"', tag)
            assert not (url and url.group(1).startswith(("http:", "https:", "//"))), (
                f"{page} loads {url.group(1)}"
            )
    assert (html / "_static" / "mathjax" / "tex-chtml-full.js").exists()


# In the browser ---------------------------------------------------------------------------

# Run in each page once it has loaded: waits for MathJax and the images, then reports.
INSPECT = """
for (const img of document.images) img.loading = "eager";
if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
  await MathJax.startup.promise;
}
await Promise.all([...document.images].map((img) => img.complete ? null :
  new Promise((done) => { img.onload = done; img.onerror = done; })));
const math = [...document.querySelectorAll("main .math")];
return {
  mathjax: window.MathJax && MathJax.version ? MathJax.version : null,
  math: math.length,
  untypeset: math.filter((m) => !m.querySelector("mjx-container")).length,
  texErrors: document.querySelectorAll("mjx-merror").length,
  // MathJax's assistive MathML: what a screen reader reads for each formula
  assistive: document.querySelectorAll("main mjx-container > mjx-assistive-mml math").length,
  typeset: document.querySelectorAll("main mjx-container").length,
  figures: [...document.querySelectorAll("main img")].map(
    (img) => ({src: img.src, loaded: img.complete && img.naturalWidth > 0})),
  links: [...document.querySelectorAll("a[href]")].map((a) => a.href),
  bar: [...document.querySelectorAll(".course-launch-bar a")].map(
    (a) => ({text: a.textContent.trim(), href: a.href})),
  errors: document.querySelectorAll("main .output.traceback, main .output.error").length,
  text: document.querySelector("main").innerText,
};
"""


# GitHub Pages serves a project's book under /<repository name>/; so do the tests.
PREFIX = "/" + urlparse(REPOSITORY).path.strip("/").split("/")[-1] + "/"


# The browser lives for this module only: while Playwright's sync API is alive, the main
# thread has a running asyncio loop, and the later tests' kernels (nbclient's asyncio.run)
# could not start.
@pytest.fixture(scope="module")
def site(html):
    served = Site(html, PREFIX)
    yield served
    served.close()


@pytest.fixture(scope="module")
def browser():
    chromium = Browser()
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def visit(html, site, browser):
    """Open a page of the book (once per session): a ``Visit``."""
    seen = {}

    def open_page(page: str):
        if page not in seen:
            shot = (
                html.parent
                / "screenshots"
                / page.replace("/", "_").replace(".html", ".png")
            )
            # axe-core's light-theme check runs on the same load (no second one)
            seen[page] = browser.visit(site.url + page, INSPECT, shot, axe=True)
        return seen[page]

    return open_page


def _chapter_page(chapter: str) -> str:
    return f"chapters/{chapter}/{chapter}.html"


@pytest.mark.parametrize("page", _toc_pages())
def test_page_loads_only_from_the_book_and_its_links_resolve(html, site, visit, page):
    seen = visit(page)
    report = seen.value
    assert seen.status == 200, f"{page}: HTTP {seen.status}"
    outside = [
        u for u in seen.requested if not u.startswith((site.url, "data:", "blob:"))
    ]
    assert not outside, f"{page} loads from outside the book: {outside}"
    assert not seen.failed, f"{page}: requests failed: {seen.failed}"
    assert not seen.errors, f"{page}: JavaScript errors: {seen.errors}"
    for link in report["links"]:
        if not link.startswith(site.url):
            continue
        url, fragment = urldefrag(link)
        path = html / unquote(url[len(site.url) :].split("?")[0])
        if path.is_dir():
            path = path / "index.html"
        assert path.exists(), f"{page}: broken link {link}"
        if fragment and path.suffix == ".html":
            assert f'id="{unquote(fragment)}"' in path.read_text(), (
                f"{page}: link to a missing anchor {link}"
            )
    assert not report["errors"], f"{page} shows an error output"
    assert "Traceback (most recent call last)" not in report["text"]
    assert all(f["loaded"] for f in report["figures"]), (
        f"{page}: images that do not load: "
        f"{[f['src'] for f in report['figures'] if not f['loaded']]}"
    )


@pytest.mark.parametrize("chapter", chapter_ids())
def test_chapter_page_reads_well_in_a_browser(visit, chapter):
    report = visit(_chapter_page(chapter)).value
    assert report["mathjax"] == "3.2.2", "MathJax (served with the book) did not load"
    assert report["math"] > 0 and report["untypeset"] == 0, (
        f"{report['untypeset']} of {report['math']} formulas were not typeset"
    )
    assert report["texErrors"] == 0, "MathJax reports a TeX error"
    assert report["assistive"] == report["typeset"] > 0, (
        "a formula without the MathML that assistive technology reads"
    )
    figures = [f for f in report["figures"] if "/_images/" in f["src"]]
    assert len(figures) >= 2 and all(f["loaded"] for f in figures)


@pytest.mark.parametrize("chapter", chapter_ids())
def test_launch_links_open_the_chapters_student_notebook(html, site, visit, chapter):
    report = visit(_chapter_page(chapter)).value
    notebook = f"autograder/course/release/{chapter}/{chapter}.ipynb"
    assert (REPO / notebook).exists()
    bar = {link["text"]: link["href"] for link in report["bar"]}
    org_repo = urlparse(REPOSITORY).path.strip("/")
    assert bar["Open in Colab"] == (
        f"https://colab.research.google.com/github/{org_repo}/blob/"
        f"{CONFIG['repository']['branch']}/{notebook}"
    )
    assert bar["Launch on Binder"].endswith(f"?urlpath=lab/tree/{notebook}")
    download = bar["Download the student notebook"]
    copied = html / unquote(download[len(site.url) :])
    assert copied.read_bytes() == (REPO / notebook).read_bytes()
    # the theme's launch buttons (Binder, JupyterHub, Colab) open the same notebook
    launch = [
        link
        for link in report["links"]
        if any(
            host in link
            for host in (
                "colab.research",
                "mybinder",
                CONFIG["launch_buttons"]["jupyterhub_url"],
            )
        )
    ]
    assert len(launch) >= 5 and all(notebook in link for link in launch), launch


# A word each chapter teaches, which the theme's search must find in that chapter.
SEARCHES = {
    "01_bottleneck": "bottleneck",
    "02_score_functions": "additive",
    "03_self_attention": "padding",
    "04_multi_head": "heads",
    "05_positional_encoding": "sinusoidal",
    "06_transformer": "smoothing",
    "07_relative_position": "ALiBi",
    "08_efficient_attention": "FlashAttention",
    "09_beyond_sequences": "patches",
    "10_language_model": "SwiGLU",
    "11_kernels": "Triton",
}
WAIT_FOR_RESULTS = """
for (let i = 0; i < 600; i++) {
  const hits = document.querySelectorAll("#search-results li a");
  if (hits.length) return [...hits].map((a) => a.href);
  await new Promise((done) => setTimeout(done, 100));
}
return [];
"""


@pytest.mark.parametrize("chapter", chapter_ids())
def test_search_finds_what_each_chapter_teaches(site, browser, chapter):
    found = browser.visit(
        f"{site.url}search.html?q={SEARCHES[chapter]}", WAIT_FOR_RESULTS
    )
    hits = [urldefrag(h)[0] for h in found.value]
    assert site.url + _chapter_page(chapter) in hits, hits
    assert not found.failed and not found.errors, (found.failed, found.errors)


HOME_LINK = """
const home = [...document.querySelectorAll("main a")].find(
  (a) => /first page/.test(a.textContent));
return {heading: document.querySelector("article h1")?.textContent, home: home?.href};
"""


@pytest.mark.parametrize(
    "missing", ["no-such-page.html", "chapters/01_bottleneck/a/b/"]
)
def test_a_missing_page_gets_the_books_404_page_with_a_way_home(site, browser, missing):
    lost = browser.visit(site.url + missing, HOME_LINK)
    assert lost.status == 404 and "Page not found" in lost.value["heading"]
    # the page's own styles and scripts load whatever the depth of the address
    assert not [f for f in lost.failed if not f.startswith(site.url + missing)]
    assert lost.value["home"] == f"{site.url}{ROOT}.html"
    home = browser.visit(lost.value["home"], "return document.title;")
    assert home.status == 200 and not home.failed


# Accessibility: WCAG 2.1 AA -------------------------------------------------------------


def _every_page() -> list[str]:
    """Every page a reader can reach: the table of contents, the search page, the 404."""
    return _toc_pages() + ["search.html", "404.html"]


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
@pytest.mark.parametrize("page", _every_page())
def test_page_meets_wcag_21_aa(site, browser, visit, page, dark):
    """axe-core finds no violation of the WCAG 2.0 and 2.1 A and AA rules (the light
    theme's on the page ``visit`` loaded for the other checks)."""
    if dark:
        violations = browser.accessibility_violations(site.url + page, dark=True)
    else:
        violations = visit(page).violations
    assert violations is not None
    assert not violations, "\n".join(
        f"{v['id']} ({v['impact']}): {v['help']}: "
        + "; ".join(n["html"][:120] for n in v["nodes"][:5])
        for v in violations
    )


# Keyboard: every part of a chapter page is reached with Tab, with its focus visible ------

# Record each element that takes the focus, and whether a focus ring is drawn around it.
RECORD_FOCUS = """() => {
  window.focusWalk = [];
  document.addEventListener("focusin", (event) => {
    const element = event.target, style = getComputedStyle(element);
    const ring = (style.outlineStyle !== "none" && parseFloat(style.outlineWidth) >= 1)
      || (style.boxShadow !== "none" && !/rgba\\([^)]*, 0\\)/.test(style.boxShadow));
    element.dataset.focusOrder = window.focusWalk.length;
    window.focusWalk.push({ring, html: element.outerHTML.slice(0, 120)});
  });
}"""
# What a keyboard user must reach on every chapter page: skipping to the content, the
# search, the launch menu and the launch bar, every chapter in the navigation, and every
# toggle that shows a hidden cell.
MUST_REACH = [
    ".skip-link a",
    "button.search-button__button",
    ".dropdown-launch-buttons button.dropdown-toggle",
    ".course-launch-bar a",
    ".bd-sidenav a.reference",
    "main details > summary",
]


@pytest.mark.parametrize("chapter", chapter_ids())
def test_a_chapter_page_works_with_the_keyboard_alone(site, browser, chapter):
    page, visit = browser.open(site.url + _chapter_page(chapter))
    try:
        page.evaluate(RECORD_FOCUS)
        stops = page.evaluate(
            "() => document.querySelectorAll('a[href], button, summary, [tabindex]').length"
        )
        for _ in range(stops + 5):  # one Tab per focusable element, and round again
            page.keyboard.press("Tab")
        walk = page.evaluate("() => window.focusWalk")
        unreached = {
            selector: page.evaluate(
                "(s) => [...document.querySelectorAll(s)]"
                ".filter((e) => e.offsetParent !== null && !e.dataset.focusOrder)"
                ".map((e) => e.outerHTML.slice(0, 100))",
                selector,
            )
            for selector in MUST_REACH
        }
        assert not {s: u for s, u in unreached.items() if u}, unreached
        assert all(page.locator(s).count() for s in MUST_REACH[:5])
        no_ring = [stop["html"] for stop in walk if not stop["ring"]]
        assert not no_ring, f"focus is not visible on {no_ring[:5]}"
        # the launch menu opens from the keyboard, and its first entry takes the focus
        page.focus(".dropdown-launch-buttons button.dropdown-toggle")
        page.keyboard.press("Enter")
        page.keyboard.press("ArrowDown")
        assert page.evaluate(
            "() => document.activeElement.closest('.dropdown-launch-buttons .dropdown-menu') !== null"
        )
        page.keyboard.press("Escape")
        # the search opens from the keyboard and takes a query
        page.focus("button.search-button__button")
        page.keyboard.press("Enter")
        page.keyboard.type("softmax")
        with page.expect_navigation():
            page.keyboard.press("Enter")
        assert "search.html" in page.url and "softmax" in page.url
        assert not visit.errors, visit.errors
    finally:
        page.context.close()
