"""The static scrubber's resources: ``scrubber.html``'s sections and ``scrubber.js``'s one line, checked by
``ScrubberTemplate.parse``. The package's own template loads and renders exactly its script into every
range's ``oninput``; a malformed template or script (a section over two lines, a missing, unknown or
repeated section or placeholder, a ``//`` comment after code, a line that needs an inserted semicolon, ...)
raises a ValueError naming the file and the line. No browser: tests/test_scrubber_browser.py runs the script."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib import resources

import pytest
from matplotlib.figure import Figure

from attnbook.explorers.base import Control, Explorer, ScrubberTemplate, scrubber_template

HTML_NAME = "attnbook/explorers/scrubber.html"
JS_NAME = "attnbook/explorers/scrubber.js"
HTML = resources.files("attnbook.explorers").joinpath("scrubber.html").read_text(encoding="utf-8")
JS = resources.files("attnbook.explorers").joinpath("scrubber.js").read_text(encoding="utf-8")
SECTIONS = ["open", "control", "fixed", "frame", "close"]


def tiny_explorer() -> Explorer:
    """Two moving controls (n: 4 values, mode: 2) and a fixed one: 8 frames, each a different picture and
    caption."""

    def compute(n: int, mode: str, colour: str) -> dict:
        return {"n": n, "mode": mode, "colour": colour, "y": [(k * n if mode == "up" else -k * n) for k in range(4)]}

    def draw(d: dict) -> Figure:
        fig = Figure(figsize=(1.5, 1), dpi=30)
        ax = fig.subplots()
        ax.plot(range(4), d["y"], color=d["colour"])
        ax.set_ylim(-10, 10)
        return fig

    return Explorer("Tiny", [Control("n", [1, 2, 3], 2, label="n heads", fmt=lambda v: f"{v} x"),
                             Control("mode", ["up", "down"], kind="toggle"),
                             Control("colour", ["red", "blue"], static=["red"])],
                    compute, draw, caption=lambda d: f"n={d['n']}, going {d['mode']}")


def _line_of(text: str, line: str) -> int:
    """The 1-based number of the line of ``text`` that is ``line`` (stripped)."""
    return [s.strip() for s in text.splitlines()].index(line) + 1


def _section_line(section: str) -> int:
    """The line of scrubber.html holding ``section``'s HTML (the one after its marker)."""
    return _line_of(HTML, f"<!-- section: {section} -->") + 1


def _replace_line(text: str, n: int, new: str) -> str:
    lines = text.splitlines()
    lines[n - 1] = new
    return "\n".join(lines) + "\n"


def _html_line(section: str) -> str:
    return HTML.splitlines()[_section_line(section) - 1]


class _Inputs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "input":
            self.inputs.append(dict(attrs))


def _oninputs(page: str) -> list[str | None]:
    parser = _Inputs()
    parser.feed(page)
    return [a.get("oninput") for a in parser.inputs]


# -- the package's own template --------------------------------------------------------------------------------
def test_package_template_has_its_sections_and_a_one_line_script():
    tpl = scrubber_template()
    assert tpl is scrubber_template()  # read once
    assert list(tpl.sections) == SECTIONS
    code = [line.strip() for line in JS.splitlines() if line.strip() and not line.strip().startswith("//")]
    assert len(code) >= 3 and tpl.script == "".join(code)
    assert "\n" not in tpl.script and "//" not in tpl.script
    again = ScrubberTemplate.parse(HTML, JS)
    assert {k: t.template for k, t in again.sections.items()} == {k: t.template for k, t in tpl.sections.items()}
    assert again.script == tpl.script


def test_every_range_runs_exactly_the_script():
    ex = tiny_explorer()
    page = ex.static_html()
    assert _oninputs(page) == [scrubber_template().script] * 2  # n and mode move; colour is fixed
    assert "colour = red (run the notebook to change these)" in page


def test_script_is_escaped_into_its_attribute_and_reaches_it_intact():
    # the script sits in a double-quoted attribute, html-escaped: quotes, &&, < and even </script> are
    # entities in the page (which holds no <script> element) and the attribute's value is the script again
    js = ("var a=\"</script>\",b='<!--',c=1&&2;\n"
          "var $d=a+b+'http://example.org';\n"  # a dollar sign is the script's, not a placeholder
          "if(c<2){c=3;}\n")
    tpl = ScrubberTemplate.parse(HTML, js)
    assert tpl.script == js.replace("\n", "")
    page = tiny_explorer().static_html(tpl)
    assert "<script" not in page.lower() and "</script" not in page.lower()
    assert _oninputs(page) == [tpl.script] * 2


def test_another_template_renders_its_own_sections():
    html = HTML.replace('<div class="ab-caption" style="font-size:90%">$caption</div>',
                        '<p class="ab-caption">$caption</p>')
    page = tiny_explorer().static_html(ScrubberTemplate.parse(html, JS))
    assert re.findall(r'<p class="ab-caption">([^<]*)</p>', page) == [
        f"n={n}, going {mode}" for n in (1, 2, 3) for mode in ("up", "down")]


# -- malformed templates ---------------------------------------------------------------------------------------
def _broken_html() -> list[tuple[str, str, str]]:
    """(what, template, the message it must raise); computed from the package's template, so that a line
    number in a message is where the fault was put."""
    control, frame, fixed = _section_line("control"), _section_line("frame"), _section_line("fixed")
    ctl = _html_line("control")
    cut = ctl.index('<input class="ab-range"')
    split_at = ctl.index("${labelwidth}") + len("${label")
    lines = HTML.splitlines()
    cases = [
        ("section over two lines",
         _replace_line(HTML, control, ctl[:cut] + "\n" + ctl[cut:]),
         rf"^{HTML_NAME} line {control + 1}: section 'control' spans two lines \({control} and {control + 1}\)"),
        ("placeholder split over two lines",
         _replace_line(HTML, control, ctl[:split_at] + "\n" + ctl[split_at:]),
         rf"^{HTML_NAME} line {control + 1}: section 'control' spans two lines"),
        ("unknown placeholder",
         HTML.replace("$caption", "$captoin"),
         rf"^{HTML_NAME} line {frame}, column \d+: unknown placeholder \$captoin in section 'frame'"),
        ("missing placeholder",
         HTML.replace(' oninput="$script"', ""),
         rf"^{HTML_NAME} line {control}: section 'control' lacks placeholder \$script"),
        ("duplicated placeholder",
         HTML.replace('<img alt="$title frame $i" src="data:image/png;base64,$png"',
                      '<img src="data:image/png;base64,$png"><img alt="$title frame $i" src="data:image/png;base64,$png"'),
         rf"^{HTML_NAME} line {frame}: placeholder \$png appears 2 times in section 'frame', not 1"),
        ("malformed placeholder",
         HTML.replace("$text (run", "${text (run"),
         rf"^{HTML_NAME} line {fixed}, column \d+: malformed placeholder '\$\{{text \(run ' in section 'fixed'"),
        ("unquoted placeholder",
         HTML.replace('data-stride="$stride"', "data-stride=$stride"),
         rf"^{HTML_NAME} line {control}, column \d+: placeholder \$stride is an unquoted attribute value"),
        ("script outside an event attribute",
         HTML.replace('oninput="$script"', 'data-script="$script"'),
         rf"^{HTML_NAME} line {control}: \$script must be the whole value of an event attribute"),
        ("unknown section",
         HTML.replace("<!-- section: fixed -->", "<!-- section: footer -->"),
         rf"^{HTML_NAME} line {fixed - 1}: unknown section 'footer'"),
        ("malformed section marker",
         HTML.replace("<!-- section: frame -->", "<!-- section:frame -->"),
         rf"^{HTML_NAME} line {frame - 1}: malformed section marker"),
        ("repeated section",
         HTML + "<!-- section: close -->\n</div>\n",
         rf"^{HTML_NAME} line {len(lines) + 1}: section 'close' again \(first at line {_section_line('close') - 1}\)"),
        ("missing section",
         HTML.replace("<!-- section: fixed -->\n" + _html_line("fixed") + "\n", ""),
         rf"^{HTML_NAME}: no section 'fixed'"),
        ("empty section",
         _replace_line(HTML, fixed, ""),
         rf"^{HTML_NAME} line {fixed - 1}: section 'fixed' is empty"),
        ("text before the first section",
         HTML.replace("<!-- section: open -->", "<p>stray</p>\n<!-- section: open -->"),
         rf"^{HTML_NAME} line {_section_line('open') - 1}: text outside any section"),
    ]
    return cases


@pytest.mark.parametrize("what, html, message", _broken_html(), ids=[c[0] for c in _broken_html()])
def test_malformed_template_raises_naming_file_and_line(what, html, message):
    assert html != HTML, f"the case {what!r} changed nothing"
    with pytest.raises(ValueError, match=message):
        ScrubberTemplate.parse(html, JS)


def test_a_template_error_names_the_template_given():
    with pytest.raises(ValueError, match=r"^my/scrubber\.html line \d+: section 'control' spans two lines"):
        ScrubberTemplate.parse(HTML.replace("<input class", "\n<input class"), JS, html_name="my/scrubber.html")


# -- malformed scripts -----------------------------------------------------------------------------------------
STRIDE = "i+=s.value*s.dataset.stride;"
FIRST = "var r=this.closest('.attnbook-explorer'),i=0;"


def _broken_js() -> list[tuple[str, str, str]]:
    stride, first = _line_of(JS, STRIDE), _line_of(JS, FIRST)
    col = JS.splitlines()[stride - 1].strip().index(STRIDE) + len(STRIDE) + 2
    return [
        ("// comment after code", JS.replace(STRIDE, STRIDE + " // the frame's index"),
         rf"^{JS_NAME} line {stride}, column {col}: a // comment after code"),
        ("// right after code", JS.replace(STRIDE, STRIDE + "//x"),
         rf"^{JS_NAME} line {stride}, column {col - 1}: a // comment after code"),
        ("no semicolon", JS.replace(FIRST, FIRST.rstrip(";")),
         rf"^{JS_NAME} line {first}: the line ends with '0', not with one of"),
        ("return at a line's end", JS.replace(STRIDE, "if(i<0){return\ni;}" + STRIDE),
         rf"^{JS_NAME} line {stride}: the line ends with 'n'"),
        ("no semicolon before a comment line", JS.replace(FIRST, FIRST.rstrip(";") + "\n/* note */"),
         rf"^{JS_NAME} line {first}: the line ends with '0'"),
        ("string over two lines", JS.replace(FIRST, "var t='a\\\nb';" + FIRST),
         rf"^{JS_NAME} line {first}: a string opened with ' does not close on its line"),
        ("template literal over two lines", JS.replace(FIRST, "var t=`a\nb`;" + FIRST),
         rf"^{JS_NAME} line {first}: a string opened with ` does not close on its line"),
        ("unclosed block comment", JS + "/* the end\n",
         rf"^{JS_NAME} line {len(JS.splitlines()) + 1}: a /\* comment is not closed"),
        ("last line open", JS + "var z=[\n",
         rf"^{JS_NAME} line {len(JS.splitlines()) + 1}: the script ends with '\['"),
        ("comments only", "// nothing here\n/* nor here */\n",
         rf"^{JS_NAME}: no code"),
    ]


@pytest.mark.parametrize("what, js, message", _broken_js(), ids=[c[0] for c in _broken_js()])
def test_malformed_script_raises_naming_file_and_line(what, js, message):
    assert js != JS, f"the case {what!r} changed nothing"
    with pytest.raises(ValueError, match=message):
        ScrubberTemplate.parse(HTML, js)


def test_a_script_error_names_the_script_given():
    with pytest.raises(ValueError, match=r"^lib/x\.js line 1, column 6: a // comment after code"):
        ScrubberTemplate.parse(HTML, "f(1);// go\n", js_name="lib/x.js")


def test_what_the_join_keeps_passes():
    # a comment line of its own (indented or not) is dropped; /* */ comments, // inside strings and lines
    # ending with { ( [ , are kept as they are
    js = ("  // a note, dropped\n"
          "var u='http://a//b',v=\"//\",w=[\n"
          "1,\n"
          "2];/* kept */\n"
          "    // another note\n"
          "f(\n"
          "u);\n")
    assert ScrubberTemplate.parse(HTML, js).script == "var u='http://a//b',v=\"//\",w=[1,2];/* kept */f(u);"


def test_parse_wants_text():
    with pytest.raises(TypeError, match="js_text must be the text of a file \\(a str\\), got bytes"):
        ScrubberTemplate.parse(HTML, JS.encode())
    with pytest.raises(TypeError, match="html_text must be .* got NoneType"):
        ScrubberTemplate.parse(None, JS)  # type: ignore[arg-type]
