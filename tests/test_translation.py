"""The translations: one message catalog per page, ``locales/<language>/LC_MESSAGES/**.po``.

* **complete**: every message translated, none fuzzy (``sphinx-intl update`` marks a message fuzzy when its
  English changed: the old translation is only a draft until someone reviews it);
* **current**: each catalog holds exactly the messages its English page has now, extracted the way
  ``python3 tools/dev.py catalogs`` extracts them (English prose edited without running it fails here);
* **faithful**: a translation keeps its English message's inline code, math, link targets and numbers;
* **consistent**: each glossary entry's translated term (the bold start of its translated definition,
  ``**中文术语** · ...``) is what the pages the entry links to use wherever their English uses the term, and a
  competing form that the glossary records (the source tutorial's word where the edition corrects it) is used
  nowhere except between quotation marks;
* **one term, one rendering** (``locales/<language>/terms.yml``): wherever a message's English uses a listed term,
  its translation uses the chosen rendering and none of the rejected variants (exceptions listed with a reason);
  a message repeated in several catalogs has one translation; a quotation of the source tutorial is its words;
  a product is written with ×.

The translated book itself is built with ``-W`` by the test command (``tools/dev.py test`` builds both editions
strictly), and ``tests/test_browser.py`` opens every translated page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from babel.messages.catalog import Message
from babel.messages.pofile import read_po

from tools.editions import locales, translations

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = translations()
CATALOGS = [(language, str(po.relative_to(locales() / language / "LC_MESSAGES").with_suffix("")))
            for language in LANGUAGES for po in sorted((locales() / language / "LC_MESSAGES").rglob("*.po"))]


def catalog_path(language: str, domain: str) -> Path:
    return locales() / language / "LC_MESSAGES" / f"{domain}.po"


def messages(language: str, domain: str) -> list[Message]:
    """The catalog's messages in order, without the header and the obsolete (``#~``) ones."""
    with catalog_path(language, domain).open("rb") as f:
        return [m for m in read_po(f, abort_invalid=True) if m.id]


def _ids(catalog: list[Message]) -> str:
    return "\n".join(f"    {m.id[:100]!r}" for m in catalog[:5]) + (
        f"\n    ... and {len(catalog) - 5} more" if len(catalog) > 5 else "")


# ---------------------------------------------------------------------------------------------- complete

@pytest.mark.parametrize(("language", "domain"), CATALOGS, ids=[f"{lang}:{d}" for lang, d in CATALOGS])
def test_every_message_is_translated_and_none_is_fuzzy(language, domain):
    catalog = messages(language, domain)
    empty = [m for m in catalog if not m.string]
    fuzzy = [m for m in catalog if m.fuzzy and m.string]
    assert not empty and not fuzzy, (
        f"{catalog_path(language, domain).relative_to(ROOT)}: {len(empty)} of {len(catalog)} messages untranslated, "
        f"{len(fuzzy)} fuzzy (changed in English since they were translated: review, then drop the fuzzy flag)"
        + (f"\n  untranslated:\n{_ids(empty)}" if empty else "") + (f"\n  fuzzy:\n{_ids(fuzzy)}" if fuzzy else ""))


# ----------------------------------------------------------------------------------------------- current

@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    """The English pages' messages now: Sphinx's gettext builder through tools/editions.py (what
    ``python3 tools/dev.py catalogs`` runs before ``sphinx-intl update``), one .pot per page."""
    out = tmp_path_factory.mktemp("gettext") / "gettext"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "editions.py"), "gettext", "en", "--outdir", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"extracting the English messages failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out


@pytest.mark.parametrize("language", LANGUAGES)
def test_catalogs_hold_exactly_the_messages_of_the_english_pages(language, extracted):
    pots = {str(p.relative_to(extracted).with_suffix("")): p for p in extracted.rglob("*.pot")}
    domains = {d for lang, d in CATALOGS if lang == language}
    assert pots, "the gettext build wrote no .pot file"
    problems = [f"{d}: no catalog for this page" for d in sorted(set(pots) - domains)]
    problems += [f"{d}: a catalog for a page the book no longer has" for d in sorted(domains - set(pots))]
    for domain in sorted(set(pots) & domains):
        with pots[domain].open("rb") as f:
            english = {m.id for m in read_po(f) if m.id}
        have = {m.id for m in messages(language, domain)}
        if english - have:
            problems.append(f"{domain}: {len(english - have)} English message(s) missing, e.g. "
                            f"{sorted(english - have)[0][:100]!r}")
        if have - english:
            problems.append(f"{domain}: {len(have - english)} message(s) no longer in the English page, e.g. "
                            f"{sorted(have - english)[0][:100]!r}")
    assert not problems, ("the catalogs are out of date with the English pages: run `python3 tools/dev.py "
                          "catalogs`, then translate what it leaves empty or fuzzy\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------- faithful

ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")  # a MyST role, {doc}`text <target>`: its text may be translated
CODE = re.compile(r"`[^`]+`")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.S)
LINK = re.compile(r"\]\(([^)]+)\)")
# a number: not the tail of a Latin word or of another number (a Chinese character may touch it: "第4章")
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d+(?:\.\d+)?(?:e-?\d+)?")


def _role_target(role: str) -> str:
    target = re.search(r"<([^>]+)>`$", role)
    return role.split("`", 1)[0] + (target.group(1) if target else role.split("`", 1)[1])


def prose(text: str) -> str:
    """``text`` without its code, math and link targets (what a translation rewords)."""
    return LINK.sub("]", MATH.sub(" ", CODE.sub(" ", ROLE.sub(" ", text))))


def mismatches(english: str, translated: str) -> list[str]:
    """What ``translated`` fails to keep of ``english``: inline code, math and link targets (each the same, as
    often), the target of each MyST role, and every number of the prose."""
    problems = []
    en_roles, tr_roles = ROLE.findall(english), ROLE.findall(translated)
    for name, a, b in [
        ("role targets", [_role_target(r) for r in en_roles], [_role_target(r) for r in tr_roles]),
        ("inline code", CODE.findall(ROLE.sub(" ", english)), CODE.findall(ROLE.sub(" ", translated))),
        ("math", MATH.findall(CODE.sub(" ", english)), MATH.findall(CODE.sub(" ", translated))),
        ("link targets", LINK.findall(english), LINK.findall(translated)),
    ]:
        if Counter(a) != Counter(b):
            missing, extra = Counter(a) - Counter(b), Counter(b) - Counter(a)
            problems.append(f"{name} differ: missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}")
    numbers = set(NUMBER.findall(prose(english))) - set(NUMBER.findall(prose(translated)))
    if numbers:
        problems.append(f"numbers missing: {sorted(numbers)}")
    return problems


def test_the_faithfulness_check_finds_what_a_translation_dropped():
    english = "Call `F.softmax` on $QK^\\top / \\sqrt{d_k}$ ([chapter 2](02_x.ipynb)): 0.721 at T = 4096."
    assert mismatches(english, "对 $QK^\\top / \\sqrt{d_k}$ 调用 `F.softmax`（[第 2 章](02_x.ipynb)）：T = 4096 时为 0.721。") == []
    assert mismatches(english, "在第2章（[第2章](02_x.ipynb)）中对 $QK^\\top / \\sqrt{d_k}$ 调用 `F.softmax`：T = 4096 时为 0.721。") == []
    dropped = mismatches(english, "调用 `softmax`，$QK^\\top$（[第 2 章](03_x.ipynb)）：T = 4096 时约为 0.72。")
    assert [p.split(" ")[0] for p in dropped] == ["inline", "math", "link", "numbers"], dropped
    assert "0.721" in dropped[-1]
    assert mismatches("See {doc}`the glossary <glossary>`.", "见{doc}`术语表 <glossary>`。") == []
    assert mismatches("See {doc}`the glossary <glossary>`.", "见{doc}`术语表 <intro>`。") != []


@pytest.mark.parametrize(("language", "domain"), CATALOGS, ids=[f"{lang}:{d}" for lang, d in CATALOGS])
def test_translations_keep_code_math_links_and_numbers(language, domain):
    quotes = term_list(language)["tutorial_quotes"] if language in TERM_LANGUAGES else []
    problems = [f"{m.id[:70]!r}\n      " + "; ".join(found) for m in messages(language, domain)
                if m.string and (found := mismatches(*without_tutorial_quotes(m.id, m.string, quotes)))]
    assert not problems, (f"{catalog_path(language, domain).relative_to(ROOT)}: {len(problems)} translation(s) "
                          "changed what must stay as it is:\n    " + "\n    ".join(problems[:10]))


# -------------------------------------------------------------------------------------------- consistent

PAREN = re.compile(r"\s*[（(][^）)]*[）)]")
DEFINITION = re.compile(r"^(?:—|\*\*(?P<source>[^*]+)\*\*)[^·\n]*· ")  # "**source term** (...) · text" or "— · text"
TRANSLATED_TERM = re.compile(r"^\*\*(?P<term>[^*]+)\*\*[^·\n]*· ")
CHAPTER_LINK = re.compile(r"\]\((chapters/[^)#]+)\.ipynb")
QUOTED = re.compile(r"“[^”]*”|「[^」]*」|‘[^’]*’")


def _squash(text: str) -> str:
    """For comparing terms: no white space (Chinese sets none between its words), Latin letters in lower case."""
    return re.sub(r"\s+", "", text).casefold()


def _parts(term: str) -> list[str]:
    """A term split at "/", each part with its parenthesis: "GQA / MQA" -> ["GQA", "MQA"]."""
    return [p for p in re.split(r"\s*/\s*(?![^（(]*[）)])", term.strip()) if p]


def _forms(part: str) -> list[str]:
    """The ways a translated term may be written: "分组查询注意力（GQA）" as itself without the parenthesis, or as
    the abbreviation in it."""
    return [PAREN.sub("", part).strip(), *re.findall(r"[（(]([^）)]+)[）)]", part)]


def _english_use(word: str) -> re.Pattern:
    """``word`` as a whole term in English prose, plural or not, capitalised at a sentence start."""
    head = re.escape(word)
    if word[:1].islower():
        head = f"[{word[0]}{word[0].upper()}]{re.escape(word[1:])}"
    tail = r"(?:y|ies)" if word.endswith("y") else r"(?:s|es)?"
    if word.endswith("y"):
        head = head[:-1]
    return re.compile(rf"(?<![\w-]){head}{tail}(?![\w-])")


def glossary_entries(language: str) -> list[dict]:
    """Each entry of the translated glossary: its English headword, the translated term, the source tutorial's
    term recorded in the English definition (or None), and the chapters it links to."""
    catalog = messages(language, "glossary")
    entries = []
    for previous, m in zip(catalog, catalog[1:]):
        definition = DEFINITION.match(m.id)
        if not definition:
            continue
        translated = TRANSLATED_TERM.match(m.string) if m.string else None
        entries.append({"headword": previous.id, "term": translated.group("term").strip() if translated else None,
                        "translated": bool(m.string), "source": definition.group("source"),
                        "chapters": sorted(set(CHAPTER_LINK.findall(m.id)))})
    return entries


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_glossary_gives_every_entry_its_translated_term(language):
    entries = glossary_entries(language)
    assert len(entries) >= 60, f"only {len(entries)} glossary entries found: has the glossary's format changed?"
    unnamed = [e["headword"] for e in entries if e["translated"] and not e["term"]]
    assert not unnamed, (f"{language} glossary definitions that do not start with the translated term in bold "
                         f"(`**中文术语** · ...`): {unnamed}")


@pytest.mark.parametrize("language", LANGUAGES)
def test_each_glossary_term_is_the_one_its_chapters_use(language):
    """Wherever the English of a chapter that a glossary entry links to uses the entry's term (outside code,
    math and link targets), the translation of that message uses the glossary's translated term."""
    problems = []
    for entry in glossary_entries(language):
        if not entry["term"]:
            continue  # untranslated: test_every_message_is_translated_and_none_is_fuzzy reports it
        english = [PAREN.sub("", p).strip() for p in _parts(entry["headword"])]
        translated = _parts(entry["term"])
        if len(english) != len(translated):
            english, translated = [PAREN.sub("", entry["headword"]).strip()], [entry["term"]]
        for domain in entry["chapters"]:
            # a message kept as it is (a math block, code, a name) has no term to translate
            for m in (m for m in messages(language, domain) if m.string and m.string != m.id):
                for word, term in zip(english, translated):
                    text = _squash(m.string)
                    if _english_use(word).search(prose(m.id)) and not any(_squash(f) in text for f in _forms(term)):
                        problems.append(f"{domain}: {word!r} is not {' or '.join(_forms(term))!r} in "
                                        f"{m.string[:90]!r}")
    assert not problems, f"{len(problems)} use(s) of a glossary term that differ from the glossary:\n  " + "\n  ".join(
        problems[:20])


@pytest.mark.parametrize("language", LANGUAGES)
def test_no_page_uses_a_competing_form_of_a_glossary_term(language):
    """The English glossary records the source tutorial's word for a term; where the edition uses another (it
    corrects the tutorial: 排列等变, not 排列不变), the tutorial's word appears only quoted, “…”."""
    competing = {e["source"]: e["term"] for e in glossary_entries(language) if e["source"] and e["term"]
                 and _squash(e["source"]) not in _squash(e["term"]) and _squash(e["term"]) not in _squash(e["source"])}
    problems = [f"{domain}: {word!r} (the glossary's term is {term!r}) in {m.string[:90]!r}"
                for lang, domain in CATALOGS if lang == language and domain != "glossary"
                for m in messages(language, domain) if m.string
                for word, term in competing.items() if _squash(word) in _squash(QUOTED.sub("", m.string))]
    assert not problems, "competing forms used unquoted:\n  " + "\n  ".join(problems)


def test_the_consistency_checks_see_a_term_in_english_prose_only():
    assert _english_use("query").search("two queries attend") and _english_use("query").search("Query i")
    assert not _english_use("head").search(prose("a multi-head layer, head_dim and `head`"))
    assert _english_use("KV cache").search("both KV caches") and not _english_use("KV cache").search("kv cache")
    assert not _english_use("mask").search(prose("compare with `attnbook.masks` and $\\text{mask}$"))
    assert _parts("分组查询注意力（GQA）/ 多查询注意力（MQA）") == ["分组查询注意力（GQA）", "多查询注意力（MQA）"]
    assert _forms("分组查询注意力（GQA）") == ["分组查询注意力", "GQA"] and _parts("局部/全局注意力") == ["局部", "全局注意力"]
    assert _squash(QUOTED.sub("", "说成“排列不变”是错的")) == "说成是错的"


# ------------------------------------------------------------------------------------------ the term list
# locales/<language>/terms.yml: one rendering per term, one translation per repeated message, and the source
# tutorial's own words wherever a translation quotes it (the file's header says what each part means).

def term_list(language: str) -> dict:
    path = locales() / language / "terms.yml"
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


TERM_LANGUAGES = [language for language in LANGUAGES if (locales() / language / "terms.yml").is_file()]


def _plain(text: str) -> str:
    """For comparing a quotation with the tutorial: no white space, quotation marks or math delimiters."""
    return re.sub(r"[\s“”‘’\"'「」$]", "", text)


def _quotations(translated: str) -> list[str]:
    """The outermost “…” quotations of a translation (a quotation may hold ‘…’ or a nested “…”)."""
    return re.findall(r"“((?:[^“”]|“[^”]*”)*)”", translated)


def tutorial_quoted(translated: str, quotes: list[str]) -> list[str]:
    """The quotations of ``translated`` that are the source tutorial's words (part of a listed passage)."""
    passages = [_plain(q) for q in quotes]
    return [q for q in _quotations(translated) if _plain(q) and any(_plain(q) in p for p in passages)]


def without_tutorial_quotes(english: str, translated: str, quotes: list[str]) -> tuple[str, str]:
    """Where a translation quotes the tutorial in its own words, the English quotation it renders may hold code or
    math the tutorial wrote as plain text (`$QK^\\top$` for its QK^T): both quotations leave the comparison."""
    cited = tutorial_quoted(translated, quotes)
    if not cited:
        return english, translated
    for q in cited:
        translated = translated.replace(f"“{q}”", " ")
    return re.sub(r'"[^"]*"', " ", english), translated


def term_problems(term: dict, english: str, translated: str) -> list[str]:
    """What ``translated`` does wrong with ``term`` (an entry of terms.yml) where ``english`` uses it."""
    english_prose = prose(english)
    if not re.search(term["en"], english_prose, re.I):
        return []
    text = prose(translated)
    problems = []
    if not any(_squash(zh) in _squash(text) for zh in term["zh"]):
        problems.append(f"uses none of {term['zh']}")
    if not (term.get("unless") and re.search(term["unless"], english_prose, re.I)):
        unquoted = QUOTED.sub(" ", text)
        problems += [f"uses rejected {found.group(0)!r}" for pattern in term.get("not", [])
                     if (found := re.search(pattern, unquoted))]
    return problems


def test_the_term_checks_find_a_wrong_rendering():
    sink = {"en": r"\bsinks?\b", "zh": ["汇点"], "not": ["汇聚"]}
    assert term_problems(sink, "The first token is a sink.", "第一个词元是一个汇点。") == []
    assert term_problems(sink, "The first token is a sink.", "第一个词元是一个注意力汇聚。") == [
        "uses none of ['汇点']", "uses rejected '汇聚'"]
    assert term_problems(sink, "Pool over `sinks`.", "对 `sinks` 做汇聚。") == []  # code is not prose
    assert term_problems(sink, "No sink.", "不是“汇聚”，是汇点。") == []  # a quotation may cite another word
    block = {"en": r"\bblocks?\b", "zh": ["块"], "not": ["分块"], "unless": r"\btiles?\b"}
    assert term_problems(block, "one block", "一个分块") == ["uses rejected '分块'"]
    assert term_problems(block, "a block of tiles", "一块分块") == []
    quotes = ["其核心思想是将QK^T的计算顺序改为(Q * K^T)"]
    english = 'It says "changing the order of $QK^\\top$ to $(Q \\cdot K^\\top)$".'
    assert mismatches(*without_tutorial_quotes(english, "它说“将QK^T的计算顺序改为(Q * K^T)”。", quotes)) == []
    assert mismatches(*without_tutorial_quotes(english, "它说“把 QK^T 换个顺序”。", quotes)) != []
    assert tutorial_quoted("原教程说“某些模式可能让位置 $i$ 关注位置 $i/2$”", ["某些模式可能让位置i关注位置 i/2, i, 2i 等"])


@pytest.mark.parametrize("language", TERM_LANGUAGES)
def test_the_term_list_is_well_formed_and_its_exceptions_are_current(language):
    terms = term_list(language)
    problems = []
    for term in terms["terms"]:
        for pattern in [term["en"], term.get("unless") or "", *term.get("not", [])]:
            re.compile(pattern)
        if not term.get("zh") or not term.get("why"):
            problems.append(f"{term['en']!r}: needs its rendering (zh) and the reason (why)")
        for exception in term.get("except", []):
            found = [m for m in messages(language, exception["catalog"]) if m.id.startswith(exception["english"])]
            if len(found) != 1 or not re.search(term["en"], prose(found[0].id), re.I) or not exception.get("why"):
                problems.append(f"{term['en']!r}: the exception {exception} names no one message that uses the "
                                "term (or gives no reason): remove it")
    assert not problems, "\n  ".join(["locales/" + language + "/terms.yml:", *problems])


@pytest.mark.parametrize("language", TERM_LANGUAGES)
def test_each_term_has_one_rendering(language):
    """For each entry of terms.yml, every message whose English uses the term renders it the chosen way."""
    terms = term_list(language)["terms"]
    problems = []
    for lang, domain in CATALOGS:
        if lang != language:
            continue
        for m in messages(language, domain):
            if not m.string or m.string == m.id:
                continue
            for term in terms:
                if any(e["catalog"] == domain and m.id.startswith(e["english"]) for e in term.get("except", [])):
                    continue
                problems += [f"{domain}: {term['en']!r} {p} in {m.string[:80]!r}"
                             for p in term_problems(term, m.id, m.string)]
    assert not problems, (f"{len(problems)} translation(s) that render a term otherwise than "
                          f"locales/{language}/terms.yml says:\n  " + "\n  ".join(problems[:25]))


@pytest.mark.parametrize("language", TERM_LANGUAGES)
def test_a_repeated_message_has_one_translation(language):
    allowed = {e["english"] for e in term_list(language).get("same_translation_except", [])}
    seen: dict[str, dict[str, list[str]]] = {}
    for lang, domain in CATALOGS:
        if lang == language and domain != "glossary":  # the glossary's headwords stay English
            for m in messages(language, domain):
                if m.string and m.id not in allowed:
                    seen.setdefault(m.id, {}).setdefault(m.string, []).append(domain)
    problems = [f"{english[:70]!r}: " + "; ".join(f"{len(ds)} as {s[:40]!r} ({', '.join(ds)})" for s, ds in t.items())
                for english, t in seen.items() if len(t) > 1]
    assert not problems, "a message translated differently in different catalogs:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("language", TERM_LANGUAGES)
def test_quotations_of_the_source_tutorial_are_its_words(language):
    """Where the English names the source tutorial, a translation's “quotation” of four or more Chinese characters
    is the tutorial's own words (a listed passage of terms.yml), not a translation back from the English."""
    quotes = term_list(language)["tutorial_quotes"]
    problems = [f"{domain}: “{q}” in {m.string[:60]!r}"
                for lang, domain in CATALOGS if lang == language
                for m in messages(language, domain) if m.string and re.search(r"\btutorial\b", m.id, re.I)
                for q in _quotations(m.string)
                if len(re.findall(r"[\u4e00-\u9fff]", q)) >= 4 and q not in tutorial_quoted(m.string, quotes)]
    assert not problems, ("quotations of the source tutorial that are not its words (quote its text, or list the "
                          "passage in terms.yml's tutorial_quotes after checking it):\n  " + "\n  ".join(problems))


@pytest.mark.parametrize("language", TERM_LANGUAGES)
def test_the_listed_tutorial_passages_and_the_glossarys_tutorial_terms_are_in_the_tutorial(language):
    # the workplace keeps the tutorial next to the checkout (../shared/seed/); elsewhere name it
    seeds = sorted((Path(__file__).resolve().parents[2] / "shared" / "seed").glob("*.txt"))
    source = os.environ.get("ATTNBOOK_SOURCE_TUTORIAL") or (str(seeds[0]) if seeds else None)
    if not source or not Path(source).is_file():
        pytest.skip("set ATTNBOOK_SOURCE_TUTORIAL to the source tutorial's text to check terms.yml's tutorial_quotes and "
                    "glossary.md's bold terms against it")
    text = _plain(Path(source).read_text(encoding="utf-8"))
    missing = [q for q in term_list(language)["tutorial_quotes"] if _plain(q) not in text]
    assert not missing, f"tutorial_quotes that the source tutorial does not contain: {missing}"
    # glossary.md says its bold Chinese terms are the tutorial's own words
    not_its_words = [f"{e['headword']}: {e['source']}" for e in glossary_entries(language)
                     if e["source"] and _plain(e["source"]) not in text]
    assert not not_its_words, ("glossary.md's bold Chinese terms that the source tutorial does not use (write — "
                               f"instead): {not_its_words}")


# a product written with the letter: "8x8", "6 x 12 个", "）x 层数"; not a label such as "x1.0" (a printed row)
TIMES = re.compile(r"\d\s?x\s?\d|[\d\u4e00-\u9fff）]\s?x\s[\d\u4e00-\u9fff（]")


@pytest.mark.parametrize(("language", "domain"), CATALOGS, ids=[f"{lang}:{d}" for lang, d in CATALOGS])
def test_multiplication_is_written_with_the_times_sign(language, domain):
    """In translated prose a product of sizes is 8×8, not 8x8 (code and math keep theirs)."""
    problems = [f"{found.group(0)!r} in {m.string[:80]!r}" for m in messages(language, domain)
                if m.string and m.string != m.id and (found := TIMES.search(prose(m.string)))]
    assert not problems, f"{domain}: write × for a product:\n  " + "\n  ".join(problems)


def test_the_times_check_sees_prose_only():
    assert mismatches("8x8 pixels", "8×8 像素") == [] and not TIMES.search(prose("8×8 像素"))
    for wrong in ("8x8 像素", "6 x 12 个头", "2（键和值）x 层数 x 头维度"):
        assert TIMES.search(prose(wrong)), wrong
    for right in ("`x = 2 * 3` 与 $2 x 3$", "softmax（x1.0 情形）", "FlexAttention 的 4 个"):
        assert not TIMES.search(prose(right)), right
