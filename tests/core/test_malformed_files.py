"""Files ftlab reads back: malformed store lines are skipped as documented (the sweep resumes), malformed
tables and sidecars are refused naming the file and the column or field."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ftlab.core.results import load_table, save_table
from ftlab.core.sweep import point_key, read_store, run_sweep

CALLS: list[int] = []


def square(x):
    CALLS.append(x)
    return {"y": x * x}


def test_a_store_with_bad_lines_resumes(tmp_path):
    store = tmp_path / "s.jsonl"
    run_sweep(square, [{"x": 0}, {"x": 1}], store=store, workers=1)
    good = store.read_bytes()
    key2 = point_key(square, {"x": 2})
    bad = [b"\xff\xfe not utf-8 \x80\n", b"{not json\n", json.dumps({"key": key2, "records": "oops"}).encode() + b"\n",
           json.dumps({"key": key2, "records": [1, 2]}).encode() + b"\n", json.dumps([key2]).encode() + b"\n",
           b'{"key": 7, "records": []}\n', b'{"key": "cut sho']
    store.write_bytes(good.replace(b"\n", b"\n" + b"".join(bad[:3]), 1) + b"".join(bad[3:]))
    assert sorted(read_store(store)) == sorted([point_key(square, {"x": 0}), point_key(square, {"x": 1})])
    CALLS.clear()
    df = run_sweep(square, [{"x": 0}, {"x": 1}, {"x": 2}], store=store, workers=1)
    assert CALLS == [2] and df.y.tolist() == [0, 1, 4]  # only the missing point was computed
    assert len(read_store(store)) == 3


def test_a_table_that_lacks_a_column_or_a_number_is_named(tmp_path):
    path = save_table(pd.DataFrame({"arch": ["a", "b"], "acc": [0.5, 0.7]}), tmp_path / "claims.csv")
    df, meta = load_table(path, columns=("arch", "acc"), numeric=("acc",))
    assert df.acc.tolist() == [0.5, 0.7] and meta["rows"] == 2
    with pytest.raises(ValueError, match=f"{path}: column 'seed' is missing"):
        load_table(path, columns=("arch", "seed"))
    path.write_text("arch,acc\na,0.5\nb,high\n")
    with pytest.raises(ValueError, match=f"{path}: column 'acc' holds a value that is not a number \\('high'\\)"):
        load_table(path, columns=("acc",), numeric=("acc",))
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"{path}: not a readable table"):
        load_table(path)


@pytest.mark.parametrize("sidecar, said", [("[1, 2]", "expected a JSON object, got list"),
                                           ('{"params": [1]}', "field 'params' must be a JSON object"),
                                           ("{oops", "not valid JSON")])
def test_a_sidecar_of_the_wrong_shape_is_named(tmp_path, sidecar, said):
    path = save_table(pd.DataFrame({"a": [1]}), tmp_path / "t.csv")
    side = tmp_path / "t.csv.meta.json"
    side.write_text(sidecar)
    with pytest.raises(ValueError, match=said) as info:
        load_table(path)
    assert str(side) in str(info.value)


def test_a_damaged_output_manifest_is_refused_before_any_work(tmp_path):
    from ftlab.core.results import output_lock, staged_output

    out = tmp_path / "out"
    with staged_output(out) as st:
        (st / "a.txt").write_text("1")
    (out / ".ftlab-set-output.json").write_text('{"files": "a.txt"}')
    with pytest.raises(ValueError, match="field 'files' of the ftlab output manifest is not a list: delete it"):
        with output_lock(out):
            raise AssertionError("the work must not start")
    assert (out / "a.txt").read_text() == "1"
