"""Reading and writing checkpoints safely: safetensors, or ``torch.load(weights_only=True)``.

Pickled checkpoints that need arbitrary code to load are refused (``ValueError``), never
unpickled. A Hugging Face model folder is read from its ``model.safetensors`` (or the shards
listed in ``model.safetensors.index.json``; a ``pytorch_model.bin`` only with ``weights_only``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

__all__ = ["load_state_dict", "save_state_dict"]

_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _load_torch(path: Path) -> dict[str, torch.Tensor]:
    import pickle

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"refusing to unpickle {str(path)!r}: it is not a weights-only checkpoint "
                         "(convert it to safetensors)") from exc
    except (RuntimeError, EOFError, OSError) as exc:
        raise ValueError(f"cannot read checkpoint {str(path)!r}: {str(exc).splitlines()[0] if str(exc) else exc}") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"checkpoint {str(path)!r} is not a flat mapping of names to tensors")
    return dict(obj)


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot read safetensors file {str(path)!r}: {first}") from exc


def load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a flat ``{name: tensor}`` from a ``.safetensors`` file, a weights-only torch file or an HF folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        single = path / "model.safetensors"
        index = path / "model.safetensors.index.json"
        if single.exists():
            return _load_safetensors(single)
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            out: dict[str, torch.Tensor] = {}
            for s in shards:
                out.update(_load_safetensors(path / s))
            return out
        if (path / "pytorch_model.bin").exists():
            return _load_torch(path / "pytorch_model.bin")
        raise FileNotFoundError(f"folder {str(path)!r} holds no model.safetensors or pytorch_model.bin")
    if path.suffix == ".safetensors":
        return _load_safetensors(path)
    if path.suffix in _TORCH_SUFFIXES:
        return _load_torch(path)
    raise ValueError(f"checkpoint {str(path)!r} has an unknown suffix: use .safetensors, a weights-only "
                     f"{'/'.join(_TORCH_SUFFIXES)} file, or a Hugging Face model folder")


def save_state_dict(path: str | os.PathLike, state: dict[str, torch.Tensor], *,
                    metadata: dict[str, str] | None = None) -> Path:
    """Atomically write ``state`` as safetensors (tensors are copied, so tied weights are fine)."""
    from safetensors.torch import save

    from ftlab.core.results import atomic_write_bytes

    data = save({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}, metadata=metadata)
    return atomic_write_bytes(path, data)
