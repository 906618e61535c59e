"""The WordNet data.noun parser on a tiny file in the real wndb(5WN) format."""

import numpy as np
import pytest

from ftlab.data import DatasetMissing
from ftlab.data.text import NOUN_SUPERSENSES, load_wordnet_supersenses, parse_wordnet_data

TINY = (
    "  1 This software and database is being provided to you, the LICENSEE, by  \n"
    "  2 Princeton University under the following license.  \n"
    "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n 0000 ~ 04424418 n 0000 | that which is "
    "perceived or known or inferred to have its own distinct existence (living or nonliving)  \n"
    "01317541 05 n 02 domestic_animal 0 domesticated_animal 0 003 @ 00015388 n 0000 ~ 01320693 n 0000 "
    "~ 02084071 n 0000 | any of various animals that have been tamed and made fit for a human environment  \n"
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 001 @ 01317541 n 0000 | a member of the genus "
    "Canis; \"the dog barked all night\"  \n"
    "02958343 06 n 0b car 0 auto 0 automobile 0 machine 0 motorcar 0 a 0 b 0 c 0 d 0 e 0 f 0 000 | "
    "a motor vehicle with four wheels; \"he needs a car to get to work\"  \n"
)


def test_parse_tiny_file(tmp_path):
    p = tmp_path / "data.noun"
    p.write_text(TINY)
    wn = parse_wordnet_data(p)
    assert wn.offsets == ("00001740", "01317541", "02084071", "02958343")
    assert wn.lemmas == ("entity", "domestic animal", "dog", "car")
    assert wn.classes == ("noun.Tops", "noun.animal", "noun.artifact")
    np.testing.assert_array_equal(wn.labels, [0, 1, 1, 2])
    # examples in quotes are removed, the definition is kept whole
    assert wn.glosses[2] == "a member of the genus Canis"
    assert wn.glosses[3] == "a motor vehicle with four wheels"
    assert wn.glosses[0].endswith("(living or nonliving)")


def test_malformed_line_names_it(tmp_path):
    p = tmp_path / "data.noun"
    p.write_text(TINY + "garbage line without gloss\n")
    with pytest.raises(ValueError, match=r"data.noun:7"):
        parse_wordnet_data(p)


def test_non_noun_lexfile_rejected(tmp_path):
    p = tmp_path / "data.noun"
    p.write_text("00001740 31 n 01 entity 0 000 | something  \n")
    with pytest.raises(ValueError, match="lex_filenum=31"):
        parse_wordnet_data(p)


def test_missing_file_names_package(tmp_path):
    with pytest.raises(DatasetMissing, match="wordnet-base"):
        load_wordnet_supersenses(tmp_path / "nope")


def test_supersense_inventory():
    assert len(NOUN_SUPERSENSES) == 26 and min(NOUN_SUPERSENSES) == 3 and max(NOUN_SUPERSENSES) == 28
