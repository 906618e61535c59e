"""The Debian ``Packages`` reader (synopsis -> section) on tiny files in apt's formats."""

from __future__ import annotations

import bz2
import gzip
import lzma
import shutil
import subprocess

import numpy as np
import pytest

from ftlab.data.images import DatasetMissing
from ftlab.data.text import load_debian_sections, parse_debian_packages

STANZAS = [
    ("0ad", "Real-time strategy game of ancient warfare", "games"),
    ("curl", "command line tool for transferring data with URL syntax", "web"),
    ("nmap", "The Network Mapper", "net"),
    ("nmap-dbg", "debug symbols", "net"),
    ("foo-dbg", "debug symbols", "devel"),  # the same synopsis under two sections: ambiguous, dropped
    ("zsh", "shell with lots of features", "shells"),
    ("zsh-static", "shell with lots of features", "shells"),  # duplicate synopsis, same section: kept once
    ("steam", "Valve's Steam digital software delivery system", "contrib/games"),
]


def _index(rows=STANZAS) -> str:
    out = []
    for pkg, syn, sec in rows:
        out.append(f"Package: {pkg}\nVersion: 1.0\nDescription: {syn}\nTag: role::program,\n use::gaming\n"
                   f"Section: {sec}\nPriority: optional\n")
    return "\n".join(out)


def _same(a, b) -> bool:
    return (a.packages, a.synopses, a.classes) == (b.packages, b.synopses, b.classes) and np.array_equal(a.labels,
                                                                                                      b.labels)


def test_synopses_sections_duplicates_and_area_prefixes(tmp_path):
    path = tmp_path / "Packages"
    path.write_text(_index())
    d = parse_debian_packages(path)
    assert d.classes == ("games", "net", "shells", "web")
    got = {p: (s, d.classes[c]) for p, s, c in zip(d.packages, d.synopses, d.labels)}
    assert got == {"0ad": (STANZAS[0][1], "games"), "curl": (STANZAS[1][1], "web"), "nmap": (STANZAS[2][1], "net"),
                   "zsh": (STANZAS[5][1], "shells"), "steam": (STANZAS[7][1], "games")}
    assert d.labels.dtype == np.int64
    only = parse_debian_packages(path, sections=("net", "games"))
    assert only.classes == ("games", "net") and set(only.packages) == {"0ad", "nmap", "steam"}


@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".xz", lzma.open), (".bz2", bz2.open)])
def test_compressed_indexes_read_the_same(tmp_path, suffix, opener):
    plain = tmp_path / "Packages"
    plain.write_text(_index())
    packed = tmp_path / f"Packages{suffix}"
    with opener(packed, "wb") as fh:
        fh.write(_index().encode())
    assert _same(parse_debian_packages(packed), parse_debian_packages(plain))


@pytest.mark.skipif(shutil.which("lz4") is None, reason="the lz4 command is not installed")
def test_lz4_index_as_apt_keeps_it(tmp_path):
    plain = tmp_path / "Packages"
    plain.write_text(_index())
    packed = tmp_path / "Packages.lz4"
    subprocess.run(["lz4", "-q", str(plain), str(packed)], check=True)
    assert _same(parse_debian_packages(packed), parse_debian_packages(plain))
    bad = tmp_path / "broken.lz4"
    bad.write_bytes(b"not lz4 at all")
    with pytest.raises(ValueError, match="broken.lz4"):
        parse_debian_packages(bad)


def test_bad_input_gets_one_line(tmp_path):
    path = tmp_path / "Packages"
    path.write_text(_index() + "\nPackage: nosection\nDescription: lacks its section\n")
    with pytest.raises(ValueError, match=r"stanza 9 \('nosection'\) has no Section field"):
        parse_debian_packages(path)
    path.write_text(_index())
    with pytest.raises(ValueError, match="section 'kernel' does not occur"):
        parse_debian_packages(path, sections=("kernel",))
    (tmp_path / "empty").write_text("\n\n")
    with pytest.raises(ValueError, match="no package stanzas"):
        parse_debian_packages(tmp_path / "empty")
    gz = tmp_path / "Packages.gz"
    gz.write_bytes(b"plain text, not gzip")
    with pytest.raises(ValueError, match="not a readable .gz file"):
        parse_debian_packages(gz)
    with pytest.raises(DatasetMissing, match="not found"):
        load_debian_sections(tmp_path / "absent")
