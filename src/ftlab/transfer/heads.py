"""Task heads that are new in both bases: found, fitted for the target, installed (ftlab's handling).

A fine-tuning for a classification task usually trains a *new* head: PEFT puts the classifier into an
adapter's ``modules_to_save`` (it does so itself for ``task_type="SEQ_CLS"``), and that head starts from
random weights in A, as B's does. Its "task vector", trained head minus A's random head, means nothing
for B: transported onto B's own random head it gives a head that is right for no draw of B's head (and
the adapter written from it is right only for the random head B's folder happens to hold). The maps
themselves suffer too: BiCo fits ``R_out`` on gradients that flow back from the loss through each model's
head, and a random head sends gradients in random directions. So ftlab treats such heads apart
(:class:`NewHeads`):

1. **Which heads** (:func:`find_new_heads`, ``TransferOptions.new_heads``): module-name globs of the target
   (source names through the layer map), plus ``"auto"`` (the default): the modules of a PEFT adapter's
   ``modules_to_save`` that lie *outside* the Hugging Face base model of the source (transformers'
   ``base_model_prefix``: ``classifier`` of ``BertForSequenceClassification``, ``score`` of
   ``LlamaForSequenceClassification``) and end in a layer with ``config.num_labels`` outputs (a task head,
   not a pretrained LM head); on the target, the modules outside *its* base model with parameters that
   end in the same number of outputs (``classifier.dense`` and ``classifier.out_proj`` of
   ``MPNetForSequenceClassification``). ``ftlab transfer`` adds the heads its loader had to initialise
   (a base folder loaded with a task class). The heads' parameters are left out of the transport (they get
   no delta) and out of the diagnostic's carried share.
2. **Calibration with heads in place**: A is calibrated with its trained head installed (A's base weights
   plus the adapter's head), B with a head fitted by the rule below on base B's rows, so that both models'
   gradients are gradients of the task; the written adapter then does not depend on B's random head
   (tested: two random heads in B's folder give the same adapter).
3. **The head written for B** (``TransferOptions.heads``):

   * ``refit`` (default): B's head is fitted in closed form on the labelled calibration rows (or on the
     labelled *head batches* a user gives for B alone, ``head_batches`` / ``--head-data``: the task's training
     texts, say, which cost one forward pass of B each and no map statistics), on the features of
     ``B + alpha tau_B`` (so it depends on alpha, like the statistics repair, and is installed
     by :meth:`~ftlab.transfer.api.TransferResult.model`): an L2-regularised multinomial logistic regression
     (integer labels) or ridge regression (float labels) of the head's last linear layer on its input rows,
     the penalty chosen by 5-fold cross-validation of the held-out loss over a grid (ftlab's choice).
     Layers of B's head before the last (MPNet's ``classifier.dense``) are set to the identity (a square
     layer) or the pad/truncate map, with zero bias, so that nothing depends on their random draw.
     Labels are read from each batch: ``batch["labels"]`` (or ``"label"``) of a mapping, the last entry of
     a tuple. Where the head's input has no row per labelled example (a decoder's ``score`` reads every
     token) or the batches hold no labels, the head is carried instead, and the report says so.
   * ``carry``: A's trained head, weights and bias, carried whole: ``W_B = W_A R_in`` with ``R_in`` the
     Procrustes map of the two heads' input rows (pad/truncate where they do not determine it), the
     class axis kept (both heads read the same labels). Needs a head of one linear layer on both sides.
   * ``delta``: the behaviour before this module: the head's ``saved - base`` transported like any other
     parameter (right only for B's own random head).

   Chosen on validation data of a design task (WordNet verb supersenses, MiniLM-L3 -> MiniLM-L6, 100
   calibration texts; docs/transfer.md, "A practitioner's walk-through"): ``refit`` led ``carry`` by 11
   points and ``delta`` by 16 points of accuracy at alpha = 1.

Other choices of this module (all ftlab's, none from the BiCo paper): features are centred and scaled by one
scalar before the fit (folded back into the weights); the cross-validation grid is ``1e-4 .. 1`` (mean loss
plus ``lambda / 2 ||W||^2``); fewer than 10 labelled rows fit at ``lambda = 1e-2`` without cross-validation.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import nn

from ftlab.transfer.batches import default_forward
from ftlab.transfer.task_vector import TaskVector

__all__ = ["HEAD_RULES", "HeadRule", "NewHeads", "batch_labels", "find_new_heads", "fit_linear_head", "head_params",
           "installed", "layer_inputs", "prepare_heads"]

HeadRule = Literal["refit", "carry", "delta"]
HEAD_RULES: tuple[str, ...] = get_args(HeadRule)
#: The cross-validated penalties of a refitted head (mean loss + lambda / 2 ||W||^2 on standardised rows).
LAMBDA_GRID: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
_FOLDS = 5
#: L-BFGS stops when every entry of the gradient of the (mean) penalised loss is below this: the loss is then within
#: about 1e-9 of its minimum on standardised rows, far below what the held-out loss or the accuracy can see.
_GRAD_TOL = 1e-7
_MIN_CV_ROWS = 10


# --- which heads ------------------------------------------------------------------------------------------


def _base_prefix(model: nn.Module) -> str | None:
    """The attribute holding a Hugging Face model's base model (``bert``), None when the model has no head part."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    base = getattr(model, prefix, None) if prefix and hasattr(model, "config") else None
    return prefix if isinstance(base, nn.Module) and base is not model else None


def _linears(model: nn.Module, under: str) -> list[str]:
    """Names of the modules with a 2-D weight (linear layers, HF ``Conv1D``) at or below module ``under``."""
    out = []
    for name, mod in model.named_modules():
        if (name == under or name.startswith(under + ".")) and isinstance(getattr(mod, "weight", None), torch.Tensor) \
                and mod.weight.ndim == 2 and not isinstance(mod, nn.Embedding):
            out.append(name)
    return out


def _param(mod: nn.Module, name: str) -> torch.Tensor | None:
    t = getattr(mod, name, None)
    return t if isinstance(t, torch.Tensor) else None


def _out_dim(mod: nn.Module) -> int:
    W = _param(mod, "weight")
    assert W is not None
    return int(W.shape[1] if type(mod).__name__ == "Conv1D" else W.shape[0])


def _task_heads(model: nn.Module, modules: Iterable[str] | None) -> list[str]:
    """The linear layers of ``model``'s task heads: outside its base model, in a top-level module (of ``modules``
    when given) whose last linear layer has ``config.num_labels`` outputs."""
    prefix = _base_prefix(model)
    n_labels = getattr(getattr(model, "config", None), "num_labels", None)
    if prefix is None or not isinstance(n_labels, int):
        return []
    tops = sorted({n.split(".")[0] for n in (modules if modules is not None else dict(model.named_children()))
                   if n and n.split(".")[0] != prefix})
    mods = dict(model.named_modules())
    out = []
    for top in tops:
        lin = _linears(model, top)
        if lin and _out_dim(mods[lin[-1]]) == n_labels:
            out.extend(lin)
    return out


def saved_modules(folder: str | os.PathLike) -> list[str]:
    """The ``modules_to_save`` of a PEFT adapter folder, from its tensors' names (no tensor is read)."""
    from ftlab.transfer.lora import WEIGHTS

    folder = Path(folder)
    names: list[str] = []
    if (folder / WEIGHTS[0]).is_file():
        from safetensors import safe_open

        with safe_open(str(folder / WEIGHTS[0]), framework="pt") as fh:
            names = list(fh.keys())
    elif (folder / WEIGHTS[1]).is_file():
        from ftlab.transfer.io import load_state_dict

        names = list(load_state_dict(folder / WEIGHTS[1]))
    prefix = "base_model.model."
    mods = {k[len(prefix):] if k.startswith(prefix) else k for k in names if ".lora_" not in k}
    return sorted({k.rpartition(".")[0] for k in mods})


def find_new_heads(source: nn.Module, target: nn.Module, source_finetuned: Any, patterns: Sequence[str],
                   source_name=None) -> tuple[list[str], list[str]]:
    """``(target head layers, source head layers)``: the linear layers of the heads that are new in both bases.

    ``patterns``: ``TransferOptions.new_heads`` (target module-name globs and ``"auto"``, see the module
    docstring); ``source_name`` maps a target module name to the source's (the layer map's ``source_name``).
    A glob's source head is the source layers of the same (mapped) names, or else the source's own task heads
    (outside its base model, ending in ``config.num_labels`` outputs); it may have none (then only ``refit``
    applies). Raises ``ValueError`` for a glob that names no module of the target.
    """
    t_mods, s_mods = dict(target.named_modules()), dict(source.named_modules())
    target_layers: list[str] = []
    source_layers: list[str] = []
    for pat in patterns:
        if pat == "auto":
            if isinstance(source_finetuned, (str, os.PathLike)):
                src = _task_heads(source, saved_modules(source_finetuned))
                if src:
                    source_layers += src
                    target_layers += _task_heads(target, None)
            continue
        hits = [n for n in t_mods if n and fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise ValueError(f"new_heads: {pat!r} names no module of the target")
        lin = [x for n in hits for x in _linears(target, n)]
        target_layers += lin
        mapped = [s for s in (source_name(x) if source_name is not None else x for x in lin) if s in s_mods]
        source_layers += mapped if mapped else _task_heads(source, None)
    dedup = lambda xs: list(dict.fromkeys(xs))  # noqa: E731
    return dedup(target_layers), dedup(source_layers)


def head_params(model: nn.Module, layers: Sequence[str]) -> list[str]:
    """The parameter names of the given layers."""
    return [f"{n}.{p}" if n else p for n in layers for p, _ in dict(model.named_modules())[n].named_parameters(
        recurse=False)]


# --- labels and rows --------------------------------------------------------------------------------------


def batch_labels(batch) -> torch.Tensor | None:
    """The labels of a calibration batch: ``batch["labels"]`` (or ``"label"``) of a mapping, the last entry of a
    tuple or list of two or more; None when it holds none."""
    if isinstance(batch, Mapping):
        y = batch.get("labels", batch.get("label"))
    elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
        y = batch[-1]
    else:
        y = None
    return y if isinstance(y, torch.Tensor) else None


@torch.no_grad()
def layer_inputs(model: nn.Module, layer: str, batches: Iterable) -> list[torch.Tensor]:
    """The input of module ``layer`` per batch (float64, detached), from a forward pass of ``model`` in eval mode
    (``model(**batch)`` without labels for a mapping, ``model(batch[0])`` for a tuple)."""
    from ftlab.core.modes import module_mode

    mod = dict(model.named_modules())[layer]
    got: list[torch.Tensor] = []
    handle = mod.register_forward_hook(lambda m, args, out: got.append(args[0].detach().double()))
    try:
        with module_mode(model):
            model.eval()
            for b in batches:
                default_forward(model, b)
    finally:
        handle.remove()
    return got


def _labelled_rows(rows: list[torch.Tensor], labels: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows and labels stacked when every batch has one row per label, else None."""
    if not rows or any(y is None for y in labels):
        return None
    xs, ys = [], []
    for x, y in zip(rows, labels):
        assert y is not None
        if x.ndim != 2 or x.shape[0] != y.shape[0]:
            return None
        xs.append(x)
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)


# --- the closed-form fit ---------------------------------------------------------------------------------


def _fit_at(X: torch.Tensor, Y: torch.Tensor, lam: float, classify: bool, k: int,
            init: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ``(k, d)`` and bias ``(k,)`` at penalty ``lam`` on standardised rows ``X``; ``init``: a starting
    point for the iterative (logistic) fit, e.g. the solution at a nearby penalty (the optimum is unique, so
    the start changes only the iterations, not the answer beyond the gradient tolerance ``_GRAD_TOL``)."""
    n, d = X.shape
    if not classify:  # ridge regression, closed form
        Xa = torch.cat([X, X.new_ones(n, 1)], 1)
        reg = torch.eye(d + 1, dtype=X.dtype) * lam * n
        reg[d, d] = 0.0
        sol = torch.linalg.lstsq(Xa.T @ Xa + reg, Xa.T @ Y.reshape(n, -1)).solution
        return sol[:d].T.contiguous(), sol[d]
    W = (init[0].clone() if init is not None else torch.zeros(k, d, dtype=X.dtype)).requires_grad_(True)
    b = (init[1].clone() if init is not None else torch.zeros(k, dtype=X.dtype)).requires_grad_(True)
    opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=500, tolerance_grad=_GRAD_TOL, tolerance_change=1e-14,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = nn.functional.cross_entropy(X @ W.T + b, Y) + 0.5 * lam * (W * W).sum()
        value.backward()
        return value

    with torch.enable_grad():
        opt.step(closure)
    return W.detach(), b.detach()


def _heldout_loss(X, Y, W, b, classify: bool) -> float:
    Z = X @ W.T + b
    if classify:
        return float(nn.functional.cross_entropy(Z, Y, reduction="sum"))
    return float(((Z - Y.reshape(Z.shape)) ** 2).sum())


def fit_linear_head(X: torch.Tensor, y: torch.Tensor, n_out: int, *, grid: Sequence[float] = LAMBDA_GRID,
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """A linear layer's weight ``(n_out, d)`` and bias ``(n_out,)`` fitted on rows ``X`` ``(n, d)`` and labels ``y``.

    Integer labels (``0 .. n_out - 1``): L2-regularised multinomial logistic regression; float labels ``(n,)``
    or ``(n, n_out)``: ridge regression. Rows are centred and scaled by one scalar (unit mean row norm) and
    the penalty (mean loss + ``lambda / 2 ||W||^2``) is chosen from ``grid`` by ``5``-fold cross-validation
    of the held-out loss (folds drawn by ``seed``; a grid of one value is used as it is; below 10 rows,
    ``1e-2``); the centring and scale are folded back, so the result
    applies to raw rows. Returns ``(W, b, record)`` with the chosen ``lambda`` and the per-``lambda`` losses.
    Raises ``ValueError`` for labels outside ``0 .. n_out - 1``.
    """
    X = X.detach().double()
    n = X.shape[0]
    classify = not y.is_floating_point()
    if classify:
        Y = y.long().reshape(-1)
        if Y.numel() != n or (n and (int(Y.min()) < 0 or int(Y.max()) >= n_out)):
            raise ValueError(f"head labels must be {n} integers in 0..{n_out - 1} (the head's outputs), got values "
                             f"{int(Y.min())}..{int(Y.max())}")
    else:
        Y = y.double()
        if Y.shape[0] != n or Y.reshape(n, -1).shape[1] not in (1, n_out):
            raise ValueError(f"head targets must be ({n},) or ({n}, {n_out}) floats, got {tuple(Y.shape)}")
        Y = Y.reshape(n, -1).expand(n, n_out) if Y.reshape(n, -1).shape[1] == 1 else Y.reshape(n, n_out)
    mu = X.mean(0)
    scale = float((X - mu).pow(2).sum(1).mean().sqrt()) + 1e-12
    Z = (X - mu) / scale
    losses: dict[float, float] = {}
    if n >= _MIN_CV_ROWS and len(grid) > 1:
        g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(n, generator=g)
        folds = [perm[i::_FOLDS] for i in range(_FOLDS)]
        starts: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * _FOLDS
        at: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
        for lam in sorted(grid, reverse=True):  # the path from the strongest penalty, each fold warm-started
            total = 0.0
            for f, held in enumerate(folds):
                keep = torch.ones(n, dtype=torch.bool)
                keep[held] = False
                W, b = _fit_at(Z[keep], Y[keep], lam, classify, n_out, starts[f])
                starts[f] = (W, b)
                total += _heldout_loss(Z[held], Y[held], W, b, classify)
            losses[float(lam)] = total / n
            at[float(lam)] = starts[0]  # type: ignore[assignment]
        lam = min(losses, key=lambda k: (losses[k], k))
        init = at[lam]
    else:
        lam, init = (float(grid[0]) if len(grid) == 1 else 1e-2), None
    W, b = _fit_at(Z, Y, lam, classify, n_out, init)
    W_raw = W / scale
    return W_raw, b - W_raw @ mu, {"lambda": lam, "cv_loss": losses, "rows": n}


# --- the heads of one transfer ------------------------------------------------------------------------------


def _set_linear(mod: nn.Module, W: torch.Tensor, b: torch.Tensor | None) -> None:
    """Write ``W`` (``out x in``) and ``b`` into a linear layer (``Conv1D`` stores ``in x out``)."""
    w, bias = _param(mod, "weight"), _param(mod, "bias")
    assert w is not None
    with torch.no_grad():
        w.copy_((W.T if type(mod).__name__ == "Conv1D" else W).to(w))
        if bias is not None:
            bias.copy_((b if b is not None else torch.zeros(bias.shape)).to(bias))


def _weight(mod: nn.Module) -> torch.Tensor:
    w = _param(mod, "weight")
    assert w is not None
    W = w.detach().double().clone()  # a copy: read while a value is installed, used after it is restored
    return W.T if type(mod).__name__ == "Conv1D" else W


@dataclass
class NewHeads:
    """The new heads of one transfer and how B's is made (see the module docstring).

    ``target`` / ``source``: the heads' linear layers (the last one is the output layer); ``rule`` the
    requested rule and ``used`` the one applied (``carry`` where ``refit`` had no labelled rows);
    ``carried`` the carried output layer ``(W, b)`` (rule ``carry``); ``batches`` the target's calibration
    batches (rule ``refit``, read again by :meth:`apply_`); ``record`` what was fitted (JSON-ready).
    """

    target: tuple[str, ...]
    source: tuple[str, ...]
    rule: str
    used: str = ""
    carried: tuple[torch.Tensor, torch.Tensor] | None = None
    batches: list = field(default_factory=list, repr=False)
    record: dict = field(default_factory=dict)
    #: the calibration head's fit ``(rows, W, b, record)``: :meth:`apply_` reuses it when it reads the same rows
    #: (``alpha = 0``), instead of running the cross-validated fit again
    fitted: tuple | None = field(default=None, repr=False)

    @property
    def output(self) -> str:
        return self.target[-1]

    def _fix_inner(self, model: nn.Module) -> None:
        """Layers of the head before the output layer: identity (pad/truncate) weights, zero bias."""
        mods = dict(model.named_modules())
        for name in self.target[:-1]:
            W = _weight(mods[name])
            _set_linear(mods[name], torch.eye(*W.shape, dtype=torch.float64), None)

    def apply_(self, model: nn.Module) -> dict:
        """Install B's head into ``model`` (B's architecture, e.g. ``B + alpha tau_B``) in place; returns what was
        fitted. ``refit`` reads the model's rows of the kept calibration batches (one forward pass)."""
        mods = dict(model.named_modules())
        self._fix_inner(model)
        if self.used == "carry":
            assert self.carried is not None
            _set_linear(mods[self.output], *self.carried)
            return {"rule": "carry"}
        rows = layer_inputs(model, self.output, self.batches)
        got = _labelled_rows(rows, [batch_labels(b) for b in self.batches])
        assert got is not None, "refit was chosen only with labelled rows"
        cached = self.fitted
        if cached is not None and cached[0].shape == got[0].shape and cached[0].dtype == got[0].dtype \
                and torch.equal(cached[0], got[0]):
            W, b, rec = cached[1:]
        else:
            W, b, rec = fit_linear_head(got[0], got[1], _out_dim(mods[self.output]))
        _set_linear(mods[self.output], W, b)
        return {"rule": "refit", **rec}

    def report(self) -> dict:
        return {"rule": self.rule, "used": self.used, "target": list(self.target), "source": list(self.source),
                **self.record}


@contextlib.contextmanager
def installed(model: nn.Module, values: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Within the block, ``model``'s parameters in ``values`` hold those values; the old ones come back after."""
    params = dict(model.named_parameters())
    old = {k: params[k].detach().clone() for k in values}
    try:
        with torch.no_grad():
            for k, v in values.items():
                params[k].copy_(v.to(params[k]))
        yield
    finally:
        with torch.no_grad():
            for k, v in old.items():
                params[k].copy_(v)


def prepare_heads(rule: str, source: nn.Module, target: nn.Module, tau_a: TaskVector, layers: tuple[list[str], list[str]],
                  pairs: list[tuple[Any, Any]], head_batches: Sequence[Any] | None = None
                  ) -> tuple[NewHeads, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The heads of a transfer, before its calibration pass.

    Returns ``(heads, source_values, target_values)``: the source head's trained parameters (A's base plus
    ``tau_A`` on the head) and B's calibration head (fitted by the rule on base B's rows), to be installed while
    both models are calibrated (:func:`installed`). ``pairs``: the calibration batch pairs (all of them).
    ``head_batches``: labelled batches for B alone that rule ``refit`` fits on instead of the target's
    calibration batches (both the calibration head and the head written for ``B + alpha tau_B``); None: the
    calibration batches.
    """
    t_layers, s_layers = layers
    heads = NewHeads(tuple(t_layers), tuple(s_layers), rule)
    s_params = dict(source.named_parameters())
    # summed in float64: a saved head read as ``saved - base`` (float64, exact) comes back bit for bit, so the
    # calibration does not depend on the random head the source's loader drew
    src_vals = {k: (s_params[k].detach().double() + tau_a[k].to(s_params[k].device).double()).to(s_params[k].dtype)
                for k in head_params(source, s_layers) if k in tau_a}
    tgt_batches = list(head_batches) if head_batches is not None else [bb for _, bb in pairs]
    if head_batches is not None and not tgt_batches:
        raise ValueError("head_batches is empty: give labelled batches for the target's head, or None")
    labels = [batch_labels(b) for b in tgt_batches]
    heads.batches = tgt_batches
    t_mods = dict(target.named_modules())
    before = {k: v.detach().clone() for k, v in target.named_parameters() if k in set(head_params(target, t_layers))}
    try:
        heads._fix_inner(target)
        rows_b = layer_inputs(target, heads.output, tgt_batches)
        labelled = _labelled_rows(rows_b, labels)
        heads.used = rule
        if rule == "refit" and labelled is None:
            heads.used = "carry"
            which = "head batches" if head_batches is not None else "calibration batches"
            why = f"the {which} hold no labels" if any(y is None for y in labels) else \
                f"its input has no row per labelled example (shape {tuple(rows_b[0].shape)})"
            heads.record["note"] = f"head {heads.output!r} carried instead of refitted: {why}"
        if heads.used == "carry":
            if head_batches is not None:
                rows_b = layer_inputs(target, heads.output, [bb for _, bb in pairs])
            heads.carried = _carry(source, s_layers, src_vals, rows_b, pairs, t_mods[heads.output])
            _set_linear(t_mods[heads.output], *heads.carried)
        else:
            assert labelled is not None
            W, b, rec = fit_linear_head(labelled[0], labelled[1], _out_dim(t_mods[heads.output]))
            heads.fitted = (labelled[0], W, b, rec)
            _set_linear(t_mods[heads.output], W, b)
            heads.record["calibration_head"] = {"lambda": rec["lambda"], "rows": rec["rows"]}
        heads.record["head_data"] = head_batches is not None
        tgt_vals = {k: v.detach().clone() for k, v in target.named_parameters() if k in before}
    finally:
        with torch.no_grad():
            params = dict(target.named_parameters())
            for k, v in before.items():
                params[k].copy_(v)
    return heads, src_vals, tgt_vals


def _carry(source: nn.Module, s_layers: Sequence[str], src_vals: Mapping[str, torch.Tensor], rows_b: list[torch.Tensor],
           pairs: list[tuple[Any, Any]], out_mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """A's trained output layer carried to B: ``W_A R_in`` (Procrustes map of the input rows), A's bias."""
    from ftlab.core.stats import CrossMoments
    from ftlab.transfer.align import fit_map

    if len(s_layers) != 1:
        raise ValueError(f"heads='carry' needs a source head of one linear layer, got {list(s_layers)} (use heads='refit')")
    with installed(source, src_vals):
        rows_a = layer_inputs(source, s_layers[0], [ba for ba, _ in pairs])
        W_a = _weight(dict(source.named_modules())[s_layers[0]])
        b_mod = getattr(dict(source.named_modules())[s_layers[0]], "bias", None)
        b_a = b_mod.detach().double().clone() if b_mod is not None else torch.zeros(W_a.shape[0], dtype=torch.float64)
    if W_a.shape[0] != _out_dim(out_mod):
        raise ValueError(f"heads='carry': the source head has {W_a.shape[0]} outputs, the target's {_out_dim(out_mod)}")
    stats = CrossMoments(rows_a[0].shape[-1], rows_b[0].shape[-1])
    for xa, xb in zip(rows_a, rows_b):
        if xa.shape[:-1] != xb.shape[:-1]:
            raise ValueError(f"heads='carry': the heads read {tuple(xa.shape)} rows in the source and {tuple(xb.shape)} "
                             "in the target")
        stats.update(xa.reshape(-1, xa.shape[-1]), xb.reshape(-1, xb.shape[-1]))
    from ftlab.transfer.factored import as_dense

    R = as_dense(fit_map(stats, source="act", name="new head input").R).double()
    return W_a @ R, b_a


def heads_summary(heads: NewHeads | None) -> str:
    """One line for the command line."""
    if heads is None:
        return ""
    rows = heads.record.get("calibration_head", {}).get("rows")
    src = "head data" if heads.record.get("head_data") else "calibration"
    what = (f"refitted on {rows} labelled {src} rows" if rows else f"refitted on the labelled {src} rows") \
        if heads.used == "refit" else "carried from A"
    return f"new head {', '.join(heads.target)} {what}" + (f" ({heads.record['note']})" if "note" in heads.record else "")
