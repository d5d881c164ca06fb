"""Every number the prose states is one the chapter prints (or sets in its code).

A chapter's markdown may not claim "0.57" or "3.2e+05" unless a stored output of the same chapter shows that
value (at the precision the prose gives: "about 0.30" is matched by a printed 0.302, "6e-3" by 5.52e-03 but
"5e-3" is not), or its code uses it as a parameter (a learning rate, a dropout). Numbers checked: those with a
decimal point, an exponent or a thousands separator (0.57, 3.2e+05, 25.8, 127,886). Not checked: headings,
section/chapter/exercise references, version numbers, code spans, math, links, and plain small integers.

A number that cannot be printed (a figure cited from a paper, a value derived by hand in the text) goes on
ALLOWED below with the reason. Keep that list short: print the number instead where you can.
"""

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9A-Z][0-9]_*.ipynb"))

# (chapter file stem prefix, number as written in the prose) -> why it is not printed by the chapter
ALLOWED: dict[tuple[str, str], str] = {
    ("03_", "0.9"): "BLEU difference cited from the Transformer paper's ablation (Vaswani et al., 2017, Table 3)",
    ("03_", "0.4"): "BLEU difference cited from the Transformer paper's ablation (Vaswani et al., 2017, Table 3)",
}

# words after which a dotted number is a reference or a version, not a quantity
_REFERENCE_WORDS = (
    r"(?:sections?|chapters?|ch\.?|exercises?|ex\.?|§|figures?|fig\.?|tables?|eqs?\.?|equations?|cells?|"
    r"versions?|v|python|pytorch|torch|ipywidgets|jupyter book|jupyter-book|colab|numpy|transformers|"
    r"matplotlib|scikit-learn|cuda|llama|gpt|myst-nb|nbval|jupyterlab|book|flashattention|flashattention-)"
)
_REFERENCE = re.compile(rf"\b{_REFERENCE_WORDS}\s*(?:\d+(?:\.\d+)*(?:\s*(?:-|–|and|,|or|to)\s*)?)+", re.I)
_VERSION = re.compile(r"\d+\.\d+\.\d+[\w.]*")
# the prose numbers that are checked
_PROSE_NUMBER = re.compile(
    r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?"  # 127,886 or 1,234.5
    r"|\d*\.\d+(?:[eE][-+]?\d+)?"  # 0.57, .5, 3.2e+05
    r"|\d+[eE][-+]?\d+)"  # 3e-05
    r"(?![\d,]\d)"
)
# every numeric token in outputs and code
_ANY_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<![\w\d])\.\d+(?:[eE][-+]?\d+)?")
_BASE64 = re.compile(r"data:image/[a-z+]+;base64,[A-Za-z0-9+/=]+")


def _strip_markdown(text: str) -> str:
    """The prose a reader reads as words: no code, no math, no headings, no link targets, no HTML."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", " ", text, flags=re.S)
    text = re.sub(r"(?<!\\)\$[^$\n]+?(?<!\\)\$", " ", text)
    text = re.sub(r"``.+?``|`[^`\n]+`", " ", text)
    text = re.sub(r"^\s{0,3}#{1,6}\s.*$", " ", text, flags=re.M)
    text = re.sub(r"\]\([^)]*\)", "] ", text)  # link targets
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"\b(?:19|20)\d\d[a-z]?\b", " ", text)  # years of citations
    text = _VERSION.sub(" ", text)
    text = _REFERENCE.sub(" ", text)
    return text


def _value(token: str) -> float | None:
    try:
        return float(token.replace(",", ""))
    except ValueError:
        return None


def _values(text: str) -> set[float]:
    found = set()
    for tok in _ANY_NUMBER.findall(text):
        for cand in {tok, tok.rstrip(",")} | set(tok.split(",")):
            v = _value(cand)
            if v is not None:
                found.add(abs(v))
    return found


_SCALES = {"%": 100.0, "thousand": 1e-3, "million": 1e-6, "billion": 1e-9}


def _rounds_to(x: float, token: str, unit: str = "") -> bool:
    """Whether x, written at the precision of `token`, reads as `token` ("98.4%" reads 0.984 too, "22.6 million"
    reads 22,600,000 too)."""
    target = abs(_value(token))
    candidates = [x, x * _SCALES[unit]] if unit in _SCALES else [x]
    mant = token.lower().split("e")[0].replace(",", "")
    if "e" in token.lower():  # significant figures of the mantissa
        sig = len(mant.replace(".", "").lstrip("0")) or 1
        return any(y > 0 and float(f"{y:.{sig - 1}e}") == target for y in candidates)
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return any(math.isclose(round(y, decimals), target, rel_tol=1e-9, abs_tol=10 ** -(decimals + 3))
               for y in candidates)


def _chapter_texts(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    prose, printed, code = [], [], []
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            prose.append(src)
            continue
        if cell["cell_type"] != "code":
            continue
        code.append(re.sub(r"(?<=\d)_(?=\d)", "", src))  # 10_000 -> 10000
        for out in cell.get("outputs", []):
            if "text" in out:
                printed.append("".join(out["text"]))
            for mime in ("text/plain", "text/html", "text/markdown", "text/latex"):
                if mime in out.get("data", {}):
                    printed.append(_BASE64.sub(" ", "".join(out["data"][mime])))
    return prose, "\n".join(printed), "\n".join(code)


def unsupported_numbers(path: Path) -> list[str]:
    prose, printed, code = _chapter_texts(path)
    known = _values(printed) | _values(code)
    missing = []
    for cell in prose:
        text = _strip_markdown(cell)
        for m in _PROSE_NUMBER.finditer(text):
            token = m.group(0)
            after = re.match(r"\s?(%|thousand|million|billion)", text[m.end():m.end() + 9])
            unit = after.group(1) if after else ""
            if any(path.stem.startswith(ch) and token == tok for ch, tok in ALLOWED):
                continue
            if not any(_rounds_to(x, token, unit) for x in known):
                context = text[max(0, m.start() - 40):m.end() + 20].replace("\n", " ")
                missing.append(f"{token!r} in ...{context}...")
    return missing


def test_the_matcher_reads_precision_like_a_reader():
    assert _rounds_to(0.302, "0.30") and not _rounds_to(0.302, "0.31")
    assert _rounds_to(5.52e-3, "6e-3") and not _rounds_to(5.52e-3, "5e-3")
    assert _rounds_to(317000.0, "3.2e+05")
    assert _rounds_to(127886.0, "127,886")
    assert _rounds_to(0.984, "98.4", "%") and not _rounds_to(0.984, "98.4")
    assert _rounds_to(22_713_216.0, "22.7", "million") and not _rounds_to(22_713_216.0, "22.6", "million")
    text = _strip_markdown("See section 2.3 and chapter 5.2-5.4; $x = 0.5$ and `lr=0.1`; torch 2.11 gives 0.57.")
    assert [m.group(0) for m in _PROSE_NUMBER.finditer(text)] == ["0.57"]


def test_allowlist_entries_are_used_and_explained():
    for (chapter, token), why in ALLOWED.items():
        assert len(why) > 15, f"say why {token} in {chapter} cannot be printed"
        matches = [p for p in CHAPTERS if p.stem.startswith(chapter)]
        assert matches, f"ALLOWED names chapter {chapter!r}, which does not exist"
        prose = " ".join(_strip_markdown(c) for p in matches for c in _chapter_texts(p)[0])
        assert token in prose, f"ALLOWED entry {token} is no longer in {chapter}'s prose: remove it"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_prose_numbers_are_printed_by_the_chapter(path):
    missing = unsupported_numbers(path)
    assert not missing, (f"{path.name}: numbers in the prose that no output prints and no code sets "
                         f"(print them, fix the prose, or add them to ALLOWED with a reason):\n  "
                         + "\n  ".join(missing))
