"""Tests for attnbook.vision: patches, the ViT and its baseline, attention rollout and [CLS]'s attention over
the patches, the baselines (a perceptron and a CNN of the same size), the digit speller and its per-letter
accuracy, and training on images (fit_images).

Dimension legend: B batch, H heads, T tokens, Th/Tw patch grid, E model dim, C classes, L name length.
"""

from __future__ import annotations

import pytest
import torch

from attnbook.vision import (
    DIGIT_NAMES,
    SPELLING_VOCAB,
    CNNClassifier,
    DigitSpeller,
    MLPClassifier,
    VisionTransformer,
    accuracy,
    attention_rollout,
    cls_attention,
    cnn_hidden_for,
    fit_images,
    letter_accuracy,
    mlp_hidden_for,
    n_params,
    patch_grid,
    patchify,
    random_shift,
    spell,
)


def images(B=3, side=8, seed=0):
    return torch.rand(B, side, side, generator=torch.Generator().manual_seed(seed))


def test_patchify_by_hand():
    x = torch.arange(16.0).view(1, 4, 4)
    p = patchify(x, 2)  # (1, 4, 4)
    assert p.shape == (1, 4, 4)
    assert p[0, 0].tolist() == [0, 1, 4, 5]  # top-left square, row by row
    assert p[0, 1].tolist() == [2, 3, 6, 7]  # top-right
    assert p[0, 2].tolist() == [8, 9, 12, 13]  # bottom-left
    assert patchify(x, 1).squeeze(-1).tolist() == x.flatten(1).tolist()
    assert patchify(x, 4).tolist() == x.flatten(1)[:, None].tolist()


def test_patchify_matches_unfold():
    x = images(B=2, side=8)
    ref = torch.nn.functional.unfold(x[:, None], kernel_size=2, stride=2).transpose(1, 2)  # (B, T, p*p)
    torch.testing.assert_close(patchify(x, 2), ref)


def test_patch_grid_inverts_raster_order():
    w = torch.arange(32.0).view(2, 16)
    g = patch_grid(w, (4, 4))
    assert g.shape == (2, 4, 4) and g[1, 2, 3].item() == 16 + 2 * 4 + 3


def test_patchify_bad_input():
    with pytest.raises(TypeError, match="images must be a torch.Tensor"):
        patchify([[0.0]], 2)
    with pytest.raises(TypeError, match="floating-point"):
        patchify(torch.zeros(1, 4, 4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"3-D \(B, Ih, Iw\).*got shape \(4, 4\)"):
        patchify(torch.zeros(4, 4), 2)
    with pytest.raises(ValueError, match=r"images \(1, 6, 8\): height 6 and width 8 must be multiples of patch=4"):
        patchify(torch.zeros(1, 6, 8), 4)
    with pytest.raises(TypeError, match="patch must be an int"):
        patchify(torch.zeros(1, 4, 4), 2.0)
    with pytest.raises(ValueError, match="patch must be an int >= 1"):
        patchify(torch.zeros(1, 4, 4), 0)
    with pytest.raises(ValueError, match=r"\(B, 16\) for grid \(4, 4\), got \(2, 15\)"):
        patch_grid(torch.zeros(2, 15), (4, 4))


def test_vit_shapes_and_weights():
    torch.manual_seed(0)
    vit = VisionTransformer(num_layers=2, num_heads=4)
    logits, weights = vit(images(), need_weights=True)
    assert logits.shape == (3, 10)
    assert len(weights) == 2 and weights[0].shape == (3, 4, 17, 17)  # [CLS] + 16 patches
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(3, 4, 17))
    torch.testing.assert_close(vit(images()), logits)
    with pytest.raises(ValueError, match=r"images must be \(B, 8, 8\), got \(3, 4, 4\)"):
        vit(images(side=4))


def test_vit_without_positions_is_blind_to_patch_order():
    """Chapter 5's permutation argument in 2-D: no positions, [CLS] readout -> the same logits for any
    shuffle of the patches; with positions the logits change."""
    torch.manual_seed(0)
    x = images(B=4)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    shuffled = patchify(x, 2)[:, perm].reshape(4, 4, 4, 2, 2).permute(0, 1, 3, 2, 4).reshape(4, 8, 8)
    torch.testing.assert_close(patchify(shuffled, 2), patchify(x, 2)[:, perm])
    blind = VisionTransformer(positions=False)
    torch.testing.assert_close(blind(shuffled), blind(x), rtol=1e-5, atol=1e-5)
    seeing = VisionTransformer(positions=True)
    with torch.no_grad():
        seeing.embed.row.mul_(50.0)  # make the positions matter
    assert not torch.allclose(seeing(shuffled), seeing(x), atol=1e-3)


def test_mlp_baseline_matches_parameter_count():
    vit = VisionTransformer()
    mlp = MLPClassifier(hidden=mlp_hidden_for(n_params(vit)))
    assert abs(n_params(mlp) - n_params(vit)) / n_params(vit) < 0.01
    assert mlp(images()).shape == (3, 10)


@pytest.mark.parametrize("channels", [4, 16])
def test_cnn_hidden_for_counts_the_parameters_exactly(channels):
    for hidden in (1, 37, 124):
        target = n_params(CNNClassifier(channels=channels, hidden=hidden))
        assert cnn_hidden_for(target, channels=channels) == hidden
    vit = VisionTransformer()
    cnn = CNNClassifier(hidden=cnn_hidden_for(n_params(vit)))
    assert abs(n_params(cnn) - n_params(vit)) / n_params(vit) < 0.01


def test_cnn_shapes_and_bad_input():
    torch.manual_seed(0)
    cnn = CNNClassifier(hidden=32)
    logits = cnn(images())
    assert logits.shape == (3, 10)
    assert cnn.loss(images(), torch.tensor([0, 1, 2])).item() > 0
    assert CNNClassifier(image_size=12, channels=2, hidden=5)(images(side=12)).shape == (3, 10)
    with pytest.raises(ValueError, match=r"images must be \(B, 8, 8\), got \(3, 4, 4\)"):
        cnn(images(side=4))
    with pytest.raises(ValueError, match="image_size=6 must be a multiple of 4"):
        CNNClassifier(image_size=6)
    with pytest.raises(TypeError, match="channels must be an int"):
        CNNClassifier(channels=2.5)


def test_cnn_sees_where_the_pixels_are():
    """Unlike the ViT without positions, the CNN's answer depends on the arrangement: swapping the image's
    quadrants (a permutation of the 2x2 patches that keeps each patch) changes its logits."""
    torch.manual_seed(0)
    cnn = CNNClassifier(hidden=32)
    x = images()
    swapped = torch.cat([x[:, 4:], x[:, :4]], dim=1)  # top and bottom halves exchanged
    assert not torch.allclose(cnn(swapped), cnn(x), atol=1e-4)


def test_rollout():
    torch.manual_seed(0)
    vit = VisionTransformer(num_layers=3)
    _, weights = vit(images(), need_weights=True)
    r = attention_rollout(weights)
    assert r.shape == (3, 17, 17)
    torch.testing.assert_close(r.sum(-1), torch.ones(3, 17))  # still a distribution over input tokens
    # one layer, no residual: the head-averaged weights themselves
    torch.testing.assert_close(attention_rollout(weights[:1], residual=0.0), weights[0].mean(1))
    # two layers by hand
    eye = torch.eye(17)
    a = [0.5 * eye + 0.5 * w.mean(1) for w in weights[:2]]
    torch.testing.assert_close(attention_rollout(weights[:2]), a[1] @ a[0])
    with pytest.raises(TypeError, match="non-empty list"):
        attention_rollout([])
    with pytest.raises(ValueError, match=r"weights\[1\] must be \(B, H, T, T\)"):
        attention_rollout([weights[0], weights[1][:, :, :5]])
    with pytest.raises(ValueError, match=r"residual must be in \[0, 1\)"):
        attention_rollout(weights, residual=1.0)


def test_cls_attention_is_the_cls_row_over_the_patches():
    torch.manual_seed(0)
    vit = VisionTransformer(num_layers=3, num_heads=4)
    _, weights = vit(images(B=2), need_weights=True)  # [(B, H, 17, 17) per layer]
    raw = cls_attention(weights, 1, 2, "raw", (4, 4))
    assert raw.shape == (4, 4)
    torch.testing.assert_close(raw.flatten(), weights[1][0, 2, 0, 1:])  # image 0, head 2, [CLS]'s row, no [CLS]
    torch.testing.assert_close(raw, patch_grid(weights[1][0, 2, 0, 1:][None], (4, 4))[0])  # raster order
    mean = cls_attention(weights, 2, "mean", "raw", (4, 4))
    torch.testing.assert_close(mean.flatten(), weights[2][0].mean(0)[0, 1:])
    assert cls_attention(weights, 0, 3, "raw", (4, 4)).sum() < 1  # [CLS] keeps some weight for itself
    for layer in range(3):
        rolled = cls_attention(weights, layer, "mean", "rollout", (4, 4))
        torch.testing.assert_close(rolled.flatten(), attention_rollout(weights[: layer + 1])[0, 0, 1:])
        torch.testing.assert_close(cls_attention(weights, layer, 0, "rollout", (4, 4)), rolled)  # heads ignored
    with pytest.raises(ValueError, match="view must be 'raw' or 'rollout', got 'saliency'"):
        cls_attention(weights, 0, 0, "saliency", (4, 4))


def test_spell():
    ids = spell(torch.tensor([7, 1]))
    assert ids.shape == (2, 6)
    assert SPELLING_VOCAB.decode(ids) == ["seven", "one"]
    assert ids[1, 3].item() == SPELLING_VOCAB.eos_id and ids[1, 4].item() == SPELLING_VOCAB.pad_id
    with pytest.raises(ValueError, match="digits 0..9"):
        spell(torch.tensor([10]))
    with pytest.raises(TypeError, match="LongTensor"):
        spell(torch.tensor([1.0]))


def test_speller_shapes_and_generate():
    torch.manual_seed(0)
    model = DigitSpeller()
    x = images()
    logits, cross = model(x, spell(torch.tensor([0, 1, 2])), need_weights=True)
    assert logits.shape == (3, 6, len(SPELLING_VOCAB)) and cross[0].shape == (3, 4, 6, 16)
    ids, w = model.generate(x)
    assert ids.shape == (3, 6) and w.shape == (3, 4, 6, 16)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 6))
    assert model.loss(x, torch.tensor([0, 1, 2])).item() > 0


def test_letter_accuracy_scores_each_position_under_teacher_forcing():
    """A scripted decoder: right where `right` says, wrong elsewhere (padding included, which must not count);
    it checks that it is given the right letters (teacher forcing) and the patches of `read`."""
    torch.manual_seed(0)
    model = DigitSpeller()
    x, y, other = images(B=3), torch.tensor([0, 1, 3]), images(B=3, seed=5)
    tgt = spell(y)  # zero<eos><pad>, one<eos><pad><pad>, three<eos>
    right = torch.tensor([[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    V = len(SPELLING_VOCAB)

    def scored(n):  # letter_accuracy of the first n names, the scripted decoder in place
        def scripted(tgt_in, memory):
            assert torch.equal(tgt_in, SPELLING_VOCAB.shift_right(tgt[:n]))
            assert torch.equal(memory, model.encode(other[:n]))
            predicted = torch.where(right[:n], tgt[:n], (tgt[:n] + 1) % V)  # (n, L)
            return torch.nn.functional.one_hot(predicted, V).float()  # (n, L, V)

        model.decode = scripted
        return letter_accuracy(model, x[:n], y[:n], read=other[:n])

    torch.testing.assert_close(scored(3), torch.tensor([2 / 3, 1.0, 2 / 3, 2 / 3, 1.0, 1.0]))
    acc = scored(2)  # no name of these two has a sixth token: that position has nothing to count
    assert torch.isnan(acc[5]) and acc[4].item() == 1.0


def test_letter_accuracy_reads_its_own_images_by_default():
    torch.manual_seed(0)
    model = DigitSpeller()
    x, y = images(B=5), torch.tensor([0, 4, 5, 6, 3])
    torch.testing.assert_close(letter_accuracy(model, x, y), letter_accuracy(model, x, y, read=x))


def test_letter_accuracy_bad_input():
    model = DigitSpeller()
    with pytest.raises(TypeError, match="model must be a DigitSpeller, got VisionTransformer"):
        letter_accuracy(VisionTransformer(), images(), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"read \(2, 8, 8\) must have the shape of images \(3, 8, 8\)"):
        letter_accuracy(model, images(), torch.tensor([0, 1, 2]), read=images(B=2))


def test_random_shift():
    x = torch.zeros(2, 5, 5)
    x[:, 2, 2] = 1.0
    g = torch.Generator().manual_seed(0)
    y = random_shift(x, 1, g)
    assert y.shape == x.shape and torch.equal(y.sum((1, 2)), torch.ones(2))  # the centre pixel stays in
    assert random_shift(x, 0, g) is x


@pytest.mark.slow
def test_training_learns_digits():
    """A short training on scikit-learn's digits: far above chance for the ViT, the MLP and the speller."""
    pytest.importorskip("sklearn")
    from attnbook.vision import load_digits_split

    x_tr, y_tr, x_te, y_te = load_digits_split()
    assert x_tr.shape == (1348, 8, 8) and x_te.shape == (449, 8, 8) and 0 <= x_tr.min() and x_tr.max() <= 1
    torch.manual_seed(0)
    vit = VisionTransformer()
    fit_images(vit, x_tr, y_tr, epochs=5)
    assert accuracy(vit, x_te, y_te) > 0.25  # chance is 0.1; the ViT starts slowly (about 0.97 after 60 epochs)
    mlp = MLPClassifier()
    fit_images(mlp, x_tr, y_tr, epochs=5)
    assert accuracy(mlp, x_te, y_te) > 0.8
    cnn = CNNClassifier()
    fit_images(cnn, x_tr, y_tr, epochs=5)
    assert accuracy(cnn, x_te, y_te) > 0.8
    speller = DigitSpeller()
    fit_images(speller, x_tr, y_tr, epochs=5)
    assert accuracy(speller, x_te, y_te) > 0.3
    assert len(DIGIT_NAMES) == 10


@pytest.mark.parametrize("cls", [VisionTransformer, MLPClassifier, CNNClassifier, DigitSpeller])
def test_images_of_another_dtype_are_named_with_the_models(cls):
    model = cls()
    x = images().double()
    call = (lambda: model.encode(x)) if cls is DigitSpeller else (lambda: model(x))
    with pytest.raises(TypeError, match=rf"^images is torch.float64, but {cls.__name__}'s parameters are torch.float32"):
        call()
    model.double()
    call()  # the module cast the message offers works
