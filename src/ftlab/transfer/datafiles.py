"""Calibration data from the files practitioners have: a table of texts, or a folder of images.

* **Texts**: a JSON-lines file (one object per line) or a CSV/TSV file with a header, a text column,
  optionally a second text column (pairs of texts, as for entailment) and an integer label column.
  Each model tokenizes the same examples with its own tokenizer (:func:`load_tokenizer` reads it from
  the model's folder, no code from the folder runs), so A and B may tokenize differently: batches are
  paired by example (the ``seq_align`` option says how their token rows are paired).
* **Images**: a folder with one sub-folder per class (``root/<class>/<image>``, classes in sorted
  order, labels ``0, 1, ...``), read with Pillow, converted to RGB, resized to a square and
  normalised by a mean and a standard deviation per channel; each model may have its own size and
  normalisation (:func:`image_preprocessing` reads them from a Hugging Face folder's
  ``preprocessor_config.json`` as plain JSON).

Every problem with a file (unreadable, empty, a missing column, a label that is not an integer, a
folder without classes, an image that does not open) is a ``ValueError`` naming the file and what is
wrong.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["IMAGE_SUFFIXES", "ImagePreprocessing", "TEXT_SUFFIXES", "TOKENIZER_FILES", "image_folder_batches",
           "image_preprocessing", "load_tokenizer", "read_records", "text_batches"]

TEXT_SUFFIXES = (".jsonl", ".csv", ".tsv")
#: Files that hold a tokenizer's vocabulary (one of them must be in a tokenizer's folder).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def read_records(path: str | os.PathLike, *, max_rows: int | None = None) -> list[dict]:
    """The rows of a JSON-lines, CSV or TSV file as dicts (column -> value)."""
    path = Path(path)
    if path.suffix.lower() not in TEXT_SUFFIXES:
        raise ValueError(f"{path}: unknown text-data format {path.suffix!r}: use {', '.join(TEXT_SUFFIXES)}")
    rows: list[dict] = []
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            if path.suffix.lower() == ".jsonl":
                for i, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}, line {i}: not valid JSON ({exc.msg})") from None
                    if not isinstance(row, dict):
                        raise ValueError(f"{path}, line {i}: expected a JSON object, got {type(row).__name__}")
                    rows.append(row)
                    if max_rows is not None and len(rows) >= max_rows:
                        break
            else:
                reader = csv.DictReader(fh, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
                for row in reader:
                    rows.append(row)
                    if max_rows is not None and len(rows) >= max_rows:
                        break
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV file ({exc})") from None
    if not rows:
        raise ValueError(f"{path}: holds no rows")
    return rows


def _column(rows: list[dict], name: str, path: Path) -> list:
    missing = next((i for i, r in enumerate(rows) if name not in r), None)
    if missing is not None:
        have = ", ".join(sorted(map(str, rows[missing]))) or "none"
        raise ValueError(f"{path}: row {missing + 1} has no column {name!r} (columns: {have})")
    return [r[name] for r in rows]


def _labels(values: list, name: str, path: Path) -> torch.Tensor:
    out = []
    for i, v in enumerate(values, 1):
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and v.strip().lstrip("-").isdigit())):
            raise ValueError(f"{path}: row {i}: label column {name!r} holds {v!r}, not an integer class index")
        out.append(int(v))
    if min(out) < 0:
        raise ValueError(f"{path}: label column {name!r} holds a negative class index ({min(out)})")
    return torch.tensor(out, dtype=torch.long)


def load_tokenizer(folder: str | os.PathLike, *, trust_remote_code: bool = False):
    """The tokenizer saved in a model folder (``tokenizer.json``, ``vocab.txt``, ...), offline."""
    import transformers

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"tokenizer: {str(folder)!r} is not a folder")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):  # else transformers makes an empty one, silently
        raise ValueError(f"{folder}: no tokenizer ftlab can read there (none of {', '.join(TOKENIZER_FILES)}); give the "
                         "tokenizer's folder with --source-tokenizer/--target-tokenizer")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code,
                                                          local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{folder}: no tokenizer ftlab can read there ({first}); give the tokenizer's folder with "
                         "--source-tokenizer/--target-tokenizer") from None


def text_batches(path: str | os.PathLike, tokenizers: Sequence[Callable], *, text_column: str = "text",
                 pair_column: str | None = None, label_column: str | None = "label", batch_size: int = 32,
                 max_length: int = 128, max_rows: int | None = None) -> list[list[dict]]:
    """Batches of the same examples for each tokenizer: ``[batches for tokenizer 0, batches for tokenizer 1, ...]``.

    Each batch is a dict of ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the
    tokenizer makes them), padded to the batch's longest example (at most ``max_length`` tokens),
    and ``labels`` (int64) when ``label_column`` is given.
    """
    path = Path(path)
    rows = read_records(path, max_rows=max_rows)
    texts = [str(t) for t in _column(rows, text_column, path)]
    pairs = [str(t) for t in _column(rows, pair_column, path)] if pair_column else None
    labels = _labels(_column(rows, label_column, path), label_column, path) if label_column else None
    out = []
    for tok in tokenizers:
        batches = []
        for i in range(0, len(texts), batch_size):
            args = (texts[i:i + batch_size],) if pairs is None else (texts[i:i + batch_size], pairs[i:i + batch_size])
            enc = tok(*args, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            b = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            if labels is not None:
                b["labels"] = labels[i:i + batch_size]
            batches.append(b)
        out.append(batches)
    return out


@dataclass(frozen=True)
class ImagePreprocessing:
    """Square resize (``size`` px, bilinear) and per-channel normalisation ``(x - mean) / std`` of RGB in [0, 1]."""

    size: int = 224
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"image size={self.size!r} is invalid: must be a positive integer")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if len(v) != 3 or any(not isinstance(x, (int, float)) for x in v):
                raise ValueError(f"image {name}={v!r} is invalid: give three numbers (R, G, B)")
        if any(x <= 0 for x in self.std):
            raise ValueError(f"image std={self.std!r} is invalid: every value must be > 0")


def image_preprocessing(folder: str | os.PathLike | None, *, size: int | None = None,
                        mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> ImagePreprocessing:
    """A model's preprocessing: flags first, then its folder's ``preprocessor_config.json``, then ImageNet's defaults."""
    cfg: dict = {}
    if folder is not None and (Path(folder) / "preprocessor_config.json").is_file():
        from ftlab.core.results import read_json_object

        cfg = read_json_object(Path(folder) / "preprocessor_config.json")
    side = cfg.get("size")
    if isinstance(side, dict):
        side = side.get("height") or side.get("shortest_edge")
    base = ImagePreprocessing()
    return ImagePreprocessing(size=int(size or side or base.size), mean=tuple(mean or cfg.get("image_mean") or base.mean),
                              std=tuple(std or cfg.get("image_std") or base.std))


def _image_files(root: Path) -> list[tuple[Path, int]]:
    if not root.is_dir():
        raise ValueError(f"image folder {str(root)!r} does not exist or is not a folder")
    classes = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise ValueError(f"{root}: no class folders (expected {root}/<class>/<image>)")
    files = []
    for label, d in enumerate(classes):
        imgs = sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        if not imgs:
            raise ValueError(f"{d}: class folder holds no images ({', '.join(IMAGE_SUFFIXES)})")
        files += [(f, label) for f in imgs]
    return files


def image_folder_batches(root: str | os.PathLike, preprocessing: Sequence[ImagePreprocessing], *, batch_size: int = 32,
                         max_images: int | None = None, seed: int = 0) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """``(images, labels)`` batches of the same images for each preprocessing (one list per model).

    ``max_images`` draws that many images at random (``seed``) from all classes, in a fixed order.
    """
    from PIL import Image, UnidentifiedImageError
    from torch.nn import functional as F

    files = _image_files(Path(root))
    if max_images is not None and max_images < len(files):
        g = torch.Generator().manual_seed(seed)
        files = [files[int(i)] for i in sorted(torch.randperm(len(files), generator=g)[:max_images].tolist())]
    raw = []
    for f, _ in files:
        try:
            with Image.open(f) as im:
                arr = torch.frombuffer(bytearray(im.convert("RGB").tobytes()), dtype=torch.uint8)
                raw.append(arr.reshape(im.size[1], im.size[0], 3).permute(2, 0, 1).float() / 255.0)
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise ValueError(f"{f}: not a readable image ({exc})") from None
    labels = torch.tensor([lab for _, lab in files], dtype=torch.long)
    out = []
    for pre in preprocessing:
        mean, std = torch.tensor(pre.mean).view(3, 1, 1), torch.tensor(pre.std).view(3, 1, 1)
        x = torch.stack([(F.interpolate(im[None], size=(pre.size, pre.size), mode="bilinear", align_corners=False)[0]
                          - mean) / std for im in raw])
        out.append([(x[i:i + batch_size], labels[i:i + batch_size]) for i in range(0, len(raw), batch_size)])
    return out
