"""The course's additions to Jupyter Book (a Sphinx extension registered in ``_config.yml``).

1. Every chapter page (docname ``chapters/NN_name/NN_name``) gets a bar under its title:
   *Open in Colab*, *Launch on Binder* and *Download the student notebook*. All three lead
   to the student notebook ``autograder/course/release/NN_name/NN_name.ipynb``, not to the page's
   MyST source (which Colab cannot open and which imports the reference answers). The
   notebook is copied into the built book, so the download works offline.
2. Jupyter Book's own launch buttons (Binder, JupyterHub, Colab) and its ``.ipynb`` download
   button are pointed at the same student notebook.
3. MathJax is served with the book, from the ``django-static-mathjax`` package (MathJax
   3.2.2), instead of from a CDN: the book reads well offline.
4. The book is published at ``https://<org>.github.io/<repo>/`` (GitHub Pages, a project
   sub-path): its canonical address and its 404 page (``sphinx-notfound-page``, whose
   links must be absolute to work from any depth) follow from the repository.
5. Every page's footer names the course version (``VERSION``, the one place it is
   written), the licences, and links to the About page (licence, versions, how to cite).

Every link is derived from ``repository.url`` and ``repository.branch`` in ``_config.yml``
and from its ``launch_buttons`` section. The student edition (``python -m autograder
edition``) builds the book with the edition's repository there, and with
``course_notebook_path``, where the edition keeps the student notebooks.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import sys
from importlib import resources
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

# The course's own rules (the book's address) live in its package, beside the book.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from autograder.paths import github_repository, pages_address  # noqa: E402

logger = logging.getLogger(__name__)

CHAPTER_PAGE = re.compile(r"^chapters/(\d\d_[a-z0-9_]+)/\1$")
STATIC = Path(__file__).resolve().parents[1] / "_static"
NOTEBOOKS = "_static/notebooks"  # where the student notebooks are copied in the build
# What the pages need of MathJax: one combined file with every TeX package, its fonts, and
# what the accessibility menu loads on demand (paths inside MathJax's es5/ folder).
MATHJAX_BUNDLE = "tex-chtml-full.js"
MATHJAX_PARTS = [MATHJAX_BUNDLE, "output/chtml/fonts/woff-v2", "a11y", "sre", "ui"]


def chapter_of(docname: str) -> str | None:
    """``chapters/03_self_attention/03_self_attention`` -> ``03_self_attention``."""
    match = CHAPTER_PAGE.match(docname)
    return match.group(1) if match else None


def student_notebook(chapter: str) -> str:
    """The student notebook's path in the repository."""
    return f"autograder/course/release/{chapter}/{chapter}.ipynb"


def notebook_in_repository(app: Sphinx, chapter: str) -> str:
    """The path the launch links open: the student notebook's in the published repository
    (the course's own, or the edition's ``course_notebook_path``)."""
    template = app.config.course_notebook_path
    return template.format(chapter=chapter) if template else student_notebook(chapter)


def _repository(app: Sphinx) -> tuple[str, str, str]:
    """(org, repo, branch) from ``repository:`` in ``_config.yml``."""
    return _repository_of(app.config)


def _repository_of(config) -> tuple[str, str, str]:
    options = config.html_theme_options
    try:
        org, repo = github_repository(options.get("repository_url", ""))
    except ValueError as exc:
        raise ExtensionError(f"repository.url in _config.yml: {exc}") from None
    return org, repo, options.get("repository_branch", "main")


def launch_links(app: Sphinx, chapter: str) -> dict[str, str]:
    """Absolute links that open the chapter's student notebook, by service."""
    org, repo, branch = _repository(app)
    buttons = app.config.html_theme_options.get("launch_buttons", {})
    path = notebook_in_repository(app, chapter)
    ui = "lab/tree" if buttons.get("notebook_interface") == "jupyterlab" else "tree"
    links = {}
    colab = buttons.get("colab_url", "").rstrip("/")
    if colab:
        links["colab"] = f"{colab}/github/{org}/{repo}/blob/{branch}/{path}"
    binder = buttons.get("binderhub_url", "").rstrip("/")
    if binder:
        links["binder"] = f"{binder}/v2/gh/{org}/{repo}/{branch}?urlpath={ui}/{path}"
    return links


def _launch_bar(app: Sphinx, docname: str, chapter: str) -> nodes.raw:
    up = "../" * docname.count("/")
    links = launch_links(app, chapter)
    items = []
    if "colab" in links:
        items.append((links["colab"], "Open in Colab", "course-colab"))
    if "binder" in links:
        items.append((links["binder"], "Launch on Binder", "course-binder"))
    items.append(
        (
            f"{up}{NOTEBOOKS}/{chapter}.ipynb",
            "Download the student notebook",
            "course-download",
        )
    )
    anchors = "\n".join(
        f'<a class="reference external {cls}" href="{html.escape(href)}"'
        f"{' download' if cls == 'course-download' else ''}>{text}</a>"
        for href, text, cls in items
    )
    text = (
        '<div class="course-launch-bar">\n'
        f'<span class="course-launch-label">Work through this chapter in its student notebook '
        f"(<code>{chapter}.ipynb</code>):</span>\n{anchors}\n</div>"
    )
    return nodes.raw("", text, format="html")


def add_launch_bar(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """``doctree-resolved``: put the launch bar right under a chapter page's title."""
    chapter = chapter_of(docname)
    if chapter is None or app.builder.format != "html":
        return
    if not (app.srcdir / student_notebook(chapter)).exists():
        logger.warning(
            f"{docname}: no student notebook {student_notebook(chapter)}; "
            "run `python -m autograder build`",
            location=docname,
        )
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    title = next(iter(section.findall(nodes.title)), None)
    section.insert(
        section.index(title) + 1 if title else 0, _launch_bar(app, docname, chapter)
    )


def point_buttons_at_student_notebook(app, pagename, templatename, context, doctree):
    """``html-page-context``, after the theme's handlers: the header's launch buttons and
    its ``.ipynb`` download open the student notebook instead of the page's source; pages
    that are not chapters get no launch buttons."""
    chapter = chapter_of(pagename)
    buttons = context.get("header_buttons", [])
    if chapter is None:  # only chapters have a notebook to launch
        buttons[:] = [g for g in buttons if g.get("label") != "launch-buttons"]
        return
    source = f"{pagename}.md"
    for group in buttons:
        for button in group.get("buttons", []):
            if group.get("label") == "launch-buttons":
                if source not in button.get("url", ""):
                    raise ExtensionError(
                        f"{pagename}: cannot point the launch button {button.get('text')} "
                        f"at the student notebook (its link has changed form: {button.get('url')})"
                    )
                button["url"] = button["url"].replace(
                    source, notebook_in_repository(app, chapter)
                )
            elif button.get("label") == "download-notebook-button":
                button["url"] = context["pathto"](f"{NOTEBOOKS}/{chapter}.ipynb", 1)
                button["tooltip"] = "Download the student notebook"


ABOUT_PAGE = "book/about"
LICENCES = (
    'Text, figures and notebooks: <a href="https://creativecommons.org/licenses/by/4.0/">'
    'CC BY 4.0</a>; code: <a href="https://opensource.org/license/mit">MIT</a>'
)


def course_version(app: Sphinx) -> str:
    return (Path(app.srcdir) / "VERSION").read_text().strip()


def set_version(app: Sphinx, config) -> None:
    """``config-inited``: Sphinx's own ``version`` and ``release`` are the course's."""
    config.version = config.release = course_version(app)


def add_footer(app, pagename, templatename, context, doctree):
    """``html-page-context``: the theme's extra footer, on every page: the version, the
    licences, and a link to the About page (relative, so it works wherever the book is
    served)."""
    about = context["pathto"](ABOUT_PAGE)
    context["theme_extra_footer"] = (
        f'<p class="course-footer">Course version {html.escape(course_version(app))}. '
        f"{LICENCES}. "
        f'<a href="{about}">Licence, changes and how to cite this course</a>.</p>'
    )


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    """``html-page-context``: Jupyter Book registers some inline scripts twice (sphinx-thebe's
    ``const THEBE_JS_URL = ...``, a SyntaxError the second time); keep each script once."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (script.filename or "", tuple(sorted(script.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def list_citations_as_list_items(app, pagename, templatename, context, doctree):
    """``html-page-context``: the bibliography's entries are list items.

    docutils' HTML writer gives each citation ``role="doc-biblioentry"``, a role that
    DPUB-ARIA 1.1 deprecates (w3c/dpub-aria#22) and that is no valid child of the
    ``role="list"`` around them; axe-core reports both (aria-deprecated-role,
    aria-required-children). ``listitem`` is what the specification recommends instead.
    """
    if "body" in context:
        context["body"] = context["body"].replace(
            'role="doc-biblioentry"', 'role="listitem"'
        )


def _mathjax_dir() -> Path:
    try:
        root = resources.files("mathjax")
    except ModuleNotFoundError:
        raise ExtensionError(
            "MathJax is served with the book from the django-static-mathjax package: "
            "`python -m pip install -r requirements.txt`"
        ) from None
    return Path(str(root)) / "static" / "mathjax" / "es5"


def use_local_mathjax(app: Sphinx, config) -> None:
    """``config-inited``: load MathJax from the book's ``_static``, not from a CDN."""
    config.mathjax_path = f"mathjax/{MATHJAX_BUNDLE}"
    config.html_static_path.append(str(STATIC))
    _mathjax_dir()  # fail early, with a message, when the package is missing


def publish_under_project_path(app: Sphinx, config) -> None:
    """``config-inited``: the book's address, and a 404 page that leads home from any depth."""
    _, repo, _ = _repository_of(config)
    config.html_baseurl = pages_address(config.html_theme_options["repository_url"])
    config.notfound_urls_prefix = f"/{repo}/"
    home = f"/{repo}/{config.root_doc}.html"
    config.notfound_context = {
        "title": "Page not found",
        "body": (
            "<h1>Page not found</h1>"
            "<p>There is no page at this address in the course. It may have moved when "
            "the chapters were renumbered, or the address may be mistyped.</p>"
            f'<p><a href="{home}">Go to the course\'s first page</a>, or use the '
            "search and the table of contents.</p>"
        ),
    }


def copy_files(app: Sphinx, exception) -> None:
    """``build-finished``: MathJax and the student notebooks go into the built book."""
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    mathjax = _mathjax_dir()
    for part in MATHJAX_PARTS:
        source, target = mathjax / part, static / "mathjax" / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    notebooks = Path(app.outdir) / NOTEBOOKS
    notebooks.mkdir(parents=True, exist_ok=True)
    for docname in app.env.found_docs:
        chapter = chapter_of(docname)
        if chapter and (app.srcdir / student_notebook(chapter)).exists():
            shutil.copy2(app.srcdir / student_notebook(chapter), notebooks)


def setup(app: Sphinx) -> dict:
    # The chapters' kernels inherit this process's environment: a caller's
    # MPLBACKEND=Agg (common on headless servers and in CI) would make plt.show() draw
    # nothing, and the book would build without a figure. The book renders the same
    # whoever builds it.
    os.environ.pop("MPLBACKEND", None)
    # the student edition's notebook paths ("notebooks/{chapter}.ipynb"); "" is the course's
    app.add_config_value("course_notebook_path", "", "html", types=[str])
    app.connect("config-inited", use_local_mathjax)
    # after sphinx-external-toc has made the table of contents' root the root document
    app.connect("config-inited", publish_under_project_path, priority=900)
    app.connect("config-inited", set_version)
    app.connect("html-page-context", add_footer)
    app.connect("doctree-resolved", add_launch_bar)
    # after sphinx-book-theme's header buttons (priority 501)
    app.connect("html-page-context", point_buttons_at_student_notebook, priority=502)
    app.connect("html-page-context", drop_duplicate_scripts)
    app.connect("html-page-context", list_citations_as_list_items)
    app.connect("build-finished", copy_files)
    app.add_css_file("course.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
