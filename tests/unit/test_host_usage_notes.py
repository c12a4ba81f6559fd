"""What an agent logs of a reading's notes: each once, until it goes away, however its
counts change from round to round (`gas.host.usage_watch.fresh_notes`)."""

from __future__ import annotations

from gas.host.usage_watch import fresh_notes

DENIED = "{} process(es) whose open files could not be listed (permission denied): ..."
GONE = "{} process(es) exited or closed a GPU fd while read: their use is what could be read"


def test_a_note_is_said_once_while_its_counts_change() -> None:
    fresh, said = fresh_notes(frozenset(), [DENIED.format(3)])
    assert fresh == [DENIED.format(3)]
    fresh, said = fresh_notes(said, [DENIED.format(4)])
    assert fresh == []
    fresh, said = fresh_notes(said, [DENIED.format(40), GONE.format(1)])
    assert fresh == [GONE.format(1)]


def test_a_note_that_went_away_is_said_again_when_it_comes_back() -> None:
    _, said = fresh_notes(frozenset(), [GONE.format(2)])
    fresh, said = fresh_notes(said, [])
    assert fresh == [] and said == frozenset()
    fresh, _ = fresh_notes(said, [GONE.format(5)])
    assert fresh == [GONE.format(5)]


def test_notes_differing_in_words_are_each_said() -> None:
    fresh, _ = fresh_notes(frozenset(), [DENIED.format(1), GONE.format(1)])
    assert fresh == [DENIED.format(1), GONE.format(1)]
