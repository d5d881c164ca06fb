"""Attention on images: patches, a small Vision Transformer, attention rollout, and a decoder that
spells a digit's name while it looks at the image.

Dimension legend:
    B  batch size
    H  number of heads
    Ih, Iw  image height and width in pixels (grey-scale images, one channel)
    p  patch side in pixels (``patch``)
    Th, Tw  rows and columns of the patch grid (Ih // p, Iw // p)
    T  number of tokens an encoder reads: Th * Tw patches, plus one with the [CLS] token
    L  length of a spelled name, EOS included (letters a decoder writes)
    E  model dimension (``d_model``); F  feed-forward width
    C  number of classes (10 digits)
    V  vocabulary size (letters and the special tokens)
    N  number of layers

The pieces, each built from attnbook's own modules (:class:`attnbook.layers.TransformerEncoder` and
``TransformerDecoder``, pre-LN):

* :func:`patchify` cuts images ``(B, Ih, Iw)`` into a sequence of flattened patches ``(B, Th*Tw, p*p)``, row
  by row (raster order); :func:`patch_grid` puts one value per patch back on the grid ``(B, Th, Tw)``.
* :class:`VisionTransformer`: linear patch embedding, a learned [CLS] token, learned 2-D position embeddings
  (a row vector plus a column vector per patch), a pre-LN encoder and a linear head on the [CLS] output.
* :class:`MLPClassifier`: the baseline, a perceptron with two hidden layers on the raw pixels;
  :func:`mlp_hidden_for` picks its width so it has (about) as many parameters as a given model.
* :class:`CNNClassifier`: the other baseline, a small convolutional network, which assumes what a ViT has to
  learn (nearby pixels belong together); :func:`cnn_hidden_for` matches its parameter count the same way.
* :func:`attention_rollout` (Abnar & Zuidema, 2020): the attention of every layer, averaged over heads, mixed
  with the identity for the residual stream, and multiplied through the layers.
* :class:`DigitSpeller`: a ViT-style encoder over the patches and a causal decoder whose cross-attention
  queries are letters and whose keys and values are the image patches; it writes ``"seven"`` for a 7.
  :func:`letter_accuracy` scores it one letter at a time with the right letters given (teacher forcing),
  reading the image itself or another one.
* Data: :func:`load_digits_split` (scikit-learn's 8x8 digits, shipped inside the package: no download),
  :func:`fit_images` (AdamW on shuffled mini-batches, the same for every model here) and :func:`accuracy`.
* Drawing a digit (the ViT explorer's pad): :func:`paint` inks a pixel with a soft :data:`BRUSH`, so a
  drawing has the blurred strokes of the 8x8 digits; :func:`hand_drawn_digits` draws :data:`HAND_DRAWN`,
  a few digits clicked on the grid by hand, for testing a model on drawings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_int, check_module_inputs, check_prob, shape_str
from .layers import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer
from .masks import causal_mask
from .tasks.data import Vocab

__all__ = [
    "patchify",
    "patch_grid",
    "load_digits_split",
    "PatchEmbedding",
    "VisionTransformer",
    "MLPClassifier",
    "mlp_hidden_for",
    "CNNClassifier",
    "cnn_hidden_for",
    "n_params",
    "attention_rollout",
    "cls_attention",
    "DIGIT_NAMES",
    "SPELLING_VOCAB",
    "spell",
    "DigitSpeller",
    "letter_accuracy",
    "random_shift",
    "fit_images",
    "accuracy",
    "BRUSH",
    "paint",
    "paint_line",
    "line_pixels",
    "HAND_DRAWN",
    "hand_drawn_digits",
]


# ----------------------------------------------------------------------------- patches


def _check_images(images: object) -> torch.Tensor:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor (B, Ih, Iw), got {type(images).__name__}")
    if not images.is_floating_point():
        raise TypeError(f"images must be a floating-point tensor (B, Ih, Iw), got {images.dtype}")
    if images.dim() != 3:
        raise ValueError(f"images must be 3-D (B, Ih, Iw) grey-scale, got shape {shape_str(images)}")
    return images


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """Cut images ``(B, Ih, Iw)`` into non-overlapping ``patch x patch`` squares, each flattened row by row:
    ``(B, T, patch * patch)`` with ``T = (Ih // patch) * (Iw // patch)`` patches in raster order (the first
    row of patches left to right, then the next row). ``Ih`` and ``Iw`` must be multiples of ``patch``.

    The image becomes a *sequence*: from here on a Vision Transformer treats patch t as token t.
    """
    _check_images(images)
    p = check_int("patch", patch)
    B, Ih, Iw = images.shape
    if Ih % p or Iw % p:
        raise ValueError(f"images {shape_str(images)}: height {Ih} and width {Iw} must be multiples of patch={p}")
    Th, Tw = Ih // p, Iw // p
    x = images.reshape(B, Th, p, Tw, p)  # (B, Th, p, Tw, p)
    x = x.permute(0, 1, 3, 2, 4)  # (B, Th, Tw, p, p)
    return x.reshape(B, Th * Tw, p * p)  # (B, T, p*p)


def patch_grid(values: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """One value per patch, ``(B, Th * Tw)`` in :func:`patchify`'s raster order, back on the patch grid:
    ``(B, Th, Tw)``. ``grid`` is ``(Th, Tw)``. For drawing a per-patch quantity (attention from [CLS], say)
    over the image: ``patch_grid(w, (4, 4)).repeat_interleave(2, 1).repeat_interleave(2, 2)`` is per pixel."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor (B, Th*Tw), got {type(values).__name__}")
    Th, Tw = (check_int("grid[0]", grid[0]), check_int("grid[1]", grid[1]))
    if values.dim() != 2 or values.shape[1] != Th * Tw:
        raise ValueError(f"values must be (B, Th*Tw) = (B, {Th * Tw}) for grid {(Th, Tw)}, got {shape_str(values)}")
    return values.reshape(values.shape[0], Th, Tw)  # (B, Th, Tw)


# ----------------------------------------------------------------------------- data


def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """scikit-learn's handwritten digits (1,797 grey-scale images of 8x8 pixels, values 0..16, shipped inside
    scikit-learn: no download), scaled to [0, 1] and split at random (generator seeded with ``seed``) into a
    training set and a held-out test set of ``round(test_fraction * 1797)`` images.

    Returns ``x_train (B, 8, 8)``, ``y_train (B,)``, ``x_test``, ``y_test`` (float32 images, int64 labels).
    Needs scikit-learn (``pip install scikit-learn``, or the ``vision`` extra of attnbook)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("load_digits_split needs scikit-learn: pip install scikit-learn") from e
    p = check_prob("test_fraction", test_fraction)
    if p == 0.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    check_int("seed", seed, 0)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # (1797, 8, 8) in [0, 1]
    labels = torch.tensor(digits.target, dtype=torch.long)  # (1797,)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = round(p * len(labels))
    test, train = order[:n_test], order[n_test:]
    return images[train], labels[train], images[test], labels[test]


# ----------------------------------------------------------------------------- models


def _pre_ln_encoder(d_model: int, num_heads: int, num_layers: int, dim_feedforward: int,
                    dropout: float) -> TransformerEncoder:
    layer = TransformerEncoderLayer(d_model, num_heads, dim_feedforward, dropout, "gelu", norm_first=True)
    return TransformerEncoder(layer, num_layers, nn.LayerNorm(d_model))


class PatchEmbedding(nn.Module):
    """Images ``(B, Ih, Iw)`` -> patch tokens ``(B, Th*Tw, E)``: :func:`patchify`, a linear map of each
    flattened patch, plus (``positions=True``) a learned 2-D position embedding, the sum of a row vector and
    a column vector (``row[r] + col[c]`` for the patch in grid row r, column c), initialised N(0, 0.02^2)."""

    def __init__(self, image_size: int, patch: int, d_model: int, positions: bool = True):
        super().__init__()
        self.image_size = check_int("image_size", image_size)
        self.patch = check_int("patch", patch)
        check_int("d_model", d_model)
        if image_size % patch:
            raise ValueError(f"image_size={image_size} must be a multiple of patch={patch}")
        self.grid = (image_size // patch, image_size // patch)
        self.proj = nn.Linear(patch * patch, d_model)  # p*p -> E
        self.positions = bool(positions)
        self.row = nn.Parameter(torch.randn(self.grid[0], d_model) * 0.02)  # (Th, E)
        self.col = nn.Parameter(torch.randn(self.grid[1], d_model) * 0.02)  # (Tw, E)

    def extra_repr(self) -> str:
        return f"grid={self.grid}, patch={self.patch}, positions={self.positions}"

    def position_table(self) -> torch.Tensor:
        """The position vector of every patch, ``(Th*Tw, E)`` in raster order."""
        Th, Tw = self.grid
        return (self.row[:, None, :] + self.col[None, :, :]).reshape(Th * Tw, -1)  # (T, E)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_images(images)
        check_module_inputs(self, images=images)
        if tuple(images.shape[1:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"images must be (B, {self.image_size}, {self.image_size}), got {shape_str(images)}")
        x = self.proj(patchify(images, self.patch))  # (B, T, E)
        return x + self.position_table()[None] if self.positions else x  # (B, T, E)


class VisionTransformer(nn.Module):
    """A small Vision Transformer (Dosovitskiy et al., 2021) for grey-scale images.

    Patch embedding (:class:`PatchEmbedding`: linear map of each ``patch x patch`` square plus learned 2-D
    positions, or none with ``positions=False``), a learned [CLS] token put in front, a pre-LN encoder of
    ``num_layers`` :class:`attnbook.layers.TransformerEncoderLayer` (GELU) with a final LayerNorm, and a
    linear head on the [CLS] output.

    ``forward(images (B, Ih, Iw), *, need_weights=False)`` returns logits ``(B, C)``, or
    ``(logits, [weights (B, H, T, T) per layer])`` with ``T = 1 + Th*Tw`` (token 0 is [CLS]).
    ``loss(images, labels)`` is the cross-entropy.
    """

    def __init__(self, image_size: int = 8, patch: int = 2, num_classes: int = 10, d_model: int = 32,
                 num_heads: int = 4, num_layers: int = 2, dim_feedforward: int | None = None,
                 dropout: float = 0.0, positions: bool = True):
        super().__init__()
        check_int("num_classes", num_classes)
        dim_feedforward = 2 * d_model if dim_feedforward is None else check_int("dim_feedforward", dim_feedforward)
        self.num_heads = check_int("num_heads", num_heads)
        self.embed = PatchEmbedding(image_size, patch, d_model, positions)
        self.cls = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)  # (1, 1, E)
        self.encoder = _pre_ln_encoder(d_model, num_heads, num_layers, dim_feedforward, dropout)
        self.head = nn.Linear(d_model, num_classes)  # E -> C

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid ``(Th, Tw)``."""
        return self.embed.grid

    def forward(self, images: torch.Tensor, *, need_weights: bool = False) -> Any:
        check_module_inputs(self, images=_check_images(images))
        x = self.embed(images)  # (B, Th*Tw, E)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)  # (B, T, E), [CLS] first
        if need_weights:
            h, weights = self.encoder(x, need_weights=True)  # (B, T, E), N x (B, H, T, T)
            return self.head(h[:, 0]), weights  # (B, C)
        return self.head(self.encoder(x)[:, 0])  # (B, C)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(images), labels)


class MLPClassifier(nn.Module):
    """The baseline: flattened pixels ``(B, Ih*Iw)`` -> ``hidden`` GELU units -> ``hidden`` GELU units ->
    classes. ``forward(images (B, Ih, Iw))`` returns logits ``(B, C)``; ``loss`` as the ViT's."""

    def __init__(self, image_size: int = 8, hidden: int = 64, num_classes: int = 10):
        super().__init__()
        n = check_int("image_size", image_size) ** 2
        check_int("hidden", hidden)
        self.net = nn.Sequential(nn.Linear(n, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, check_int("num_classes", num_classes)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_images(images)
        check_module_inputs(self, images=images)
        return self.net(images.flatten(1))  # (B, C)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(images), labels)


class CNNClassifier(nn.Module):
    """The convolutional baseline: what a ViT has to learn from data (nearby pixels belong together, and a
    stroke means the same wherever it is) built into the layers. Two 3x3 convolutions with ReLU
    (``channels``, then ``2 * channels`` feature maps, the image's size kept by zero padding), each followed by
    2x2 max pooling, then ``hidden`` ReLU units and a linear map to the classes.

    ``forward(images (B, Ih, Iw))`` returns logits ``(B, C)``; ``loss`` as the ViT's. ``image_size`` must be a
    multiple of 4 (two poolings). :func:`cnn_hidden_for` picks ``hidden`` for a parameter budget."""

    def __init__(self, image_size: int = 8, channels: int = 16, hidden: int = 64, num_classes: int = 10):
        super().__init__()
        self.image_size = check_int("image_size", image_size)
        if image_size % 4:
            raise ValueError(f"image_size={image_size} must be a multiple of 4 (two 2x2 poolings)")
        c = check_int("channels", channels)
        check_int("hidden", hidden)
        self.features = nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # (B, channels, Ih/2, Iw/2)
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # (B, 2*channels, Ih/4, Iw/4)
        )
        self.head = nn.Sequential(nn.Linear(2 * c * (image_size // 4) ** 2, hidden), nn.ReLU(),
                                  nn.Linear(hidden, check_int("num_classes", num_classes)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_images(images)
        check_module_inputs(self, images=images)
        if tuple(images.shape[1:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"images must be (B, {self.image_size}, {self.image_size}), got {shape_str(images)}")
        x = self.features(images[:, None])  # (B, 1, Ih, Iw) -> (B, 2*channels, Ih/4, Iw/4)
        out: torch.Tensor = self.head(x.flatten(1))  # (B, C)
        return out

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(images), labels)


def n_params(model: nn.Module) -> int:
    """The number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def mlp_hidden_for(target: int, image_size: int = 8, num_classes: int = 10) -> int:
    """The hidden width of :class:`MLPClassifier` whose parameter count is closest to ``target``."""
    check_int("target", target)
    n = image_size * image_size

    def count(h: int) -> int:
        return (n + 1) * h + (h + 1) * h + (h + 1) * num_classes

    return min(range(1, 4096), key=lambda h: abs(count(h) - target))


def cnn_hidden_for(target: int, image_size: int = 8, channels: int = 16, num_classes: int = 10) -> int:
    """The ``hidden`` width of :class:`CNNClassifier` (with these ``channels``) whose parameter count is
    closest to ``target``."""
    check_int("target", target)
    check_int("channels", channels)
    convs = (9 + 1) * channels + (9 * channels + 1) * 2 * channels  # two 3x3 convolutions with biases
    flat = 2 * channels * (image_size // 4) ** 2  # features after two 2x2 poolings

    def count(h: int) -> int:
        return convs + (flat + 1) * h + (h + 1) * num_classes

    return min(range(1, 4096), key=lambda h: abs(count(h) - target))


# ----------------------------------------------------------------------------- rollout


def attention_rollout(weights: list[torch.Tensor] | tuple[torch.Tensor, ...], residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020): how much each output token draws on each *input* token
    through all the layers, not just the last.

    Each layer's weights ``(B, H, T, T)`` are averaged over heads, mixed with the identity for the residual
    connection (``A = residual * I + (1 - residual) * mean_h W``, rows renormalised to sum to 1), and the
    layers are multiplied from the first: ``R = A_N ... A_2 A_1``. Returns ``R (B, T, T)``; row 0 is what
    [CLS] draws on. ``residual=0`` with one layer gives the head-averaged weights themselves.
    """
    if not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError("weights must be a non-empty list of (B, H, T, T) tensors, one per layer")
    first = weights[0]
    if not 0.0 <= residual < 1.0:
        raise ValueError(f"residual must be in [0, 1), got {residual!r}")
    rollout: torch.Tensor | None = None
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"weights[{i}] must be a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 4 or w.shape[-1] != w.shape[-2] or w.shape != first.shape:
            raise ValueError(f"weights[{i}] must be (B, H, T, T) like weights[0] {shape_str(first)}, got {shape_str(w)}")
        T = w.shape[-1]
        eye = torch.eye(T, dtype=w.dtype, device=w.device)  # (T, T)
        a = residual * eye + (1.0 - residual) * w.mean(dim=1)  # (B, T, T)
        a = a / a.sum(dim=-1, keepdim=True)  # rows sum to 1
        rollout = a if rollout is None else torch.matmul(a, rollout)  # (B, T, T)
    assert rollout is not None
    return rollout


def cls_attention(weights: list[torch.Tensor], layer: int, head: str | int, view: str,
                  grid: tuple[int, int]) -> torch.Tensor:
    """The [CLS] row of one layer's attention over the patches, ``(Th, Tw)``, for image 0 of the batch:
    ``view="raw"`` takes layer ``layer``'s head ``head`` (an int, or ``"mean"`` over heads);
    ``view="rollout"`` takes :func:`attnbook.vision.attention_rollout` through layers 0..``layer``
    (rollout mixes the heads, so ``head`` is ignored). The weight [CLS] gives itself is left out, so the
    patches' weights sum to at most 1."""
    if view == "rollout":
        row = attention_rollout(weights[: layer + 1])[0, 0, 1:]  # (Th*Tw,)
    elif view == "raw":
        w = weights[layer][0]  # (H, T, T)
        row = (w.mean(dim=0) if head == "mean" else w[int(head)])[0, 1:]  # (Th*Tw,)
    else:
        raise ValueError(f"view must be 'raw' or 'rollout', got {view!r}")
    return patch_grid(row[None], grid)[0]  # (Th, Tw)


# ----------------------------------------------------------------------------- spelling the digit


DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPELLING_VOCAB = Vocab(sorted(set("".join(DIGIT_NAMES))))
"""Special tokens (``<pad> <bos> <eos> <sep>``) and the 15 letters of the ten names."""

_NAME_LEN = max(len(n) for n in DIGIT_NAMES) + 1  # 6: "three", "seven", "eight" and EOS


def spell(labels: torch.Tensor) -> torch.Tensor:
    """Digit labels ``(B,)`` -> their names as letter ids ``(B, L)``, each ending with EOS and padded with
    PAD to ``L = 6`` (the longest names have five letters)."""
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.long or labels.dim() != 1:
        raise TypeError(f"labels must be a 1-D LongTensor of digits, got {labels!r:.60}")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) > 9):
        raise ValueError(f"labels must be digits 0..9, got min {int(labels.min())}, max {int(labels.max())}")
    v = SPELLING_VOCAB
    table = torch.full((10, _NAME_LEN), v.pad_id, dtype=torch.long)  # (10, L)
    for d, name in enumerate(DIGIT_NAMES):
        table[d, : len(name)] = v.encode(name)
        table[d, len(name)] = v.eos_id
    return table[labels]  # (B, L)


class DigitSpeller(nn.Module):
    """Writes a digit's English name letter by letter while looking at the image.

    Encoder: :class:`PatchEmbedding` (2-D positions) and a pre-LN encoder over the patches (no [CLS]).
    Decoder: letter embeddings plus learned positions, ``num_decoder_layers`` pre-LN
    :class:`attnbook.layers.TransformerDecoderLayer`: causal self-attention over the letters written so far,
    then **cross-attention whose queries are the letters and whose keys and values are the image patches**.

    ``forward(images (B, Ih, Iw), tgt_in (B, L), *, need_weights=False)`` returns logits ``(B, L, V)`` for
    the letter after each input position, or ``(logits, cross [ (B, H, L, Th*Tw) per decoder layer])``.
    ``loss(images, labels)`` is the cross-entropy of the names (teacher forcing, PAD ignored);
    ``generate(images)`` writes greedily and returns ``(letter ids (B, L), cross weights)`` with the weights of
    each written letter's query (PAD after EOS); ``SPELLING_VOCAB.decode(ids)`` gives the words.
    """

    def __init__(self, image_size: int = 8, patch: int = 2, d_model: int = 32, num_heads: int = 4,
                 num_encoder_layers: int = 1, num_decoder_layers: int = 1, dim_feedforward: int | None = None,
                 dropout: float = 0.0):
        super().__init__()
        dim_feedforward = 2 * d_model if dim_feedforward is None else check_int("dim_feedforward", dim_feedforward)
        V = len(SPELLING_VOCAB)
        self.max_len = _NAME_LEN
        self.embed = PatchEmbedding(image_size, patch, d_model)
        self.encoder = _pre_ln_encoder(d_model, num_heads, num_encoder_layers, dim_feedforward, dropout)
        self.letters = nn.Embedding(V, d_model)
        self.letter_pos = nn.Parameter(torch.randn(_NAME_LEN, d_model) * 0.02)  # (L, E)
        layer = TransformerDecoderLayer(d_model, num_heads, dim_feedforward, dropout, "gelu", norm_first=True)
        self.decoder = TransformerDecoder(layer, num_decoder_layers, nn.LayerNorm(d_model))
        self.head = nn.Linear(d_model, V)  # E -> V

    @property
    def grid(self) -> tuple[int, int]:
        return self.embed.grid

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``(B, Ih, Iw)`` -> patch memory ``(B, Th*Tw, E)``."""
        check_module_inputs(self, images=_check_images(images))
        memory: torch.Tensor = self.encoder(self.embed(images))
        return memory

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, *, need_weights: bool = False) -> Any:
        L = tgt_in.shape[1]
        if L > self.max_len:
            raise ValueError(f"tgt_in {shape_str(tgt_in)} is longer than max_len={self.max_len}")
        x = self.letters(tgt_in) + self.letter_pos[:L]  # (B, L, E)
        mask = causal_mask(L, device=tgt_in.device)  # (L, L)
        if need_weights:
            h, _, cross = self.decoder(x, memory, mask, need_weights=True)  # (B, L, E), N x (B, H, L, Th*Tw)
            return self.head(h), cross  # (B, L, V)
        return self.head(self.decoder(x, memory, mask))  # (B, L, V)

    def forward(self, images: torch.Tensor, tgt_in: torch.Tensor, *, need_weights: bool = False) -> Any:
        return self.decode(tgt_in, self.encode(images), need_weights=need_weights)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        tgt = spell(labels)  # (B, L)
        logits = self(images, SPELLING_VOCAB.shift_right(tgt))  # (B, L, V)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=SPELLING_VOCAB.pad_id)

    @torch.no_grad()
    def generate(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy spelling: letter ids ``(B, L)`` (PAD after the first EOS) and the last decoder layer's
        cross-attention of each written letter's query, ``(B, H, L, Th*Tw)``."""
        v = SPELLING_VOCAB
        memory = self.encode(images)  # (B, Th*Tw, E)
        ids = torch.full((images.shape[0], 1), v.bos_id, dtype=torch.long, device=images.device)  # (B, 1)
        cross = None
        for _ in range(self.max_len):
            logits, cross_layers = self.decode(ids, memory, need_weights=True)  # (B, l, V)
            ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)  # (B, l+1)
            cross = cross_layers[-1]  # (B, H, l, Th*Tw)
        assert cross is not None
        return v.stop_after_eos(ids[:, 1:]), cross  # (B, L)


@torch.no_grad()
def letter_accuracy(model: DigitSpeller, images: torch.Tensor, labels: torch.Tensor, *,
                    read: torch.Tensor | None = None) -> torch.Tensor:
    """How often ``model`` predicts each letter of the names right when it is given the right letters before
    it (teacher forcing), reading the patches of ``read`` (default: ``images`` themselves; pass other images,
    one per name, to see which letters come from the image and which from the letters already written).

    Returns ``(L,)``: for each position t, the share of the names with a letter (or EOS) at t whose token
    at t is the argmax of the logits. Positions past a name's EOS are not counted; a position that no name
    of the batch reaches is NaN."""
    if not isinstance(model, DigitSpeller):
        raise TypeError(f"model must be a DigitSpeller, got {type(model).__name__}")
    read = images if read is None else _check_images(read)
    if read.shape != images.shape:
        raise ValueError(f"read {shape_str(read)} must have the shape of images {shape_str(images)}")
    model.eval()
    v = SPELLING_VOCAB
    tgt = spell(labels)  # (B, L)
    logits = model.decode(v.shift_right(tgt), model.encode(read))  # (B, L, V)
    counted = tgt != v.pad_id  # (B, L)
    right = (logits.argmax(dim=-1) == tgt) & counted  # (B, L)
    return right.sum(dim=0) / counted.sum(dim=0)  # (L,)


# ----------------------------------------------------------------------------- training


def random_shift(images: torch.Tensor, shift: int, generator: torch.Generator) -> torch.Tensor:
    """Each image ``(B, Ih, Iw)`` moved by its own random whole-pixel offset in ``[-shift, shift]`` along
    each axis, the uncovered border filled with 0 (data augmentation: a digit moved by a pixel is the same
    digit)."""
    _check_images(images)
    s = check_int("shift", shift, 0)
    if s == 0:
        return images
    B, Ih, Iw = images.shape
    padded = F.pad(images, (s, s, s, s))  # (B, Ih+2s, Iw+2s)
    dy, dx = torch.randint(0, 2 * s + 1, (2, B), generator=generator)  # (B,) each
    rows = dy[:, None] + torch.arange(Ih)  # (B, Ih)
    cols = dx[:, None] + torch.arange(Iw)  # (B, Iw)
    return padded[torch.arange(B)[:, None, None], rows[:, :, None], cols[:, None, :]]  # (B, Ih, Iw)


def fit_images(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 30, batch_size: int = 64,
        lr: float = 3e-3, weight_decay: float = 0.0, shift: int = 0, seed: int = 0) -> list[float]:
    """Train ``model`` (anything with ``loss(x_batch, y_batch)``) on a fixed set of images for a number of
    epochs (unlike :func:`attnbook.train.fit`, which draws fresh batches of a toy task for a number of steps
    and evaluates as it goes), with AdamW on shuffled mini-batches of
    ``(x, y)`` for ``epochs`` passes, the learning rate decaying linearly to 0; with ``shift > 0`` each
    training image is moved by a random offset of up to ``shift`` pixels (:func:`random_shift`) every time
    it is drawn. One generator seeded with ``seed`` draws the order and the shifts (the same batches for
    every model). Returns the mean loss of each epoch."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = getattr(model, "loss", None)
    if not callable(loss_fn):
        raise TypeError(f"model must have a loss(x, y) method, got {type(model).__name__}")
    check_int("epochs", epochs)
    check_int("batch_size", batch_size)
    if len(x) != len(y):
        raise ValueError(f"x {shape_str(x)} and y {shape_str(y)} must have the same length")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / steps)
    model.train()
    history = []
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        total = 0.0
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            loss = loss_fn(random_shift(x[idx], shift, g) if shift else x[idx], y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        history.append(total / len(x))
    model.eval()
    return history


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Share of ``x`` classified as ``y`` (argmax of the logits); for a :class:`DigitSpeller`, share of the
    names spelled exactly right (every letter and the EOS)."""
    model.eval()
    if isinstance(model, DigitSpeller):
        ids, _ = model.generate(x)
        return (ids == spell(y)).all(dim=1).float().mean().item()
    return (model(x).argmax(dim=-1) == y).float().mean().item()


# ----------------------------------------------------------------------------- drawing a digit
# What the ViT explorer's drawing pad computes (attnbook.explorers.vit holds the pad itself).

BRUSH = torch.tensor([[0.0, 0.5, 0.0],
                      [0.5, 1.0, 0.5],
                      [0.0, 0.5, 0.0]])
"""The drawing pad's soft brush: a click inks its pixel fully and the four pixels beside it half. The 8x8
digits were made by counting the ink of 4x4 squares of a finer drawing, so their strokes are about two
pixels wide and grey at the edges; a brush one pixel wide would draw strokes thinner and harder than any
the model learned from. The stored drawings :data:`HAND_DRAWN` pick this brush over none: the chapter's
ViT classifies more of them (the explorer's tests measure both)."""


def paint(image: torch.Tensor, row: int, col: int, *, erase: bool = False,
          brush: torch.Tensor = BRUSH) -> torch.Tensor:
    """One click of the drawing pad on ``image`` ``(Ih, Iw)`` (values in [0, 1]) at pixel ``(row, col)``:
    a new image where each pixel is at least the ``brush`` centred there (the pen: a stroke of clicks stays
    one shade, never darker than 1), or, with ``erase``, the brush taken off, down to 0 (the eraser: the
    pixel cleared and its neighbours lightened, so that it undoes a pen click on an empty spot).
    ``brush`` is any ``(k, k)`` kernel with odd ``k`` (default :data:`BRUSH`)."""
    if not isinstance(image, torch.Tensor) or image.dim() != 2 or not image.is_floating_point():
        raise TypeError(f"image must be a 2-D floating-point tensor (Ih, Iw), got {image!r:.60}")
    Ih, Iw = image.shape
    check_int("row", row, 0, Ih - 1)
    check_int("col", col, 0, Iw - 1)
    k = brush.shape[0]
    if brush.dim() != 2 or brush.shape[1] != k or k % 2 == 0:
        raise ValueError(f"brush must be a square kernel of odd side (k, k), got {shape_str(brush)}")
    r = k // 2
    stamp = torch.zeros(Ih + 2 * r, Iw + 2 * r, dtype=image.dtype)  # (Ih + 2r, Iw + 2r): room at the borders
    stamp[row : row + k, col : col + k] = brush.to(image.dtype)
    stamp = stamp[r : r + Ih, r : r + Iw]  # (Ih, Iw), the brush centred on (row, col)
    return (image - stamp).clamp_min(0.0) if erase else torch.maximum(image, stamp)


def line_pixels(start: tuple[int, int], end: tuple[int, int]) -> list[tuple[int, int]]:
    """The pixels ``(row, col)`` of a straight stroke from ``start`` to ``end``, both included: one per step
    along the longer of the two directions, the other coordinate rounded (a digital line, as Bresenham's)."""
    (r0, c0), (r1, c1) = start, end
    steps = max(abs(r1 - r0), abs(c1 - c0))
    if steps == 0:
        return [(r0, c0)]
    return [(round(r0 + (r1 - r0) * i / steps), round(c0 + (c1 - c0) * i / steps)) for i in range(steps + 1)]


def paint_line(image: torch.Tensor, start: tuple[int, int], end: tuple[int, int], *, erase: bool = False,
               brush: torch.Tensor = BRUSH) -> torch.Tensor:
    """:func:`paint` at every pixel of the straight stroke from ``start`` to ``end`` (:func:`line_pixels`):
    what dragging the pen across the pad would draw, in two clicks."""
    for row, col in line_pixels(start, end):
        image = paint(image, row, col, erase=erase, brush=brush)
    return image


HAND_DRAWN: tuple[tuple[int, str], ...] = (
    (0, "..####.. .#....#. .#....#. .#....#. .#....#. .#....#. .#....#. ..####.."),
    (0, "...##... ..#..#.. .#....#. .#....#. .#....#. .#....#. ..#..#.. ...##..."),
    (0, "..###... .#...#.. .#...#.. #.....#. #.....#. .#...#.. .#...#.. ..###..."),
    (1, "....#... ...##... ....#... ....#... ....#... ....#... ....#... ....#..."),
    (1, "...#.... ..##.... ...#.... ...#.... ...#.... ...#.... ...#.... ..###..."),
    (1, ".....#.. ....##.. ...#.#.. .....#.. .....#.. .....#.. .....#.. .....#.."),
    (2, "..###... .#...#.. .....#.. ....#... ...#.... ..#..... .#...... .#####.."),
    (2, ".####... .....#.. .....#.. ....#... ...#.... ..#..... .#...... .######."),
    (2, "...##... ..#..#.. .....#.. .....#.. ....#... ...#.... ..#..... ..#####."),
    (3, ".####... .....#.. .....#.. ..###... .....#.. .....#.. .....#.. .####..."),
    (3, "..###... .#...#.. .....#.. ...##... .....#.. .....#.. .#...#.. ..###..."),
    (3, ".#####.. .....#.. ....#... ...##... .....#.. .....#.. .....#.. .####..."),
    (4, "....#... ...##... ..#.#... .#..#... .#####.. ....#... ....#... ....#..."),
    (4, ".#...#.. .#...#.. .#...#.. .######. .....#.. .....#.. .....#.. .....#.."),
    (4, "...#.... ..#..... .#..#... .#..#... .#####.. ....#... ....#... ....#..."),
    (5, ".#####.. .#...... .#...... .####... .....#.. .....#.. .....#.. .####..."),
    (5, "..####.. ..#..... .#...... .###.... ....#... .....#.. ....#... .###...."),
    (5, ".######. .#...... .#...... .#####.. ......#. ......#. .#...#.. ..###..."),
    (6, "....#... ...#.... ..#..... .#...... .####... .#...#.. .#...#.. ..###..."),
    (6, "...##... ..#..... .#...... .#...... .####... .#...#.. .#...#.. ..###..."),
    (6, ".....#.. ....#... ...#.... ..#..... ..####.. ..#...#. ..#...#. ...###.."),
    (7, ".######. ......#. .....#.. ....#... ....#... ...#.... ...#.... ...#...."),
    (7, ".#####.. .....#.. .....#.. ....#... ....#... ...#.... ...#.... ..#....."),
    (7, ".######. .....#.. .....#.. ...####. ....#... ....#... ...#.... ...#...."),
    (8, "..###... .#...#.. .#...#.. ..###... .#...#.. .#...#.. .#...#.. ..###..."),
    (8, "..####.. .#....#. .#....#. ..####.. .#....#. .#....#. .#....#. ..####.."),
    (8, "...##... ..#..#.. ..#..#.. ...##... ..#..#.. .#....#. .#....#. ..####.."),
    (9, "..###... .#...#.. .#...#.. ..####.. .....#.. .....#.. .....#.. .....#.."),
    (9, "..####.. .#....#. .#....#. ..#####. ......#. ......#. .....#.. ....#..."),
    (9, "...###.. ..#...#. ..#...#. ...####. ......#. ......#. ......#. ......#."),
)
"""Thirty digits drawn by hand on the pad's 8x8 grid, three of each, as ``(label, pixels)``: the eight rows
of the grid separated by spaces, ``#`` for a pixel clicked with the pen. They were drawn the way a reader
draws on the pad (strokes one click wide, the digit as large as the grid allows), before any model
classified them, and are kept as they were drawn."""


def hand_drawn_digits(brush: torch.Tensor | None = BRUSH) -> tuple[torch.Tensor, torch.Tensor]:
    """:data:`HAND_DRAWN` as the pad draws them: images ``(B, 8, 8)`` (each ``#`` painted with ``brush``;
    ``None``: the clicked pixels alone, without the soft edges) and labels ``(B,)``."""
    images = []
    for _, pixels in HAND_DRAWN:
        rows = pixels.split()
        image = torch.zeros(len(rows), len(rows[0]))  # (Ih, Iw)
        for i, line in enumerate(rows):
            for j, ch in enumerate(line):
                if ch != "#":
                    continue
                if brush is None:
                    image[i, j] = 1.0
                else:
                    image = paint(image, i, j, brush=brush)
        images.append(image)
    labels = torch.tensor([label for label, _ in HAND_DRAWN], dtype=torch.long)  # (B,)
    return torch.stack(images), labels  # (B, Ih, Iw)
