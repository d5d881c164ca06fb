"""The package's shape: the names the chapters use resolve, every submodule is listed in the package
docstring, no module imports another's private names, and the explorer factories follow one naming
pattern; the tests import each name from its home (tests/test_architecture.py defines the homes and checks
the chapters)."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from pathlib import Path

import attnbook
import attnbook.explorers

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attnbook"


def _modules() -> list[str]:
    """Every module and subpackage of attnbook, e.g. ``"attnbook.explorers.base"``."""
    return sorted(m.name for m in pkgutil.walk_packages(attnbook.__path__, "attnbook."))


def _chapter_code() -> str:
    code = []
    for nb in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        code += ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return "\n".join(code)


def _resolve(dotted: str) -> object:
    """``attnbook.a.b.c``: import the longest module prefix, then getattr the rest."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_attnbook_name_the_chapters_use_resolves():
    code = _chapter_code()
    names = set(re.findall(r"\battnbook(?:\.\w+)+", code))
    for module, imported in re.findall(r"from (attnbook(?:\.\w+)*) import \(?([\w\s,]+?)\)?\n", code + "\n"):
        names.update(f"{module}.{n.split(' as ')[0].strip()}" for n in imported.split(",") if n.strip())
    for module, alias in re.findall(r"from attnbook import (\w+) as (\w+)", code):  # `ee.make_inputs`
        names.update(f"attnbook.{module}.{attr}" for attr in re.findall(rf"\b{alias}\.(\w+)", code))
    assert len(names) > 50, sorted(names)  # the scan found the chapters' imports
    unresolved = []
    for name in sorted(names):
        try:
            _resolve(name)
        except (AttributeError, ModuleNotFoundError) as err:
            unresolved.append(f"{name}: {err}")
    assert not unresolved, "\n".join(unresolved)


def test_each_explorer_family_has_a_factory_named_after_it():
    machinery = {"base", "live"}  # what every explorer shares; the rendered book's live layer
    families = sorted(m.name for m in pkgutil.iter_modules(attnbook.explorers.__path__) if m.name not in machinery)
    assert families == sorted(attnbook.explorers.FACTORIES.values())
    for family in families:
        module = importlib.import_module(f"attnbook.explorers.{family}")
        factory = getattr(module, f"{family}_explorer")
        assert callable(factory) and factory.__name__ == f"{family}_explorer"
        assert getattr(attnbook.explorers, f"{family}_explorer") is factory  # from attnbook.explorers import ...
        assert factory.__name__ in module.__all__


def test_package_docstring_lists_every_submodule():
    doc = attnbook.__doc__ or ""
    missing = []
    for name in _modules():
        short = name.removeprefix("attnbook.")
        if f"``{short}``" not in doc and f"``{short.rsplit('.', 1)[-1]}``" not in doc:
            missing.append(short)
    assert not missing, f"attnbook's docstring does not list {missing}"


def test_every_module_says_what_it_is_for():
    for name in _modules():
        module = importlib.import_module(name)
        assert module.__doc__ and len(module.__doc__.strip()) > 40, f"{name} has no docstring"


def _private_imports(path: Path) -> list[str]:
    """``from .x import _name`` (or ``from ..x``) in a module of the package: another module's private name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("attnbook")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}: from {'.' * node.level}{node.module or ''} import {alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _private_imports(path)]
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")}
    for path in sorted((ROOT / "bench").glob("*.py")):  # the benchmark scripts use each other's public names only
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                   if a.name in scripts}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_")):
                found.append(f"{path.relative_to(ROOT)}: {node.value.id}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in scripts:
                found += [f"{path.relative_to(ROOT)}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_")]
    assert not found, "\n".join(found)


def test_the_scrubber_template_ships_with_the_package():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"attnbook.explorers" = ["scrubber.html", "scrubber.js"]' in text
    for name in ("scrubber.html", "scrubber.js"):
        assert (PACKAGE / "explorers" / name).is_file()


def test_the_tests_import_each_name_from_its_home():
    """DEVELOPERS.md: chapters, tests and bench import each public name from its home. (Tests of the private
    modules, ``attnbook._checks`` and ``attnbook._compat``, reach their private names directly.)"""
    from tests.test_architecture import chapter_uses, homes

    wrong = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for module, name in chapter_uses(path.read_text(encoding="utf-8")):
            home = homes().get(name)
            if home is not None and home != module:
                wrong.append(f"{path.relative_to(ROOT)}: {module}.{name} -> import it from its home, {home}")
    assert not wrong, "\n".join(sorted(set(wrong)))
