"""The machinery behind every explorer: live ipywidgets controls in Jupyter and Colab, and a static scrubber.

The scrubber is self-contained HTML for the static book, one pre-rendered frame
per combination of the controls' static values.

An explorer is a ``compute`` function (control values -> a dict of numbers and
tensors, cheap and testable) and a picture of that dict. :class:`Explorer`
wires them to widgets and pre-renders one frame per combination of the
controls' static values.

The picture comes from three hooks, so that a figure is built once per layout
and afterwards only its changing artists are redrawn (blitting, see
:class:`FastFigure`; a few milliseconds per update instead of a full render):

* ``layout(data) -> key``: what the figure's layout depends on (the number of
  heads, the sequence length, ...); one figure is kept per key;
* ``build(data) -> (figure, artists)``: a new figure for that layout, and a
  dict of the artists ``redraw`` changes (an artist, or a list of them; other
  values, such as constants, are allowed). Everything not in the dict is drawn
  once into the cached background;
* ``redraw(data, artists)``: set the artists' data for this ``data``.

A plain ``draw(data) -> Figure`` (a full render each time) still works for a
quick explorer.

Optional hooks keep every control meaningful and say what is going on:

* ``limits(values) -> {name: values}``: for some controls, the values that make a
  difference now (a real length up to the sequence length), or ``None`` where the
  control does not apply at all (a window, for a mask without one). A value outside
  its limits moves to the nearest one inside; the live widget offers only those, and
  disables a control that does not apply or has one value left. A control with a
  single value and no ``hint`` is not shown at all.
* ``busy(values) -> str | None``: a message the live caption shows while a slow
  ``compute`` runs (a measurement), ``None`` when it will be quick.
* ``static_caption(data)``: the caption of the book's frames, where it should differ
  from the live one (numbers "measured when the page was built").

How it shows itself (``display(explorer)`` or an explorer as a cell's last
expression):

* Jupyter, in a reader's live kernel: one output carrying the live widget view
  and, as ``text/html``, one line (:data:`LIVE_NOTE`) saying the explorer needs
  this kernel and to run the cell again; no frame of the scrubber is rendered
  (the reader sees the widget, and the frames cost seconds and megabytes in
  their notebook). Under the widget's caption, a muted line (:data:`STALE_HINT`)
  explains a widget that no longer answers: after a kernel restart JupyterLab
  redraws the saved widget view, whose controls still move but reach no kernel.
* Jupyter, executed for the book (the environment variable :data:`STATIC_ENV`
  is ``"1"``: ``tools/execute.py`` sets it): the same output with ``text/html``
  holding the scrubber instead. Jupyter shows the widget; the book
  (``execute_notebooks: off``, ``nb_mime_priority_overrides`` in ``_config.yml``)
  shows the scrubber. The scrubber's frames are rendered before the widget
  exists, so no frame is pushed to the widget on the way.
* Colab (``"google.colab" in sys.modules``): a plain ``display(widget)``, which
  Colab's display hook needs (its ipywidgets 7.7.1 has no ``_repr_mimebundle_``),
  then the scrubber folded under it (:data:`COLAB_FALLBACK`): a static fallback that
  still works when the widget does not show.

The scrubber's HTML and its one line of JavaScript are package resources,
``scrubber.html`` and ``scrubber.js`` next to this module; :class:`ScrubberTemplate`
reads them and refuses, with a ValueError naming the file and the line, what
would break silently once they are filled in and joined into one line.

Works with ipywidgets 7.6+ and 8 and uses only core widgets.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import io
import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import Any

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure, SubFigure

from .._compat import available_devices

__all__ = [
    "Control",
    "Explorer",
    "FastFigure",
    "figure_png",
    "device_control",
    "device_hint",
    "in_colab",
    "COLAB_FALLBACK",
    "WIDGET_VIEW_MIME",
    "LIVE_SCALE",
    "LIVE_MIN_SHARE",
    "STATIC_ENV",
    "LIVE_NOTE",
    "STALE_HINT",
    "book_outputs",
    "ScrubberTemplate",
    "scrubber_template",
]

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
# The live widget's image has LIVE_SCALE device pixels per CSS pixel (sharp on a high-density screen) and is
# shown at the figure's own size in CSS pixels (inches x its dpi), at most the output's width but never under
# LIVE_MIN_SHARE of that size: in a narrower output column (a 700 px window with JupyterLab's file browser
# open leaves 332 px) it keeps its text at 9 px or more and scrolls sideways in its box instead of shrinking
# to half. (The kernel cannot learn the column's width with core widgets, so no figure is laid out for it.) The book's
# scrubber frames stay at the figure's dpi: twice the pixels would double the chapters' size.
LIVE_SCALE = 2
LIVE_MIN_SHARE = 0.9
# Under Colab the live widget is shown with a plain display(widget); this goes under it, holding the static
# scrubber (the frames the book shows), folded: it stays usable when Colab's widget manager fails.
COLAB_FALLBACK = ('<details class="attnbook-fallback" style="margin-top:4px"><summary style="cursor:pointer;'
                  'font-family:sans-serif;font-size:90%;color:#555">Static preview (pre-rendered frames): open it if the live explorer above shows '
                  'nothing or an error; running the cell again usually brings the live one back</summary>'
                  '$scrubber</details>')

# Set to "1" by tools/execute.py, which executes the chapters whose stored outputs the book shows: an explorer
# then stores its static scrubber with the live view. Unset (a reader's kernel), it renders no frame.
STATIC_ENV = "ATTNBOOK_STATIC_SCRUBBER"
# The text/html of a live explorer's output: what a front end without the widget (a viewer, a notebook whose
# widget state was not saved, a stopped kernel) shows in its place.
LIVE_NOTE = ('<div class="attnbook-live-note" style="font-family:sans-serif;color:#555">'
             '<b>$title</b>: a live explorer; it needs this notebook\'s kernel. Run this cell to make it live '
             '(the book shows a pre-rendered version).</div>')
# Under the live widget: the one sign that tells a reader why a widget restored after a kernel restart (or
# from a saved notebook) does nothing: its controls still move in the page, but no kernel redraws it.
STALE_HINT = ("If moving a control changes nothing, this explorer has lost its kernel (it was restarted or "
              "stopped, or the notebook was reopened): run this cell again.")


def book_outputs() -> bool:
    """Whether this kernel executes a chapter for the book (:data:`STATIC_ENV` is ``"1"``): explorers then
    store their static scrubber, which a reader's live kernel never computes."""
    return os.environ.get(STATIC_ENV) == "1"


def in_colab() -> bool:
    """Whether this runs in Google Colab (its display hook needs a plain ``display(widget)``)."""
    return "google.colab" in sys.modules


def figure_png(fig: Figure, dpi: float | None = None) -> bytes:
    """Render a matplotlib Figure (made without pyplot) to PNG bytes.

    A figure prepared by :class:`FastFigure` at its own dpi takes the fast path:
    the cached background plus its changing artists only.
    """
    fast = getattr(fig, "_attnbook_fast", None)
    if fast is not None and (dpi is None or dpi == fig.dpi):
        return fast.png()
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi)
    return buf.getvalue()


def _css_size(fig: Figure, dpi: float) -> tuple[int, int]:
    """The figure's size in CSS pixels at ``dpi`` dots per inch (its own dpi before a live scale-up)."""
    w, h = fig.get_size_inches()
    return round(w * dpi), round(h * dpi)


class FastFigure:
    """Blitting for explorers: everything that never changes (axes, ticks, labels,
    fixed curves) is rendered once into a cached background; each update redraws
    only the ``dynamic`` artists on top of it, so :func:`figure_png` costs a few
    milliseconds instead of a full render. The figure stays an ordinary Figure
    that tests can inspect (and that ``savefig`` renders in full).

    The dynamic artists are drawn after the whole background, so one that a
    static artist should cover (a grid line over a bar) shows on top; the
    explorers' tests compare every frame with a full ``savefig`` render.
    """

    def __init__(self, fig: Figure, dynamic: Sequence[Artist]):
        self.fig = fig
        self.dynamic = list(dynamic)
        self.canvas = FigureCanvasAgg(fig)
        for artist in self.dynamic:
            artist.set_animated(True)  # left out of canvas.draw(): not part of the background
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(fig.bbox)
        fig._attnbook_fast = self  # type: ignore[attr-defined]

    def png(self) -> bytes:
        from PIL import Image

        self.canvas.restore_region(self.background)
        for artist in self.dynamic:
            self.fig.draw_artist(artist)
        rgba = self.canvas.buffer_rgba()
        buf = io.BytesIO()
        Image.frombuffer("RGBA", (rgba.shape[1], rgba.shape[0]), rgba, "raw", "RGBA", 0, 1).convert("RGB").save(
            buf, format="png", compress_level=3)
        return buf.getvalue()


def _dynamic_artists(artists: dict[str, Any]) -> list[Artist]:
    """The artists named in a ``build`` hook's dict, flattened (lists, tuples and containers such as a
    ``BarContainer`` hold several). Axes and figures are refused: marking one as changing would take it,
    with everything on it, out of the cached background."""
    found: list[Artist] = []

    def visit(name: str, value: Any) -> None:
        if isinstance(value, (Axes, Figure, SubFigure)):
            raise TypeError(f"build's artists[{name!r}] is a {type(value).__name__}: name the artists that "
                            "change (a title, an image, bars), not what holds them")
        if isinstance(value, Artist):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(name, item)

    for name, value in artists.items():
        visit(name, value)
    return found


@dataclass
class Control:
    """One control of an explorer.

    Args:
        name: the keyword passed to ``compute``.
        values: the choices, in order (a slider walks through them).
        default: the starting value (must be one of ``values``).
        label: what the reader sees, e.g. ``"d_k"``.
        kind: ``"slider"``, ``"toggle"`` (a few labelled buttons) or ``"dropdown"``.
        static: the values pre-rendered for the book's scrubber (default: all of
            them); ``[default]`` keeps the control fixed there.
        fmt: how a value is written in labels (default ``str``).
        hint: a short note shown beside the live control (what the choice means, why it offers one
            value only); a control with a single value and no hint is not shown.
    """

    name: str
    values: Sequence[Any]
    default: Any = None
    label: str | None = None
    kind: str = "slider"
    static: Sequence[Any] | None = None
    fmt: Callable[[Any], str] = str
    hint: str | None = None

    def __post_init__(self) -> None:
        self.values = list(self.values)
        if not self.values:
            raise ValueError(f"control {self.name!r} has no values")
        if self.default is None:
            self.default = self.values[0]
        if self.default not in self.values:
            raise ValueError(f"control {self.name!r}: default {self.default!r} is not one of {self.values!r}")
        if self.kind not in ("slider", "toggle", "dropdown"):
            raise ValueError(f"control {self.name!r}: kind must be slider, toggle or dropdown, got {self.kind!r}")
        self.label = self.label or self.name
        self.static = list(self.values if self.static is None else self.static)
        bad = [v for v in self.static if v not in self.values]
        if bad:
            raise ValueError(f"control {self.name!r}: static values {bad!r} are not among {self.values!r}")

    @property
    def shown(self) -> bool:
        """Whether the reader sees this control: not when it has one value and no hint (it changes nothing and
        needs no explaining)."""
        return len(self.values) > 1 or bool(self.hint)

    @property
    def static_values(self) -> list[Any]:
        """The values the book's scrubber shows (``static``, which ``__post_init__`` made a list)."""
        return list(self.values if self.static is None else self.static)

    def make_widget(self) -> Any:
        """The ipywidgets control: a SelectionSlider, ToggleButtons or a Dropdown."""
        import ipywidgets as W

        options = [(self.fmt(v), v) for v in self.values]
        # "initial": the description takes the room its text needs (the default cuts it at about 80 px)
        common = dict(options=options, value=self.default, description=self.label,
                      style={"description_width": "initial"})
        if self.kind == "slider":
            return W.SelectionSlider(continuous_update=False, layout=W.Layout(width="auto", max_width="40em"),
                                     **common)
        if self.kind == "toggle":
            # ipywidgets 8 puts ToggleButtons' description above its buttons (a block, not an inline box):
            # a row puts it beside them, as for every other control; where the row is too narrow for both,
            # the buttons wrap onto the next line (in a plain row the description would shrink to "KV he...")
            return W.ToggleButtons(layout=W.Layout(display="flex", flex_flow="row wrap", align_items="center"),
                                   **{**common, "style": {**common["style"], "button_width": "auto"}})
        # as wide as its longest choice (a sentence), at most the output's width
        return W.Dropdown(layout=W.Layout(width="max-content", max_width="100%"), **common)


def device_hint(devices: Sequence[str]) -> str:
    """What the device dropdown means, for the ``devices`` it offers (shown beside it in the live widget)."""
    if list(devices) == ["cpu"]:
        return ("only the CPU here: PyTorch finds no GPU (torch.cuda.is_available() is False); on Colab, "
                "Runtime > Change runtime type > GPU, then run the notebook again")
    gpus = " or ".join(d for d in devices if d != "cpu")
    return (f"where the tensors are computed: the CPU or the GPU ({gpus}); the pictures agree up to rounding, "
            "measured times differ")


def device_control(static: Sequence[str] = ("cpu",)) -> Control:
    """The device dropdown every explorer that computes on tensors offers: the devices present here
    (:func:`attnbook._compat.available_devices`, the CPU first and by default), with a hint saying what the
    choice means (:func:`device_hint`); the book's scrubber shows ``static`` (the CPU)."""
    devices = available_devices()
    return Control("device", devices, "cpu", label="device", kind="dropdown", static=list(static),
                   hint=device_hint(devices))


# -- the static scrubber's resources -----------------------------------------------------------------------
# scrubber.html's sections, in the order static_html concatenates them, and the placeholders each holds: a
# name listed twice appears twice ($label is the control's text and its aria-label, $i the frame's number and
# part of its alt text). A template must hold exactly these: static_html fills in these names and no others.
_SCRUBBER_SECTIONS: dict[str, tuple[str, ...]] = {
    "open": ("digest", "title"),
    "control": ("labelwidth", "label", "label", "max", "index", "name", "stride", "labels", "script",
                "valuewidth", "value"),
    "fixed": ("text",),
    "frame": ("i", "i", "hidden", "title", "png", "caption"),
    "close": (),
}
# placeholders filled with a whole attribute (or nothing), written outside quotes on purpose
_WHOLE_ATTRIBUTES = frozenset({"hidden"})
_SECTION_MARKER = re.compile(r"<!-- section: ([a-z]+) -->")
# what a line of scrubber.js may end with: see _inline_script
_SCRIPT_LINE_ENDS = frozenset(";{},([")


def _tag_contexts(line: str) -> list[str]:
    """For each character of one line of HTML: ``"text"``, ``"tag"`` (inside a tag, outside quotes) or
    ``"quoted"`` (inside a quoted attribute value)."""
    contexts: list[str] = []
    state, quote = "text", ""
    for k, ch in enumerate(line):
        if state == "text" and ch == "<" and (line[k + 1:k + 2].isalpha() or line[k + 1:k + 2] == "/"):
            state = "tag"
        elif state == "tag" and ch in "\"'":
            state, quote = "quoted", ch
        elif state == "tag" and ch == ">":
            state = "text"
        elif state == "quoted" and ch == quote:
            contexts.append("quoted")
            state = "tag"
            continue
        contexts.append(state)
    return contexts


def _check_placeholders(section: str, line: str, where: str) -> None:
    """The placeholders of one section's line are well formed, quoted where they sit in a tag, and exactly
    the ones static_html fills in (``_SCRUBBER_SECTIONS``)."""
    found: list[str] = []
    contexts = _tag_contexts(line)
    for m in Template.pattern.finditer(line):
        if m.group("escaped") is not None:
            continue  # $$: a literal dollar sign
        col = m.start() + 1
        if m.group("invalid") is not None:
            raise ValueError(f"{where}, column {col}: malformed placeholder {line[m.start():m.start() + 12]!r} in "
                             f"section {section!r}; write $name or ${{name}} ($$ for a dollar sign)")
        name = m.group("named") or m.group("braced")
        if name not in _SCRUBBER_SECTIONS[section]:
            raise ValueError(f"{where}, column {col}: unknown placeholder ${name} in section {section!r}; "
                             f"it holds {_placeholder_list(section)}")
        if contexts[m.start()] == "tag" and name not in _WHOLE_ATTRIBUTES:
            # html.escape makes a value safe inside a quoted attribute; unquoted, a space in it ends the value
            raise ValueError(f"{where}, column {col}: placeholder ${name} is an unquoted attribute value in "
                             f"section {section!r}; write attr=\"${name}\"")
        found.append(name)
    for name in dict.fromkeys(_SCRUBBER_SECTIONS[section]):
        want, got = _SCRUBBER_SECTIONS[section].count(name), found.count(name)
        if got == 0:
            raise ValueError(f"{where}: section {section!r} lacks placeholder ${name}; it holds "
                             f"{_placeholder_list(section)}")
        if got != want:
            raise ValueError(f"{where}: placeholder ${name} appears {got} times in section {section!r}, "
                             f"not {want}")
    if section == "control" and not re.search(r' on[a-z]+="\$(script|\{script\})"', line):
        raise ValueError(f"{where}: $script must be the whole value of an event attribute, "
                         f'e.g. oninput="$script"')


def _placeholder_list(section: str) -> str:
    names = dict.fromkeys(_SCRUBBER_SECTIONS[section])
    return ", ".join(f"${n}" for n in names) if names else "no placeholders"


def _comment_goes_on(line: str, where: str) -> bool:
    """Whether an HTML comment open before ``line`` is still open after it (nothing may follow its end)."""
    if "-->" not in line:
        return True
    if line.split("-->", 1)[1].strip():
        raise ValueError(f"{where}: text after the header comment's end: {line!r}")
    return False


def _parse_sections(text: str, resource: str) -> dict[str, Template]:
    """scrubber.html's sections, checked: a header comment, then ``<!-- section: NAME -->`` lines, each
    followed by its one line of HTML (blank lines aside). A section that spans two lines, an unknown, missing,
    repeated or empty section, text outside a section and a malformed, unknown, missing or repeated
    placeholder raise a ValueError naming ``resource`` and the line."""
    lines: dict[str, tuple[int, str]] = {}
    markers: dict[str, int] = {}
    name: str | None = None
    in_comment = False  # the header comment, before the first section
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        where = f"{resource} line {n}"
        if in_comment:  # the header comment goes on
            in_comment = _comment_goes_on(line, where)
            continue
        if re.match(r"<!--\s*section\b", line):
            m = _SECTION_MARKER.fullmatch(line)
            if m is None:
                raise ValueError(f"{where}: malformed section marker {line!r}; write <!-- section: NAME --> "
                                 "alone on its line")
            if name is not None and name not in lines:
                raise ValueError(f"{resource} line {markers[name]}: section {name!r} is empty")
            name = m.group(1)
            if name not in _SCRUBBER_SECTIONS:
                raise ValueError(f"{where}: unknown section {name!r}; the sections are "
                                 f"{', '.join(_SCRUBBER_SECTIONS)}")
            if name in markers:
                raise ValueError(f"{where}: section {name!r} again (first at line {markers[name]})")
            markers[name] = n
            continue
        if not line:
            continue
        if name is None and line.startswith("<!--"):  # the header comment, before the first section
            in_comment = _comment_goes_on(line[4:], where)
            continue
        if name is None:
            raise ValueError(f"{where}: text outside any section (only the header comment may come before "
                             f"the first <!-- section: NAME --> line): {line[:60]!r}")
        if name in lines:
            # the sections are concatenated into one line of HTML: a second line would be dropped, or glued
            # to the first without the line break it was written with
            raise ValueError(f"{where}: section {name!r} spans two lines ({lines[name][0]} and {n}); each "
                             "section is one line")
        lines[name] = n, line
    if name is not None and name not in lines:
        raise ValueError(f"{resource} line {markers[name]}: section {name!r} is empty")
    missing = [s for s in _SCRUBBER_SECTIONS if s not in markers]
    if missing:
        raise ValueError(f"{resource}: no section {', '.join(map(repr, missing))} (it needs "
                         f"{', '.join(_SCRUBBER_SECTIONS)}, each as <!-- section: NAME --> and one line)")
    for section, (n, line) in lines.items():
        _check_placeholders(section, line, f"{resource} line {n}")
    return {section: Template(line) for section, (_, line) in lines.items()}


def _inline_script(text: str, resource: str) -> str:
    """scrubber.js as the one line that goes into each range input's ``oninput`` attribute.

    How it is inlined: each line is stripped, a blank line or a line that is a ``//`` comment of its own is
    dropped, and the rest are concatenated WITHOUT a separator into one line; ``static_html`` html-escapes
    that line into ``oninput="..."`` (the browser un-escapes it before it compiles the handler, so quotes,
    ``&&``, ``<`` or ``</script>`` reach the handler intact: the page holds no ``<script>`` element, and
    no raw ``<`` of the script at all). What the join breaks, silently (the book builds, and the slider
    stops moving the frames or the handler fails to compile, visible only in a browser's console), raises
    a ValueError naming ``resource`` and the line:

    * a ``//`` comment after code: it runs to the end of its line, and after the join the end of its line
      is the end of the whole script, so it would comment out the rest of its line AND every line after it;
    * a line that does not end with ``;``, ``{``, ``}``, ``,``, ``(`` or ``[``: JavaScript inserts a
      semicolon at a line break where a statement cannot go on (``var a=1`` / ``b=2``, ``return`` /
      ``x``); without the line break there is none (``var a=1b=2`` does not compile, ``returnx`` is a name);
    * a string or template literal that does not close on its line: a backslash-continued string or a
      template literal would lose its line break;
    * a ``/* */`` comment still open at the end, and a script with no code.

    A ``//`` inside a string is no comment and passes; a regular expression literal is read as code, so a
    ``//`` in one fails loudly (write ``new RegExp(...)``). A ``}`` that closes an expression (a function
    expression, an object literal) followed by more code needs its ``;`` too, which this check cannot tell
    from a block's ``}``: the browser test (``tests/test_scrubber_browser.py``) runs the script.
    """
    code: list[str] = []
    in_block = False  # inside a /* */ comment
    opened = 0  # the line where the last /* comment opened
    last: tuple[str, int] | None = None  # the last character of code so far (not a comment), and its line
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not in_block and (not line or line.startswith("//")):
            continue
        where = f"{resource} line {n}"
        quote = ""
        k = 0
        while k < len(line):
            ch = line[k]
            if in_block:
                if line.startswith("*/", k):
                    in_block, k = False, k + 2
                    continue
            elif quote:
                if ch == "\\":
                    k += 2
                    continue
                if ch == quote:
                    quote = ""
                last = ch, n
            elif line.startswith("/*", k):
                in_block, opened, k = True, n, k + 2
                continue
            elif line.startswith("//", k):
                raise ValueError(f"{where}, column {k + 1}: a // comment after code; the script's lines are "
                                 "joined into one line (the oninput attribute), where it would comment out "
                                 "everything after it. Put the comment on a line of its own, or use /* */")
            else:
                if ch in "'\"`":
                    quote = ch
                if not ch.isspace():
                    last = ch, n
            k += 1
        if quote:
            raise ValueError(f"{where}: a string opened with {quote} does not close on its line; the script's "
                             "lines are joined without line breaks")
        if not in_block and last is not None and last[0] not in _SCRIPT_LINE_ENDS:
            raise ValueError(f"{resource} line {last[1]}: the line ends with {last[0]!r}, not with one of "
                             f"{' '.join(sorted(_SCRIPT_LINE_ENDS))}; the script's lines are joined without "
                             "line breaks, so no semicolon is inserted there")
        code.append(line)
    if in_block:
        raise ValueError(f"{resource} line {opened}: a /* comment is not closed")
    if last is None:
        raise ValueError(f"{resource}: no code")
    if last[0] not in ";}":
        raise ValueError(f"{resource} line {last[1]}: the script ends with {last[0]!r}, not ; or }}")
    return "".join(code)


@dataclass(frozen=True)
class ScrubberTemplate:
    """The static scrubber's HTML sections (``string.Template``s) and its one line of JavaScript.

    :meth:`parse` checks them; :func:`scrubber_template` is the package's own (``scrubber.html`` and
    ``scrubber.js`` next to this module); ``Explorer.static_html(template)`` renders with another.
    """

    sections: dict[str, Template]
    script: str

    @classmethod
    def parse(cls, html_text: str, js_text: str, html_name: str = "attnbook/explorers/scrubber.html",
              js_name: str = "attnbook/explorers/scrubber.js") -> ScrubberTemplate:
        """Check and split a scrubber template (the text of ``scrubber.html``) and inline its script (the
        text of ``scrubber.js``). Raises ValueError naming ``html_name`` or ``js_name`` and the line when
        a section spans two lines or is unknown, missing, repeated or empty; when a placeholder is
        malformed, unknown, missing, repeated or unquoted in a tag; when the script holds what its join into
        one line would break (a ``//`` comment after code, a line that relies on an inserted semicolon, a
        string across lines)."""
        for arg, value in (("html_text", html_text), ("js_text", js_text)):
            if not isinstance(value, str):
                raise TypeError(f"{arg} must be the text of a file (a str), got {type(value).__name__}")
        return cls(_parse_sections(html_text, html_name), _inline_script(js_text, js_name))


@functools.lru_cache(maxsize=1)
def scrubber_template() -> ScrubberTemplate:
    """The package's scrubber template (``scrubber.html`` and ``scrubber.js``), read and checked once."""
    folder = resources.files(__package__)
    return ScrubberTemplate.parse(folder.joinpath("scrubber.html").read_text(encoding="utf-8"),
                                  folder.joinpath("scrubber.js").read_text(encoding="utf-8"))


@dataclass
class Explorer:
    """Controls + ``compute`` + a picture, shown live and as a static scrubber.

    ``compute(**values) -> dict`` does the numbers; the picture comes from the
    ``layout``/``build``/``redraw`` hooks (see the module docstring) or from a
    plain ``draw(data) -> Figure``; ``caption(data) -> str`` (optional) is a
    line of text under it (``static_caption`` the book's, where it differs).
    ``update(**values)`` recomputes and keeps ``values``, ``data`` and
    ``figure``; moving a widget calls it. ``limits(values)`` (optional) bounds
    some controls by the others and says which do not apply; ``busy(values)``
    (optional) is the message shown while a slow update computes.
    ``extras(explorer) -> widgets`` (optional) adds ipywidgets under the live
    view, e.g. a grid to draw on; the book's scrubber does not show them.
    """

    title: str
    controls: Sequence[Control]
    compute: Callable[..., dict]
    draw: Callable[[dict], Figure] | None = None
    caption: Callable[[dict], str] | None = None
    frame_dpi: float | None = None  # None: the figure's own dpi (and the fast path)
    layout: Callable[[dict], Hashable] | None = None
    build: Callable[[dict], tuple[Figure, dict[str, Any]]] | None = None
    redraw: Callable[[dict, dict[str, Any]], None] | None = None
    extras: Callable[[Explorer], Sequence[Any]] | None = None
    limits: Callable[[dict], dict[str, Sequence[Any] | None]] | None = None
    busy: Callable[[dict], str | None] | None = None
    static_caption: Callable[[dict], str] | None = None
    values: dict = field(init=False)
    data: dict = field(init=False)
    figure: Figure = field(init=False)
    allowed: dict = field(init=False, default_factory=dict)
    _widget: Any = field(init=False, default=None, repr=False)
    _figures: dict = field(init=False, default_factory=dict, repr=False)
    _refresh: bool = field(init=False, default=True, repr=False)
    _syncing: bool = field(init=False, default=False, repr=False)
    _offered: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.controls = list(self.controls)
        names = [c.name for c in self.controls]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate control names in {names}")
        hooks = self.build is not None, self.redraw is not None
        if self.draw is not None and any(hooks):
            raise ValueError("give either draw or the build/redraw hooks, not both")
        if self.draw is None and not all(hooks):
            raise ValueError("an explorer needs draw(data), or build(data) and redraw(data, artists)")
        if self.layout is not None and self.build is None:
            raise ValueError("layout is a hook of build/redraw; give those too")
        self.values = {c.name: c.default for c in self.controls}
        self.update()

    def __repr__(self) -> str:
        vals = ", ".join(f"{c.label}={c.fmt(self.values[c.name])}" for c in self.controls)
        return f"<{self.title} explorer: {vals}>"

    # -- the logic, usable without a browser or a kernel ----------------------
    def control(self, name: str) -> Control:
        """The control called ``name``."""
        for c in self.controls:
            if c.name == name:
                return c
        raise KeyError(f"no control named {name!r}; controls: {[c.name for c in self.controls]}")

    def update(self, **changes: Any) -> dict:
        """Set some control values (by name), recompute and redraw; returns ``data``. A value outside the
        ``limits`` hook's bounds moves to the nearest value inside them."""
        for name, value in changes.items():
            c = self.control(name)
            if value not in c.values:
                raise ValueError(f"{c.label}={value!r} is not one of {c.values!r}")
        self.values, self.allowed = self._within_limits({**self.values, **changes})
        live = self._widget is not None and self._refresh
        message = self.busy(dict(self.values)) if live and self.busy is not None else None
        if message:
            self._caption_w.value = (f'<div style="line-height:1.4;color:#8a5a00">&#8987; {html.escape(message)}</div>')
        self.data = self.compute(**self.values)
        self.figure = self._picture(self.data, LIVE_SCALE if live else 1)
        if live:
            self._refresh_widget()
        return self.data

    def _within_limits(self, values: dict) -> tuple[dict, dict[str, list | None]]:
        """``values`` moved inside the ``limits`` hook's bounds (each to the nearest allowed value, by position
        in its control's values; a tie to the earlier one), and the bounds: ``{name: allowed values, or None
        when the control does not apply}``. Repeated until nothing moves (a bound may depend on a value that
        moved)."""
        if self.limits is None:
            return values, {}
        values = dict(values)
        for _ in range(len(self.controls) + 1):
            allowed: dict[str, list | None] = {}
            moved = False
            for name, ok in self.limits(dict(values)).items():
                c = self.control(name)
                if ok is None:
                    allowed[name] = None
                    continue
                ok = list(ok)
                if not ok or any(v not in c.values for v in ok):
                    raise ValueError(f"limits for {c.label}: {ok!r} must be a non-empty subset of {c.values!r}")
                allowed[name] = ok
                if values[name] not in ok:
                    at = c.values.index(values[name])
                    values[name] = min(ok, key=lambda v: (abs(c.values.index(v) - at), c.values.index(v)))
                    moved = True
            if not moved:
                return values, allowed
        raise RuntimeError(f"{self.title}: the limits hook does not settle on values {values!r}")

    def _picture(self, data: dict, scale: int = 1) -> Figure:
        """The figure for ``data``, at ``scale`` times its own dpi (the live widget's is sharper than the
        scrubber's frames; one figure is kept per layout and scale)."""
        if self.draw is not None:
            fig = self.draw(data)
            fig._attnbook_css_px = _css_size(fig, fig.dpi)  # type: ignore[attr-defined]
            if scale != 1:
                fig.set_dpi(fig.dpi * scale)
            return fig
        assert self.build is not None and self.redraw is not None
        key = (self.layout(data) if self.layout is not None else None, scale)
        if key not in self._figures:
            fig, artists = self.build(data)
            fig._attnbook_css_px = _css_size(fig, fig.dpi)  # type: ignore[attr-defined]
            if scale != 1:
                fig.set_dpi(fig.dpi * scale)
            FastFigure(fig, _dynamic_artists(artists))
            self._figures[key] = fig, artists
        fig, artists = self._figures[key]
        self.redraw(data, artists)
        return fig

    def unused(self) -> list[Control]:
        """The shown controls that do not apply to the current values (the ``limits`` hook says ``None``)."""
        return [c for c in self.controls if c.shown and c.name in self.allowed and self.allowed[c.name] is None]

    def caption_text(self, static: bool = False) -> str:
        """The caption of the current data ("" without a caption hook), the book's with ``static`` (the
        ``static_caption`` hook, where there is one); it ends by naming the controls that do not apply."""
        hook = self.static_caption if static and self.static_caption is not None else self.caption
        text = hook(self.data) if hook is not None else ""
        off = [str(c.label) for c in self.unused()]
        if off:
            text += f"{'; ' if text else ''}{' and '.join(off)} {'does' if len(off) == 1 else 'do'} not apply here"
        return text

    # -- live widget -------------------------------------------------------------
    @property
    def widget(self) -> Any:
        """The ipywidgets UI (built on first use)."""
        if self._widget is None:
            import ipywidgets as W

            self._controls_w = {c.name: c.make_widget() for c in self.controls}
            # shown at the figure's size (set by _refresh_widget), never stretched to the output's width, and
            # in a narrow output at LIVE_MIN_SHARE of it at least, in a box that scrolls sideways
            self._image_w = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto",
                                                                  align_self="flex-start"))
            image_box = W.Box([self._image_w], layout=W.Layout(max_width="100%", overflow="auto hidden",
                                                               flex="0 0 auto"))
            self._caption_w = W.HTML()
            stale = W.HTML(f'<div class="attnbook-stale-hint" style="color:#777;font-size:85%;line-height:1.3">'
                           f'{html.escape(STALE_HINT)}</div>', layout=W.Layout(max_width="100%"))
            rows = []
            for c in self.controls:
                w = self._controls_w[c.name]
                w.observe(self._on_change(c.name), names="value")
                self._offered[c.name] = list(c.values)
                if not c.shown:
                    w.layout.display = "none"  # one value: it would change nothing
                if c.hint:
                    note = W.HTML(f'<div style="color:#555;font-size:90%;line-height:1.3">{html.escape(c.hint)}</div>',
                                  layout=W.Layout(margin="0 0 0 0.8em", max_width="36em"))
                    rows.append(W.HBox([w, note], layout=W.Layout(align_items="center", flex_flow="row wrap")))
                else:
                    rows.append(w)
            title = W.HTML(f"<b>{html.escape(self.title)}</b>")
            extra = list(self.extras(self)) if self.extras is not None else []
            self._widget = W.VBox([title, *rows, image_box, self._caption_w, *extra, stale],
                                  layout=W.Layout(max_width="100%"))
            self.update()  # the figure again, at the live scale
        return self._widget

    @property
    def control_widgets(self) -> dict[str, Any]:
        """The live widget's controls by name (the widget is built on first use): setting one's ``value``
        is what moving it does."""
        self.widget  # noqa: B018 (builds the controls)
        return dict(self._controls_w)

    @property
    def image_widget(self) -> Any:
        """The live widget's image (an ``ipywidgets.Image``; its ``value`` is the current frame's PNG)."""
        self.widget  # noqa: B018 (builds it)
        return self._image_w

    @property
    def caption_widget(self) -> Any:
        """The live widget's caption (an ``ipywidgets.HTML``)."""
        self.widget  # noqa: B018 (builds it)
        return self._caption_w

    def _on_change(self, name: str) -> Callable[[dict], None]:
        def handler(change: dict) -> None:
            if self._syncing:  # the explorer itself is setting the widget (new options, a value moved)
                return
            if self.values.get(name) != change["new"]:
                self.update(**{name: change["new"]})

        return handler

    def _refresh_widget(self) -> None:
        self._syncing = True
        try:
            for c in self.controls:
                w = self._controls_w[c.name]
                ok = self.allowed.get(c.name, c.values)
                offered = list(c.values) if ok is None else list(ok)
                if offered != self._offered[c.name]:  # bounded by another control: offer only what applies
                    with w.hold_sync():
                        w.options = [(c.fmt(v), v) for v in offered]
                        w.value = self.values[c.name]
                    self._offered[c.name] = offered
                if w.value != self.values[c.name]:
                    w.value = self.values[c.name]
                disabled = ok is None or len(offered) == 1
                if w.disabled != disabled:
                    w.disabled = disabled
        finally:
            self._syncing = False
        width, _ = getattr(self.figure, "_attnbook_css_px", _css_size(self.figure, self.figure.dpi / LIVE_SCALE))
        if self._image_w.layout.width != f"{width}px":
            self._image_w.layout.width = f"{width}px"
            self._image_w.layout.min_width = f"{round(LIVE_MIN_SHARE * width)}px"
        self._image_w.value = figure_png(self.figure)
        self._caption_w.value = f'<div style="line-height:1.4">{html.escape(self.caption_text())}</div>'

    # -- static scrubber -----------------------------------------------------------
    def frames(self) -> Iterator[tuple[dict, bytes, str]]:
        """Yield ``(values, png_bytes, caption)`` for every combination of the
        controls' static values, the first control varying slowest (the caption is the book's,
        ``static_caption`` where given). A live widget is left alone meanwhile and shows the restored
        values after."""
        saved = dict(self.values)
        self._refresh = False
        try:
            for combo in itertools.product(*(c.static_values for c in self.controls)):
                self.update(**dict(zip([c.name for c in self.controls], combo)))
                yield dict(self.values), figure_png(self.figure, self.frame_dpi), self.caption_text(static=True)
        finally:
            self._refresh = True
            self.update(**saved)

    def static_html(self, template: ScrubberTemplate | None = None) -> str:
        """A self-contained scrubber: one range input per control with more than
        one static value, a label showing the current value, and the frames as
        inline PNGs. No external script, style or font (see ``scrubber.html``).
        ``template``: another :class:`ScrubberTemplate` (default: the package's,
        :func:`scrubber_template`)."""
        template = template if template is not None else scrubber_template()
        tpl = template.sections
        esc = html.escape
        frames = list(self.frames())
        moving = [c for c in self.controls if len(c.static_values) > 1]
        strides, s = {}, 1
        for c in reversed(self.controls):
            strides[c.name] = s
            s *= len(c.static_values)
        start = 0
        for c in self.controls:
            value = self.values[c.name] if self.values[c.name] in c.static_values else c.static_values[0]
            start += c.static_values.index(value) * strides[c.name]
        digest = hashlib.sha1(b"".join(png for _, png, _ in frames)).hexdigest()[:10]
        script = esc(template.script)
        parts = [tpl["open"].substitute(digest=digest, title=esc(self.title))]
        labelwidth = max((len(str(c.label)) for c in moving), default=0) + 1
        for c in moving:
            labels = [c.fmt(v) for v in c.static_values]
            idx = c.static_values.index(self.values[c.name]) if self.values[c.name] in c.static_values else 0
            parts.append(tpl["control"].substitute(
                label=esc(str(c.label)), labelwidth=labelwidth, valuewidth=max(map(len, labels)) + 1,
                value=esc(labels[idx]), max=len(labels) - 1, index=idx,
                name=esc(c.name), stride=strides[c.name], labels=esc(json.dumps(labels)), script=script))
        fixed = [c for c in self.controls if len(c.static_values) == 1 and c.shown]
        if fixed:
            parts.append(tpl["fixed"].substitute(text=esc(", ".join(f"{c.label} = {c.fmt(c.static_values[0])}" for c in fixed))))
        for i, (_, png, cap) in enumerate(frames):
            parts.append(tpl["frame"].substitute(
                i=i, hidden="" if i == start else ' style="display:none"', title=esc(self.title),
                png=base64.b64encode(png).decode("ascii"), caption=esc(cap)))
        parts.append(tpl["close"].substitute())
        return "".join(parts)

    # -- display -----------------------------------------------------------------------
    def _ipython_display_(self, **kwargs: Any) -> None:
        from IPython.display import display

        if in_colab():
            # the frames first: the widget does not exist yet, so no frame is encoded for it on the way
            scrubber = self.static_html()
            display(self.widget)
            display({"text/html": Template(COLAB_FALLBACK).substitute(scrubber=scrubber),
                     "text/plain": f"(static preview of {self.title})"}, raw=True)
            return
        # for the book, the scrubber (frames first, as above); in a reader's kernel, one line in its place
        page = self.static_html() if book_outputs() else Template(LIVE_NOTE).substitute(title=html.escape(self.title))
        data: dict[str, Any] = {"text/plain": repr(self), "text/html": page}
        widget = self.widget
        bundle = widget._repr_mimebundle_() if hasattr(widget, "_repr_mimebundle_") else None
        if bundle and WIDGET_VIEW_MIME in bundle:  # ipywidgets 8
            data[WIDGET_VIEW_MIME] = bundle[WIDGET_VIEW_MIME]
        else:  # ipywidgets 7: the same view payload its _ipython_display_ sends
            data[WIDGET_VIEW_MIME] = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
            if hasattr(widget, "_handle_displayed"):
                widget._handle_displayed(**kwargs)
        display(data, raw=True)
