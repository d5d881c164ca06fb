"""Chapter 10's explorer: what each head of a real pretrained model, all-MiniLM-L6-v2, attends to.

Pick a layer, a head and a sentence, and see that head's attention map on
that sentence next to the shares of its weight on the previous token, the
next one, itself, [CLS], [SEP] and punctuation
(:func:`attnbook.pretrained.head_stats`).

Dimension legend: N layers, H heads per layer, T tokens of the sentence
(queries), S tokens (keys; S = T).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from ..pretrained.model import MEASURES, MiniLM, head_stats, tokenize
from .base import Control, Explorer

__all__ = ["minilm_explorer", "EXPLORER_SENTENCES", "CJK_FONTS"]

# fonts that draw Chinese, Japanese and Korean characters, the first one installed is used for tokens that
# matplotlib's default font (DejaVu Sans) has no glyph for; Debian's fonts-wqy-zenhei gives the first
CJK_FONTS = ("WenQuanYi Zen Hei", "Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "Source Han Sans CN",
             "Droid Sans Fallback", "SimHei", "Microsoft YaHei", "PingFang SC", "AR PL UMing CN")

EXPLORER_SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "The cat sat on the mat, and then it fell asleep.",
    "She gave him the book because he asked for it.",
    "Attention lets every word look at every other word.",
]


@functools.cache
def _glyphs(family: str) -> frozenset[int]:
    """The code points an installed font family draws (empty when matplotlib does not find it)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
    return frozenset(FT2Font(path).get_charmap())


@functools.cache
def _installed_cjk_font() -> str | None:
    from matplotlib import font_manager

    names = {f.name for f in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONTS if name in names), None)


def _labels(tokens: Sequence[str]) -> tuple[list[str], list[str] | None, bool]:
    """The tick labels of ``tokens``, the font family list that draws them (None: matplotlib's default) and
    whether a character had to be written as its code point (no installed font has it)."""
    default = _glyphs("DejaVu Sans")
    missing = {ch for t in tokens for ch in t if ord(ch) not in default}
    if not missing:
        return list(tokens), None, False
    cjk = _installed_cjk_font()
    if cjk is not None:
        drawn = _glyphs(cjk) | default
        family: list[str] | None = ["DejaVu Sans", cjk]  # Latin as everywhere else, the rest from the CJK font
    else:
        drawn, family = default, None
    escaped = any(ord(ch) not in drawn for ch in missing)
    labels = ["".join(ch if ord(ch) in drawn else f"U+{ord(ch):04X}" for ch in t) for t in tokens]
    return labels, family, escaped


def minilm_explorer(model: MiniLM, tokenizer: Any, sentences: Sequence[str] | None = None, text: str | None = None,
                    *, static_layers: Sequence[int] | None = None, static_heads: Sequence[int] = (1, 6, 11),
                    static_sentences: int = 2) -> Explorer:
    """Layer (1..N), head (1..H) and sentence -> that head's attention map on that sentence, and the
    shares of its weight on the previous token, the next one, itself, [CLS], [SEP] and punctuation.

    ``sentences``: the choices (default :data:`EXPLORER_SENTENCES`); ``text``: one more sentence of your
    own, put first. Layers and heads are numbered from 1 here. The static scrubber shows
    ``static_layers`` (default all) x ``static_heads`` x the first ``static_sentences`` sentences.
    """
    sentences = list(EXPLORER_SENTENCES if sentences is None else sentences)
    if text is not None:
        sentences = [text] + [s for s in sentences if s != text]
    if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ValueError(f"sentences must be non-empty strings, got {sentences!r}")
    N, H = model.num_layers, model.num_heads
    layers, heads = list(range(1, N + 1)), list(range(1, H + 1))
    cache: dict[str, tuple] = {}

    def run(sentence: str) -> tuple:
        if sentence not in cache:
            enc = tokenize(tokenizer, sentence)
            with torch.no_grad():
                _, att = model(enc.input_ids, enc.attention_mask)
            stats = head_stats(att, enc.tokens, enc.attention_mask)  # {measure: (N, H)}
            cache[sentence] = enc.tokens[0], torch.stack([a[0] for a in att]), stats  # (N, H, T, S)
        return cache[sentence]

    def compute(layer: int, head: int, sentence: str) -> dict:
        tokens, att, stats = run(sentence)
        w = att[layer - 1, head - 1]  # (T, S)
        shares = {m: stats[m][layer - 1, head - 1].item() for m in MEASURES}
        words = [t for t in tokens if t not in ("[CLS]", "[SEP]", "[PAD]")]
        return {"layer": layer, "head": head, "sentence": sentence, "tokens": tokens, "weights": w,
                "scale": float(w.max()), "shares": shares, "top": max(shares, key=lambda m: shares[m]),
                "unknown": sum(t == "[UNK]" for t in words), "words": len(words)}

    def layout(d: dict) -> tuple[str, ...]:
        return tuple(d["tokens"])  # the tick labels depend on the sentence

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        key = layout(d)
        T = len(key)
        # sized by the sentence: 0.18 inches a token (a 10 pt word per row and per column), the map at least 3
        # inches a side; the figure at most 9.6 inches wide (the page) and the map at most 12 tall: past
        # that, a word on every k-th column (or row) only
        words = 0.2 + 0.085 * max(len(t) for t in key)  # inches: the longest token, left of and under the map
        bars_w = 0.1 + 0.085 * max(len(m) for m in MEASURES) + 1.9  # the measures' names and their bars
        bar_gap = 0.95  # the colour bar and its labels, between the map and the bars
        left = words + 0.3  # and the axis label
        map_w = min(max(3.0, 0.18 * T), 9.6 - left - bar_gap - 0.35 - bars_w)
        map_h = min(max(3.0, 0.18 * T), 12.0)
        bottom, top = words + 0.35, 0.45  # inches: the key words and the axis label; the title
        width, height = left + map_w + bar_gap + 0.35 + bars_w, bottom + map_h + top
        fig = Figure(figsize=(width, height), dpi=72)
        ax = fig.add_axes((left / width, bottom / height, map_w / width, map_h / height))
        # each map on its own scale, 0 to its largest weight (stated in the title and the caption): a diffuse
        # head's weights of about 1/T would be one dark square on a fixed 0-1 scale
        image = ax.imshow(torch.zeros(T, T).numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                          aspect="auto")
        cax = fig.add_axes(((left + map_w + 0.12) / width, bottom / height, 0.14 / width, min(map_h, 2.6) / height))
        bar = fig.colorbar(image, cax=cax, ticks=[0, 0.5, 1])
        bar.ax.set_yticklabels(["0", "half", "max"], fontsize=10)
        labels, family, _ = _labels(key)
        for axis, inches in ((ax.xaxis, map_w), (ax.yaxis, map_h)):
            every = max(1, math.ceil(0.18 * T / inches - 1e-9))
            shown = list(range(0, T, every))
            axis.set_ticks(shown, labels=[labels[i] for i in shown], fontsize=10)
            if family is not None:
                for label in axis.get_ticklabels():
                    label.set_fontfamily(family)
        ax.tick_params(axis="x", labelrotation=90)
        ax.set_xlabel("key (attended to)", fontsize=10)
        ax.set_ylabel("query", fontsize=10)
        bar_h = min(map_h, 2.6)
        bx = fig.add_axes(((width - 2.0) / width, (bottom + map_h - bar_h) / height, 1.8 / width, bar_h / height))
        bars = bx.barh(range(len(MEASURES)), [0.0] * len(MEASURES), color="tab:blue")
        bx.set_yticks(range(len(MEASURES)), labels=list(MEASURES), fontsize=10)
        bx.invert_yaxis()
        bx.set_xlim(0, 1)
        bx.set_xlabel("share of weight\n(mean over words)", fontsize=10)
        title = fig.suptitle(" ", fontsize=11, y=1 - 0.08 / height, va="top")
        return fig, {"image": image, "bars": bars, "title": title}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        art["image"].set_data((d["weights"] / max(d["scale"], 1e-12)).numpy())
        for rect, m in zip(art["bars"], MEASURES):
            rect.set_width(d["shares"][m])
        art["title"].set_text(f"layer {d['layer']}, head {d['head']}: colours 0 to {d['scale']:.2f}, "
                              "its largest weight")

    def caption(d: dict) -> str:
        s = d["shares"]
        text = (f"layer {d['layer']}, head {d['head']}: mostly {d['top']} ({s[d['top']]:.0%}); previous "
                f"{s['previous']:.0%}, next {s['next']:.0%}, self {s['self']:.0%}, [CLS] {s['[CLS]']:.0%}, "
                f"[SEP] {s['[SEP]']:.0%}, punctuation {s['punctuation']:.0%} (Unicode punctuation, as BERT's "
                f"tokenizer splits it); the map's colours run from 0 to {d['scale']:.2f}, its largest weight")
        if d["unknown"]:
            text += (f". {d['unknown']} of the {d['words']} tokens are [UNK]: all-MiniLM-L6-v2's WordPiece "
                     "vocabulary (English, uncased) holds few CJK characters, and a word it cannot spell from its "
                     "pieces reaches the model as that one unknown token")
        if _labels(d["tokens"])[2]:
            text += (". No installed font draws some characters, so the labels write them as code points "
                     "(U+XXXX); installing a CJK font (fonts-wqy-zenhei) shows them")
        return text

    return Explorer(
        "MiniLM's heads",
        [
            Control("layer", layers, 1, label="layer", static=list(static_layers or layers)),
            Control("head", heads, static_heads[0] if static_heads else 1, label="head",
                    static=list(static_heads or [1])),
            Control("sentence", sentences, sentences[0], label="sentence", kind="dropdown",
                    static=sentences[:max(1, static_sentences)]),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
    )
