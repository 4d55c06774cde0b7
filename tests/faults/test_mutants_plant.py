"""Every deliberate bug of `make nemesis-mutants` (tests/faults/mutants/) still plants in this tree:
its files exist and each `find:` occurs exactly once. A move or an edit that leaves one stale fails
here, with the suite, instead of hours later in the mutants' run (`mutate.py --check`)."""

from __future__ import annotations

import pytest

from tests.faults import mutate

MUTANTS = sorted(mutate.MUTANTS.glob("*.txt"))


def test_there_are_mutants_to_check():
    assert len(MUTANTS) >= 11


@pytest.mark.parametrize("path", MUTANTS, ids=[path.stem for path in MUTANTS])
def test_it_plants_each_mutant_in_this_tree(path):
    bug, edits = mutate.parse(path)
    assert bug and edits
    changed = mutate.planted(mutate.ROOT, edits)
    assert all(changed[file] != (mutate.ROOT / file).read_text() for file in changed)
