"""`ftlab deep`: the input tables are never written over, the claims, tables and figures of a run are one whole
output set, malformed tables and sidecars are named, sizes are checked before any work."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ftlab.core.results import atomic_write_bytes, output_lock, save_table
from ftlab.experiments.deep_claims import figures as G
from ftlab.experiments.deep_claims.pipeline import verdicts_from_folder

PROTOCOL = {"gamma_default": 1.0, "geometry_at": 100, "stages": []}


def _save(folder: Path, tables: tuple[dict, dict], parts=("vision", "modular"), protocol=PROTOCOL) -> Path:
    for part, tabs in zip(("vision", "modular"), tables):
        if part in parts:
            for name, df in tabs.items():
                save_table(df, folder / f"{part}_{name}.csv", params={"protocol": protocol})
    return folder


def _main(capsys, *args) -> tuple[int, list[str]]:
    from ftlab.cli.main import main

    try:
        main(list(map(str, args)))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err.splitlines()


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _content(folder: Path) -> dict[str, object]:
    """The output set as written, without ftlab's bookkeeping and the sidecars' time of writing."""
    out: dict[str, object] = {}
    for rel, data in _tree(folder).items():
        if rel.startswith(".ftlab"):
            continue
        if rel.endswith(".meta.json"):
            meta = json.loads(data)
            meta.pop("written")
            out[rel] = meta
        else:
            out[rel] = data
    return out


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_claims_never_write_where_their_tables_are(tmp_path, capsys, deep_tables, where):
    folder = _save(tmp_path / "runs" / "tables", deep_tables())
    out = {"same": folder, "inside": folder / "recomputed", "contains": tmp_path / "runs"}[where]
    before = _tree(tmp_path)
    code, err = _main(capsys, "deep", "claims", folder, "--out", out)
    how = {"same": "is", "inside": "lies inside", "contains": "contains"}[where]
    assert code == 2 and len(err) == 1 and f"{how} the input FOLDER" in err[0] and str(folder) in err[0]
    assert _tree(tmp_path) == before and not (folder / "recomputed").exists()  # nothing written, no lock left


def test_claims_by_default_write_beside_the_folder_and_replace_an_earlier_set_whole(tmp_path, capsys, deep_tables):
    folder = _save(tmp_path / "tables", deep_tables())
    before = _tree(folder)
    code, err = _main(capsys, "deep", "claims", folder, "--format", "json")
    out = tmp_path / "tables-recomputed"
    assert code == 0, err
    assert _tree(folder) == before  # the input is only read
    assert {"claims.csv", "primaries.csv", "fig_primaries.png", "fig_claim1_kappa.png",
            "fig_claim5_balancedness.png"} <= set(os.listdir(out))
    (out / "notes.md").write_text("the user's own file")
    only_modular = _save(tmp_path / "modular", deep_tables(0.05), parts=("modular",))
    code, err = _main(capsys, "deep", "claims", only_modular, "--out", out)
    assert code == 0, err
    names = {n for n in os.listdir(out) if not n.startswith(".ftlab")}
    # the vision figures of the earlier set are gone; the user's file stays
    assert names == {"claims.csv", "claims.csv.meta.json", "primaries.csv", "primaries.csv.meta.json",
                     "fig_primaries.png", "fig_claim5_balancedness.png", "notes.md"}


def _stand_in_figures(monkeypatch):
    """Figures written through the real path (``save_figure``'s atomic write) but without drawing: the bytes are
    the table the figure is made from, so a figure beside a table of another run is seen."""
    def balancedness(ft, path):
        atomic_write_bytes(path, ft.to_csv(index=False).encode())

    def primaries(rows, table, path):
        atomic_write_bytes(path, table.to_csv(index=False).encode())

    monkeypatch.setattr(G, "plot_balancedness", balancedness)
    monkeypatch.setattr(G, "plot_primaries", primaries)


def _computed_once(monkeypatch):
    """The statistics of each input table computed once (the loop below repeats only the write path)."""
    import pandas as pd

    from ftlab.experiments.deep_claims import claims as C

    rows, tables = {}, {}
    real_rows, real_table = C.modular_rows, C.claims_table

    def modular_rows(ft, pt=None):
        key = int(pd.util.hash_pandas_object(ft).sum())
        if key not in rows:
            rows[key] = real_rows(ft, pt)
        return rows[key]

    def claims_table(got):
        key = tuple(map(id, got))  # the cached rows above: the same objects for the same table
        if key not in tables:
            tables[key] = real_table(got)
        return tables[key].copy()

    monkeypatch.setattr(C, "modular_rows", modular_rows)
    monkeypatch.setattr(C, "claims_table", claims_table)


@pytest.mark.parametrize("mode", ["error", "kill"])
def test_a_fault_at_any_file_operation_of_the_claims_write_leaves_the_old_or_the_new_set(
        tmp_path, monkeypatch, faults, deep_tables, mode):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # counted and failed below, but not waiting for the disk
    _stand_in_figures(monkeypatch)
    _computed_once(monkeypatch)
    old_tables = _save(tmp_path / "old", deep_tables(0.0), parts=("modular",))
    new_tables = _save(tmp_path / "new", deep_tables(0.05), parts=("modular",))
    template, reference = tmp_path / "template", tmp_path / "reference"
    verdicts_from_folder(old_tables, out=template)
    (template / "notes.md").write_text("the user's own file")
    old = _content(template)
    shutil.copytree(template, reference)
    with monkeypatch.context() as m:
        log = faults.Injector(m, None, mode).log
        verdicts_from_folder(new_tables, out=reference)
    new = _content(reference)
    assert old["claims.csv"] != new["claims.csv"] and old["notes.md"] == new["notes.md"]
    assert len(log) > 20 and any(op == "rename" and p.endswith("-commit-claims") for op, p in log)
    seen = set()
    for k in range(1, len(log) + 1):
        out = tmp_path / f"{mode}{k}"
        shutil.copytree(template, out)
        raised = True
        with monkeypatch.context() as m:
            faults.Injector(m, k, mode)
            try:
                verdicts_from_folder(new_tables, out=out)
                raised = False
            except (OSError, faults.Killed):
                pass
        with output_lock(out):  # the next run: completes or discards what the fault left
            pass
        state = _content(out)
        assert state in (old, new), f"{mode} at operation {k} {log[k - 1]}: a mix of two runs"
        assert raised or state == new, f"{mode} at operation {k} {log[k - 1]}: success reported, old set kept"
        assert sorted(os.listdir(out)) == sorted(os.listdir(template)), f"{mode} at {k}: leftovers"
        seen.add("old" if state == old else "new")
        shutil.rmtree(out)
    assert "old" in seen and (mode == "error" or "new" in seen), seen


@pytest.mark.parametrize("damage, named", [
    (lambda f: f["modular_ft.csv"].drop(columns=["acc"]), "modular_ft.csv: column 'acc' is missing"),
    (lambda f: f["modular_ft.csv"].assign(b=["x"] + list(f["modular_ft.csv"].b[1:])),
     "modular_ft.csv: column 'b' holds a value that is not a number ('x')"),
    (lambda f: f["vision_ft.csv"].drop(columns=["ft_loss"]), "vision_ft.csv: column 'ft_loss' is missing"),
    (lambda f: f["vision_pt.csv"].drop(columns=["pt_converged"]), "vision_pt.csv: column 'pt_converged' is missing"),
])
def test_a_malformed_table_is_named_by_file_and_column(tmp_path, capsys, deep_tables, damage, named):
    import pandas as pd

    folder = _save(tmp_path / "tables", deep_tables())
    frames = {p.name: pd.read_csv(p) for p in folder.glob("*.csv")}
    name = named.split(":")[0]
    frames[name] = damage(frames)
    frames[name].to_csv(folder / name, index=False)
    code, err = _main(capsys, "deep", "claims", folder, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1 and str(folder / named) in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("protocol, field", [
    (["gamma_default", 1.0], "params.protocol' must be a JSON object, got list"),
    ({"gamma_default": "one"}, "params.protocol.gamma_default' must be a positive number"),
    ({"stages": "pool"}, "params.protocol.stages' must be a list of stage names"),
    ({"geometry_at": 1.5}, "params.protocol.geometry_at' must be an integer or null"),
])
def test_a_sidecar_of_the_wrong_shape_is_named_by_file_and_field(tmp_path, capsys, deep_tables, protocol, field):
    folder = _save(tmp_path / "tables", deep_tables(), protocol=protocol)
    code, err = _main(capsys, "deep", "claims", folder, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1, err
    assert f"{folder / 'vision_ft.csv.meta.json'}: field '{field}" in err[0]
    assert not (tmp_path / "out").exists()


def test_geometry_columns_the_sidecar_promises_must_be_there(tmp_path, capsys, deep_tables):
    vision, modular = deep_tables()
    vision["ft"]["pr_post_c:pool"] = 3.0  # the last stage's PR, but not the other stages' columns
    folder = _save(tmp_path / "tables", (vision, modular), protocol={**PROTOCOL, "stages": ["stem", "pool"]})
    code, err = _main(capsys, "deep", "claims", folder, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1 and "vision_ft.csv: column 'pr_post_c:stem' is missing" in err[0], err


@pytest.mark.parametrize("args, said", [
    (["--width", "1000000"], "--width 1000000 needs about"),
    (["--seeds", "0,-1"], "--seeds='0,-1': seed -1 is out of range: must be an integer >= 0"),
    (["--width", "0"], "Invalid value for '--width'"),
])
def test_vision_sizes_and_seeds_are_refused_before_any_work(tmp_path, capsys, args, said):
    out = tmp_path / "runs" / "vision"
    code, err = _main(capsys, "deep", "vision", "--out", out, "--workers", "1", *args)
    assert code == 2 and said in "\n".join(err), err
    if "1000000" in args:  # one line, naming the parameter and what to do
        assert len(err) == 1 and "GiB of memory" in err[0] and "reduce --width" in err[0]
    assert not (tmp_path / "runs").exists()  # refused before anything was created


@pytest.mark.parametrize("part", ["vision", "modular"])
def test_a_failed_rerun_of_a_part_keeps_its_earlier_tables_claims_and_figures(tmp_path, capsys, monkeypatch,
                                                                              deep_tables, part):
    """`ftlab deep vision|modular` on planted sweep results (no training): the sweep stores stay in --out, the tables,
    claims and figures are one set; a rerun that fails at a figure leaves the earlier set as it was."""
    import pandas as pd

    from ftlab.experiments.deep_claims import modular as Mo
    from ftlab.experiments.deep_claims import vision as V

    out = tmp_path / "run"
    elr = pd.DataFrame({"arch": ["nf_resnet18"], "knob": ["kappa"], "when": ["init"], "value": [0.25]})
    monkeypatch.setattr(V, "elr_table", lambda proto, grid: elr)

    def run(shift: float) -> tuple[int, list[str]]:
        tables = deep_tables(shift, seeds=(0, 1))[0 if part == "vision" else 1]

        def sweep(proto, grid, where, **kw):
            with open(where / f"{part}_ft.jsonl", "a") as fh:  # a sweep store: appended, kept
                fh.write(f"{shift}\n")
            return {k: v.copy() for k, v in tables.items()}

        monkeypatch.setattr(V, "run_vision", sweep)
        monkeypatch.setattr(Mo, "run_modular", sweep)
        return _main(capsys, "deep", part, "--out", out, "--workers", "1", "--format", "json")

    code, err = run(0.0)
    assert code == 0, err
    written = set(os.listdir(out))
    assert {f"{part}_ft.csv", "claims.csv", "primaries.csv", "fig_primaries.png"} <= written
    before = {k: v for k, v in _tree(out).items() if not k.endswith(".jsonl")}

    def full(*args, **kw):
        raise OSError(28, "No space left on device", "figure")

    monkeypatch.setattr(G, "plot_accuracy" if part == "vision" else "plot_balancedness", full)
    code, err = run(0.05)
    assert code == 2 and len(err) == 1 and "No space left on device" in err[0], err
    assert {k: v for k, v in _tree(out).items() if not k.endswith(".jsonl")} == before  # the earlier set, whole
    assert (out / f"{part}_ft.jsonl").read_text() == "0.0\n0.05\n"
