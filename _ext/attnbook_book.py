"""The book's own Sphinx extension, loaded by both editions (``sphinx: local_extensions:`` in ``_config.yml``).

* **The other language, one click away.** Every page's header gets a link to the same page in the other
  edition(s): "中文" on an English page, "English" on a Chinese one. The layout is the one ``tools/editions.py``
  builds: the English edition at the root of the HTML folder, each translation in a folder named after its
  language code (``_build/html/zh_CN/``); the translations are the folders of ``locales/``. The links are
  relative, so they work over http and from ``file://`` alike.
* **MathJax served by the book.** Sphinx loads MathJax from a CDN by default; a reader offline (or behind a
  firewall) would see raw ``\\(...\\)``. This copies MathJax 3.2.2 from the pinned PyPI package
  ``django-static-mathjax`` (module ``mathjax``) into ``_static/mathjax/`` and points ``mathjax_path`` at it:
  the combined TeX-to-CommonHTML component, its woff-v2 fonts and the TeX extensions its autoloader may fetch
  (``\\boldsymbol``, ``\\cancel``, ...), about 2.2 MB per edition, and MathJax's licence.
* **The interface in the page's language.** The themes translate their own strings (search, contents,
  buttons) when Sphinx's ``language`` is set; two things of ours would stay English in a translation: the
  captions of the table of contents (``_toc.yml``), looked up here in the root page's catalog, and Jupyter
  Book's "Search this book..." placeholder, replaced by Sphinx's own translated "Search". The book's title, a
  configuration value, comes from ``attnbook_titles`` in ``_config.yml``.
* **No translation dropped in silence** (``ApplyEveryTranslation``): see there.
* **Live explorers.** An explorer's scrubber whose title :data:`attnbook.explorers.live.LIVE` lists gets a
  "live" switch under its title (``_live_switches``), in the page's language (:data:`LIVE_STRINGS`). The switch
  is inline HTML and an ``onchange`` attribute: nothing is loaded until a reader turns it on; then it loads
  ``_static/live/attnbook_live.js`` from the root of the HTML folder, the one copy both editions share
  (``tools/live_assets.py`` puts the runtime, the graphs and that script there when the book is built). From
  ``file://``, where Chromium refuses to load WebAssembly modules, the switch says how to serve the folder
  instead, and the scrubber stays.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ExtensionError
from sphinx.locale import _ as sphinx_gettext
from sphinx.locale import init as init_locale
from sphinx.transforms import SphinxTransform
from sphinx.transforms.i18n import publish_msgstr
from sphinx.util import logging
from sphinx.util.i18n import docname_to_domain
from sphinx.util.nodes import extract_messages

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
ROOT_LANGUAGE = "en"  # the edition at the root of the HTML folder; every other one sits in <root>/<language>/
# how each edition names itself in the link that leads to it
NAMES = {"en": ("English", "Read this page in English"), "zh_CN": ("中文", "阅读本页的中文版")}

# what MathJax needs to typeset TeX offline, relative to the package's es5/ folder (the rest of the package,
# 35 MB of sources, other outputs and the speech engine, stays out of the book)
MATHJAX_FILES = ["tex-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions"]
MATHJAX_PATH = "mathjax/tex-chtml.js"  # under _static/


def translations(srcdir: str | Path, config: Config) -> list[str]:
    """The language codes that have catalogs: the folders of the first ``locale_dirs`` entry."""
    dirs = [Path(srcdir, d) for d in (config.locale_dirs or [])]
    if not dirs or not dirs[0].is_dir():
        return []
    return sorted(d.name for d in dirs[0].iterdir() if (d / "LC_MESSAGES").is_dir())


def _language(config: Config) -> str:
    return config.language or ROOT_LANGUAGE


def _configure(app: Sphinx, config: Config) -> None:
    config.templates_path = [*config.templates_path, str(HERE / "templates")]
    config.html_static_path = [*config.html_static_path, str(HERE / "static")]
    options = dict(config.html_theme_options)
    # sphinx-book-theme's default header end is its buttons (launch, download, full screen, theme, search)
    options["article_header_end"] = ["language-switch.html",
                                     *options.get("article_header_end", ["article-header-buttons.html"])]
    if _language(config) != ROOT_LANGUAGE:
        # the book's title (the sidebar, the browser tab) in this language, from attnbook_titles in _config.yml
        config.html_title = config.attnbook_titles.get(_language(config), config.html_title)
    config.html_theme_options = options
    config.mathjax_path = MATHJAX_PATH


def _page_context(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    here = _language(app.config)
    # the relative path from this page to the root of the HTML folder (where the English edition is)
    up = "../" * pagename.count("/") + ("" if here == ROOT_LANGUAGE else "../")
    links = []
    for language in [ROOT_LANGUAGE, *translations(app.srcdir, app.config)]:
        if language == here:
            continue
        name, title = NAMES.get(language, (language, language))
        folder = "" if language == ROOT_LANGUAGE else f"{language}/"
        links.append({"href": f"{up}{folder}{pagename}{app.builder.link_suffix}", "name": name, "title": title,
                      "tag": language.replace("_", "-")})
    context["attnbook_languages"] = links


# The live switch's words in each edition (the messages attnbook_live.js shows are its data-msg-* attributes)
LIVE_STRINGS = {
    "en": {"label": "live", "title": "compute this explorer in the page, for any value in range",
           "off": "", "loading": "loading the runtime and the graph…",
           "on": "live: computed in this page by the package's exported graph",
           "file": "live needs the book served over http: python3 -m http.server -d _build/html, then open "
                   "http://localhost:8000/",
           "missing": "live is unavailable: a file of the live layer is missing from the site",
           "nowasm": "live is unavailable: this browser has no WebAssembly",
           "failed": "live stopped: the graph failed to run"},
    "zh_CN": {"label": "实时计算", "title": "在页面中计算这个探索器，取值范围内任意取值",
              "off": "", "loading": "正在加载运行时和计算图…",
              "on": "实时计算：由本包导出的计算图在本页面中计算",
              "file": "实时计算需要通过 http 访问本书：运行 python3 -m http.server -d _build/html，再打开 "
                      "http://localhost:8000/",
              "missing": "无法实时计算：网站缺少实时计算层的一个文件",
              "nowasm": "无法实时计算：此浏览器不支持 WebAssembly",
              "failed": "实时计算已停止：计算图运行失败"},
}
# what the switch runs: from file:// only the note; else attnbook_live.js, loaded once, then its toggle
LIVE_ONCHANGE = (
    "var b=this.closest('.ab-live'),c=this,n=b.querySelector('.ab-live-note');"
    "if(window.attnbookLive&&window.attnbookLive.toggle){window.attnbookLive.toggle(b,c.checked);return;}"
    "if(location.protocol==='file:'){n.textContent=b.dataset.msgFile;c.checked=false;return;}"
    "var s=document.createElement('script');s.src=b.dataset.base+'attnbook_live.js';"
    "s.onload=function(){window.attnbookLive.toggle(b,c.checked);};"
    "s.onerror=function(){n.textContent=b.dataset.msgMissing+' (attnbook_live.js)';c.checked=false;};"
    "document.head.appendChild(s);"
)
LIVE_SWITCH = ('<div class="ab-live" data-live="{name}" data-base="{base}"{messages} '
               'style="margin:0 0 4px 0;font-size:90%"><label title="{title}" style="cursor:pointer">'
               '<input type="checkbox" class="ab-live-switch" onchange="{script}"> {label}</label> '
               '<span class="ab-live-note" role="status" style="color:#555"></span></div>')
EXPLORER_OPEN = re.compile(r'(<div class="attnbook-explorer" id="ab-[0-9a-f]+"[^>]*>'
                           r'<div style="font-weight:bold;margin-bottom:4px">)([^<]*)(</div>)')


def live_switch(name: str, base: str, language: str) -> str:
    """The switch's HTML for live explorer ``name``, whose files are under ``base`` (relative to the page)."""
    import html

    words = LIVE_STRINGS.get(language, LIVE_STRINGS[ROOT_LANGUAGE])
    messages = "".join(f' data-msg-{key}="{html.escape(words[key])}"'
                       for key in ("off", "loading", "on", "file", "missing", "nowasm", "failed"))
    return LIVE_SWITCH.format(name=html.escape(name), base=html.escape(base), messages=messages,
                              title=html.escape(words["title"]), label=html.escape(words["label"]),
                              script=html.escape(LIVE_ONCHANGE))


def _live_switches(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    body = context.get("body")
    if not body or "attnbook-explorer" not in body:
        return
    from attnbook.explorers.live import LIVE

    here = _language(app.config)
    up = "../" * pagename.count("/") + ("" if here == ROOT_LANGUAGE else "../")

    def add(m: re.Match) -> str:
        import html

        name = LIVE.get(html.unescape(m.group(2)))
        if name is None:
            return m.group(0)
        return m.group(0) + live_switch(name, f"{up}_static/live/", here)

    context["body"] = EXPLORER_OPEN.sub(add, body)


def _search_text(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """A translation's search box placeholder: Jupyter Book sets it to "Search this book..." and
    sphinx-book-theme's own catalog has no "Search"; Sphinx's (with the theme's) has it: 搜索..."""
    if _language(app.config) != ROOT_LANGUAGE:
        context["theme_search_bar_text"] = f"{sphinx_gettext('Search')}..."


def _notebook_outputs_aside(app: Sphinx) -> None:
    """myst-nb writes each notebook's images to ``<outdir>/../jupyter_execute`` before Sphinx copies them into
    ``_images``; for a translation, whose outdir is inside the English HTML folder, that would leave a stray
    folder there (and two translations would share it). Its own doctree folder is private to its build."""
    nb_config = getattr(app.env, "mystnb_config", None)
    if _language(app.config) != ROOT_LANGUAGE and nb_config is not None:
        app.env.mystnb_config = nb_config.copy(output_folder=str(Path(app.doctreedir) / "jupyter_execute"))


def _catalog(transform: SphinxTransform) -> Any:
    """The page's own catalog (what Sphinx's Locale transform reads), or None."""
    domain = docname_to_domain(transform.env.docname, transform.config.gettext_compact)
    dirs = [str(Path(transform.env.srcdir, d)) for d in transform.config.locale_dirs]
    catalog, found = init_locale(dirs, transform.config.language, domain)
    return catalog if found else None


# "0. " or "12) " at the start: Markdown reads a translated "0. 为什么需要注意力？" as a list, not a title
LIST_MARKER = re.compile(r"^(\s*\d{1,9})([.)])(?=\s)")


class ApplyEveryTranslation(SphinxTransform):
    """No translation in the catalogs is dropped without a word.

    Sphinx parses each translation with the page's parser and silently keeps the English when the result is not
    one paragraph (or one title). The chapter titles are the case that happens: "0. 为什么需要注意力？" parses as
    an ordered list. Here a leading list marker is escaped ("0\\.") and the translation applied; any other
    translation that still cannot be used is a warning, so the strict build (-W) fails on it."""

    default_priority = 21  # right after Sphinx's Locale transform (20)

    def apply(self, **kwargs: Any) -> None:
        if _language(self.config) == ROOT_LANGUAGE or (catalog := _catalog(self)) is None:
            return
        for node, msg in extract_messages(self.document):
            msgstr = catalog.gettext(msg)
            if node.get("translated") or not msgstr.strip() or msgstr == msg:
                continue  # translated, untranslated (test_translation.py reports it) or kept as it is
            patch = None
            escaped = LIST_MARKER.sub(r"\1\\\2", msgstr, count=1)
            if escaped != msgstr and isinstance(node, (nodes.title, nodes.paragraph)):
                if isinstance(node, nodes.title):  # as Sphinx does: a title underlined into a section
                    escaped += "\n" + "=" * len(escaped) * 2
                patch = publish_msgstr(self.app, escaped, self.document["source"], node.line, self.config,
                                       self.document.settings)
                patch = patch.next_node() if isinstance(node, nodes.title) else patch
            if isinstance(patch, (nodes.title, nodes.paragraph)):
                for child in patch.children:
                    child.parent = node
                node.children = patch.children
                node["translated"] = True
            else:
                logger.warning("the translation of %r is not used: it does not read as one paragraph "
                               "(does it start with a list marker, '#', '>' or a table row?)", msg[:70],
                               location=node, type="attnbook", subtype="i18n")


class TranslateTocCaptions(SphinxTransform):
    """The captions of the table of contents ("Chapters", "Appendices", ...) in the page's language.

    They come from ``_toc.yml``: sphinx-external-toc inserts the toctree (priority 100) after Sphinx's Locale
    transform (20) has translated the page, so the captions, extracted into the root page's catalog like any
    other message, would stay English. This looks them up in that same catalog."""

    default_priority = 110  # after sphinx_external_toc's InsertToctrees, before the doctree-read event

    def apply(self, **kwargs: Any) -> None:
        if _language(self.config) == ROOT_LANGUAGE:
            return
        if (catalog := _catalog(self)) is None:
            return
        for node in self.document.findall(addnodes.toctree):
            caption = node.get("caption")
            if caption:
                node["caption"] = node["rawcaption"] = catalog.gettext(caption)


def mathjax_source() -> Path:
    """The es5/ folder of the installed MathJax package."""
    try:
        import mathjax  # django-static-mathjax, pinned in requirements.txt
    except ImportError as exc:
        raise ExtensionError("MathJax is served by the book: pip install -r requirements.txt "
                             "(django-static-mathjax)") from exc
    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (es5 / "tex-chtml.js").exists():
        raise ExtensionError(f"{es5} has no tex-chtml.js: reinstall django-static-mathjax")
    return es5


def _copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    es5 = mathjax_source()
    target = Path(app.outdir) / "_static" / Path(MATHJAX_PATH).parent
    for name in MATHJAX_FILES:
        source = es5 / name
        if source.is_dir():
            shutil.copytree(source, target / name, dirs_exist_ok=True)
        else:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    shutil.copy2(es5.parent / "LICENSE", target / "LICENSE")


def setup(app: Sphinx) -> dict[str, Any]:
    # {language: the book's title in it}; the English title is `title:` in _config.yml
    app.add_config_value("attnbook_titles", {}, "html", dict)
    app.add_css_file("attnbook_book.css")
    app.add_transform(ApplyEveryTranslation)
    app.add_transform(TranslateTocCaptions)
    app.connect("config-inited", _configure)
    app.connect("builder-inited", _notebook_outputs_aside, priority=900)  # after myst-nb sets its folder (500)
    # the links before pydata-sphinx-theme (500) drops the header templates that render empty; the search text
    # after sphinx-book-theme (500) sets its own
    app.connect("html-page-context", _page_context, priority=400)
    app.connect("html-page-context", _search_text, priority=900)
    app.connect("html-page-context", _live_switches, priority=500)
    app.connect("build-finished", _copy_mathjax)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
