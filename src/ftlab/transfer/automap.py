"""Maps between two models that ftlab finds itself: layer names, vocabularies, layers the source lacks.

Two models of one family pair by name; two families (a MiniLM, which is a BERT, and an MPNet) do not:
their stacks live under another attribute (``bert.encoder.layer`` vs ``mpnet.encoder.layer``), their
blocks name the same layers differently (``attention.self.query`` vs ``attention.attn.q``), their
tokenizers number the same vocabulary differently (MPNet's id = BERT's id + 4), and one has layers the
other lacks (MPNet's relative attention bias). What this module builds, each only where it is needed and
each recorded with the run's options (ftlab's rules, not BiCo's):

* :func:`match_names` -- a ``name_map`` (dotted name pieces of the target -> the source's): the Hugging Face
  base-model attribute (``base_model_prefix``: ``mpnet`` -> ``bert``), then, for each pair of stacks, the
  layers of the first target block paired with those of the first source block *in the order they are
  registered*, where both blocks hold the same sequence of layer kinds (linear, embedding, norm, with
  their parameter names). A block whose kinds differ is not guessed at: the error names the stack and asks
  for ``name_map``.
* :func:`missing_relative_bias` -- relative-position bias tables of the target (T5's and MPNet's
  ``relative_attention_bias``) that have no counterpart in the source: their delta is zero (B keeps its
  own), as the Python documentation of MiniLM -> MPNet did by hand.
* :func:`vocab_map_from_tokenizers` -- the ``vocab_map`` of two tokenizers: each row of B's embedding table
  takes A's row of the same token string; special tokens are paired by role (``cls``/``bos``, ``sep``/
  ``eos``, ``pad``, ``unk``, ``mask``); rows without a counterpart get ``-1`` (a zero delta).

:func:`automatic_options` applies the first two to a :class:`~ftlab.transfer.options.TransferOptions`
(``fit_transfer`` calls it); ``ftlab transfer`` adds the third from the two models' tokenizers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

from torch import nn

from ftlab.core.hooks import is_hf_conv1d, is_norm
from ftlab.transfer.layer_map import _rename_fn, _stack_pairs
from ftlab.transfer.spec import RELATIVE_BIAS

__all__ = ["automatic_options", "match_names", "missing_relative_bias", "vocab_map_from_tokenizers"]


def _kind(mod: nn.Module) -> tuple:
    """A layer's kind for pairing: its category and the names of its own parameters."""
    if isinstance(mod, nn.Embedding):
        cat = "embedding"
    elif is_norm(mod):
        cat = "norm"
    elif isinstance(mod, nn.Linear) or is_hf_conv1d(mod):
        cat = "linear"
    else:
        cat = type(mod).__name__
    return cat, tuple(sorted(n for n, _ in mod.named_parameters(recurse=False)))


def _layers(block: nn.Module) -> list[tuple[str, tuple]]:
    """``(relative name, kind)`` of the modules of ``block`` that hold parameters of their own, in registration order."""
    return [(n, _kind(m)) for n, m in block.named_modules() if n and any(True for _ in m.parameters(recurse=False))]


def _base_prefix(model: nn.Module) -> str | None:
    prefix = getattr(model, "base_model_prefix", "") or ""
    base = getattr(model, prefix, None) if prefix else None
    return prefix if isinstance(base, nn.Module) and base is not model else None


def match_names(source: nn.Module, target: nn.Module) -> dict[str, str] | None:
    """A ``name_map`` from ``target``'s layer names to ``source``'s, or None when the names already correspond.

    See the module docstring for the rule. Raises ``ValueError`` naming the stack when a target stack has no
    source counterpart and its blocks' layers cannot be paired.
    """
    pieces: dict[str, str] = {}
    sp, tp = _base_prefix(source), _base_prefix(target)
    if sp and tp and sp != tp:
        pieces[tp] = sp
    rename = _rename_fn(pieces) or (lambda n: n)
    pairs, unpaired = _stack_pairs(source, target, pieces or None)
    for t_path in unpaired:
        if rename(t_path) != t_path:  # the same path is left to the layer map, which names the stack
            raise ValueError(f"target stack {t_path!r} has no counterpart {rename(t_path)!r} in the source; "
                             "give name_map")
    s_mods = dict(source.named_modules())
    t_mods = dict(target.named_modules())
    inner: dict[str, str] = {}
    for t_path, (ss, st) in pairs.items():
        s_path = ss.path
        t_layers = _layers(t_mods[st.block_name(0)])
        s_layers = _layers(s_mods[ss.block_name(0)])
        if [k for _, k in t_layers] != [k for _, k in s_layers]:
            if t_path == s_path or {n for n, _ in t_layers} <= {n for n, _ in s_layers}:
                continue  # the same stack path, or layers named as the source's: left to the layer map
            raise ValueError(f"the blocks of target stack {t_path!r} and source stack {s_path!r} hold different layers "
                             f"({len(t_layers)} vs {len(s_layers)} with parameters, or of other kinds): ftlab cannot "
                             "pair them by order; give name_map")
        for (tn, _), (sn, _) in zip(t_layers, s_layers):
            if tn != sn:
                inner[tn] = sn
    if not pieces and not inner:
        return None
    found = {**pieces, **inner}
    check = _rename_fn(found)
    assert check is not None
    for t_path, (ss, st) in pairs.items():  # every paired layer must land on its intended source layer
        for (tn, _), (sn, _) in zip(_layers(t_mods[st.block_name(0)]), _layers(s_mods[ss.block_name(0)])):
            got = check(f"{st.block_name(0)}.{tn}")
            want = f"{ss.block_name(0)}.{sn}"
            if got != want:
                raise ValueError(f"the layer names of target stack {t_path!r} cannot be mapped piece by piece "
                                 f"({st.block_name(0)}.{tn} -> {got}, not {want}); give name_map")
    return found


def missing_relative_bias(source: nn.Module, target: nn.Module, rename: Callable[[str], str | None]) -> list[str]:
    """Relative-position bias tables of ``target`` (parameter names) whose source counterpart does not exist."""
    s_params = dict(source.named_parameters())
    out = []
    for name, mod in target.named_modules():
        if isinstance(mod, nn.Embedding) and any(re.fullmatch(p.replace("*", ".*"), name) for p in RELATIVE_BIAS):
            pname = f"{name}.weight"
            if rename(pname) not in s_params:
                out.append(pname)
    return out


def automatic_options(opts, source: nn.Module, target: nn.Module):
    """``opts`` with the maps ftlab finds itself (see the module docstring): a ``name_map`` where none is given and
    the names differ, and a zero delta for target relative-position bias tables the source lacks. Returns
    ``(options, notes)``; ``notes`` lists what was added (one line each)."""
    from ftlab.transfer.layer_map import build_layer_map

    notes: list[str] = []
    if opts.name_map is None:
        found = match_names(source, target)
        if found is not None:
            opts = dataclasses.replace(opts, name_map=found)
            notes.append(f"name_map found from the two models' structure: {found}")
    lmap = build_layer_map(source, target, "nearest_relative", name_map=opts.name_map)
    missing = [p for p in missing_relative_bias(source, target, lmap.source_name)
               if not any(re.fullmatch(g.replace("*", ".*"), p) for g in opts.zero_params)]
    if missing:
        opts = dataclasses.replace(opts, zero_params=opts.zero_params + tuple(missing))
        notes.append(f"zero delta for {', '.join(missing)}: relative-position bias without a counterpart in the source")
    return opts, notes


def _specials(tok) -> dict[str, int]:
    """A tokenizer's special-token ids by role (``bos`` counts as ``cls``, ``eos`` as ``sep``, where those are unset)."""
    out: dict[str, int] = {}
    for role, as_role in (("cls", "cls"), ("bos", "cls"), ("sep", "sep"), ("eos", "sep"), ("pad", "pad"),
                          ("unk", "unk"), ("mask", "mask")):
        i = getattr(tok, f"{role}_token_id", None)
        if isinstance(i, int) and as_role not in out:
            out[as_role] = i
    return out


def vocab_map_from_tokenizers(tok_a, tok_b, rows_b: int) -> list[int]:
    """For each of the ``rows_b`` rows of B's embedding table, the row of A's that holds the same token (-1: none).

    ``tok_a`` / ``tok_b``: Hugging Face tokenizers (``get_vocab()``); special tokens pair by role (see the
    module docstring).
    """
    va: Mapping[str, int] = tok_a.get_vocab()
    vb: Mapping[str, int] = tok_b.get_vocab()
    out = [-1] * rows_b
    for token, i in vb.items():
        if 0 <= i < rows_b and token in va:
            out[i] = int(va[token])
    sa, sb = _specials(tok_a), _specials(tok_b)
    for role, i in sb.items():
        if role in sa and 0 <= i < rows_b:
            out[i] = sa[role]
    return out
