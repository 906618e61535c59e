"""Calibration data from files: text tables tokenized per model, image folders preprocessed per model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ftlab.transfer.datafiles import (
    ImagePreprocessing,
    image_folder_batches,
    image_preprocessing,
    read_records,
    text_batches,
)

PIL = pytest.importorskip("PIL.Image")


def test_csv_and_jsonl_read_alike_and_text_pairs_are_tokenized_by_each_tokenizer(tmp_path):
    rows = [{"text": f"t{i}", "other": f"o{i}", "label": i % 2} for i in range(5)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.csv").write_text("text,other,label\n" + "".join(f"t{i},o{i},{i % 2}\n" for i in range(5)))
    assert [r["text"] for r in read_records(tmp_path / "d.jsonl")] == [r["text"] for r in read_records(tmp_path / "d.csv")]
    seen = []

    def tok(a, b=None, **kw):  # a stand-in tokenizer: one token per character, recording what it was given
        seen.append((list(a), list(b) if b is not None else None))
        n = max(len(x) + (len(y) if b is not None else 0) for x, y in zip(a, b or a))
        return {"input_ids": torch.ones(len(a), n, dtype=torch.long), "attention_mask": torch.ones(len(a), n)}

    src, tgt = text_batches(tmp_path / "d.csv", [tok, tok], pair_column="other", batch_size=2)
    assert [len(b["labels"]) for b in src] == [2, 2, 1] and torch.equal(torch.cat([b["labels"] for b in tgt]),
                                                                        torch.tensor([0, 1, 0, 1, 0]))
    assert seen[0] == (["t0", "t1"], ["o0", "o1"])


def _png(path, value, size=6):
    arr = np.full((size, size, 3), value, dtype=np.uint8)
    PIL.fromarray(arr).save(path)


def test_an_image_folder_gives_labels_in_class_order_and_each_models_preprocessing(tmp_path):
    for c, v in (("b_class", 200), ("a_class", 50)):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            _png(tmp_path / "imgs" / c / f"{i}.png", v)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 4}, "image_mean": [0.5] * 3,
                                                                         "image_std": [0.5] * 3}))
    pre_a = image_preprocessing(tmp_path / "m")
    assert pre_a == ImagePreprocessing(4, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    pre_b = image_preprocessing(None, size=8)
    a, b = image_folder_batches(tmp_path / "imgs", [pre_a, pre_b], batch_size=4)
    assert [x.shape for x, _ in a] == [(4, 3, 4, 4), (2, 3, 4, 4)] and b[0][0].shape == (4, 3, 8, 8)
    labels = torch.cat([y for _, y in a])
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]  # a_class first (sorted), whatever the folder order
    x0 = torch.cat([x for x, _ in a])[0]
    torch.testing.assert_close(x0, torch.full_like(x0, (50 / 255 - 0.5) / 0.5))  # (x - mean) / std of a flat image


def test_a_class_folder_without_images_and_an_unreadable_image_are_named(tmp_path):
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="class folder holds no images"):
        image_folder_batches(tmp_path / "imgs", [ImagePreprocessing(4)])
    (tmp_path / "imgs" / "a" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="bad.png: not a readable image"):
        image_folder_batches(tmp_path / "imgs", [ImagePreprocessing(4)])
