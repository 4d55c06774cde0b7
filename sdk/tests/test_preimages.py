"""The compare-and-restore of one claimed entry, race by race (undolog.preimages), and the body
a before read sends: no server needed, the decisions are the agent side's."""

from __future__ import annotations

import pytest

from undolog import ToolTier, undolog_tool
from undolog.compensations import PermanentCompensationError
from undolog.preimages import ABSENT, AfterUnknown, PreImage, compare_and_restore, digest, render

STORE: dict[str, str] = {}
DONE: list[str] = []


def read(args):
    return {"content": STORE[args["path"]]} if args["path"] in STORE else ABSENT


def restore(args, before):
    DONE.append("restore")
    STORE[args["path"]] = before["content"]


def remove(args):
    DONE.append("remove")
    STORE.pop(args["path"], None)


PRE = PreImage(
    read=read,
    restore=restore,
    restore_absent=remove,
    after=lambda args, before: {"content": args["content"]},
)


@pytest.fixture(autouse=True)
def _clean():
    STORE.clear()
    DONE.clear()


def kept(before, wrote, *, absent=False, after=True):
    return {
        "value": before,
        "absent": absent,
        "before_digest": digest(None if absent else before),
        "after_digest": digest({"content": wrote}) if after else None,
        "call_args": {"path": "f", "content": wrote},
    }


def test_what_this_run_wrote_is_restored():
    STORE["f"] = "mine"
    assert compare_and_restore(PRE, kept({"content": "old"}, "mine")) == "restored"
    assert STORE["f"] == "old"


def test_a_target_changed_since_is_left_to_a_person_with_both_digests():
    STORE["f"] = "theirs"
    with pytest.raises(PermanentCompensationError) as raised:
        compare_and_restore(PRE, kept({"content": "old"}, "mine"))
    assert digest({"content": "mine"}) in str(raised.value) and digest(
        {"content": "theirs"}
    ) in str(raised.value)
    assert STORE["f"] == "theirs" and DONE == []


def test_a_crash_before_the_call_leaves_nothing_to_do():
    STORE["f"] = "old"  # the call never ran
    assert (
        compare_and_restore(PRE, kept({"content": "old"}, "mine"))
        == "already as it was before the call"
    )
    assert DONE == []


def test_without_an_after_image_the_entry_still_restores():
    STORE["f"] = "edited somehow"  # the call's outcome is unknown
    assert compare_and_restore(PRE, kept({"content": "old"}, "mine", after=False)) == "restored"
    assert STORE["f"] == "old"


def test_a_created_target_is_removed_and_a_second_run_of_the_entry_does_nothing():
    STORE["f"] = "new"
    entry = kept(None, "new", absent=True)
    assert compare_and_restore(PRE, entry) == "removed what the call created"
    assert "f" not in STORE
    assert (
        compare_and_restore(PRE, entry) == "already as it was before the call"
    )  # a lost report, run again
    assert DONE == ["remove"]


def test_two_runs_on_one_file_each_restores_only_over_its_own_write():
    STORE["f"] = "b"
    first, second = kept({"content": "orig"}, "a"), kept({"content": "a"}, "b")
    with pytest.raises(PermanentCompensationError):  # A alone: the file is B's now
        compare_and_restore(PRE, first)
    assert compare_and_restore(PRE, second) == "restored"  # B first, then A
    assert compare_and_restore(PRE, first) == "restored"
    assert STORE["f"] == "orig"


def test_a_move_whose_destination_holds_what_the_source_held_is_moved_back():
    moved = []
    pre = PreImage(
        read=lambda a: {"content": "x"},
        check=lambda a: {"content": "x"},
        restore=lambda a, before: moved.append(a),
        after=lambda a, before: before,
    )
    entry = {
        "value": {"content": "x"},
        "absent": False,
        "before_digest": digest({"content": "x"}),
        "after_digest": digest({"content": "x"}),
        "call_args": {"source": "s", "destination": "d"},
    }
    assert compare_and_restore(pre, entry) == "restored" and moved


def test_a_dropped_pre_image_goes_to_a_person_and_none_kept_is_nothing_to_do():
    with pytest.raises(PermanentCompensationError, match="dropped"):
        compare_and_restore(PRE, {"dropped": True, "before_digest": "sha256:x"})
    assert compare_and_restore(PRE, None) == "nothing kept: the call never ran"


def test_the_body_sends_the_value_or_only_its_size_when_it_must_be_refused():
    small = PreImage(read=read, restore=restore, max_bytes=10, over_bound="refuse")
    assert small.body({}, {"content": "x" * 50}) == {"size": 64, "over_bound": True}
    held = PreImage(read=read, restore=restore, max_bytes=10)
    assert held.body({}, {"content": "x"})["value"] == {
        "content": "x"
    }  # hold: sent, the server holds
    assert PRE.body({"content": "n"}, ABSENT) == {
        "value": None,
        "absent": True,
        "after_digest": digest({"content": "n"}),
    }


def test_an_after_function_that_cannot_say_leaves_the_after_image_to_a_read_after_the_call():
    def unsure(args, before):
        raise AfterUnknown("cannot tell")

    pre = PreImage(read=read, restore=restore, after=unsure)
    body = pre.body({"content": "n"}, {"content": "old"})
    assert body == {"value": {"content": "old"}, "absent": False} and pre.reads_after(body)
    assert not PRE.reads_after(PRE.body({"content": "n"}, {"content": "old"}))


def test_every_preset_tool_works_out_its_after_image_before_the_call():
    """One SAFE read a call: the presets' after-images come with their pre-images."""
    from undolog.gateway.preimages import PRESETS, build

    async def never(tool, args):
        raise AssertionError("no upstream call")

    graph = {
        "entities": [{"name": "A", "entityType": "person", "observations": ["x"]}],
        "relations": [],
    }
    states = {"filesystem": {"content": "old text\n"}, "memory": graph}
    args = {
        "path": "/w/a",
        "content": "x",
        "source": "/w/a",
        "destination": "/w/b",
        "edits": [{"oldText": "old", "newText": "new"}],
        "entities": [{"name": "B", "entityType": "person", "observations": []}],
        "observations": [{"entityName": "A", "contents": ["y"]}],
        "deletions": [{"entityName": "A", "observations": ["x"]}],
        "entityNames": ["A"],
        "relations": [{"from": "A", "to": "B", "relationType": "knows"}],
    }
    for preset, tools in PRESETS.items():
        for name, declaration in tools.items():
            pre = build(declaration, never, never)
            assert not pre.reads_after(pre.body(args, states[preset])), f"{preset}.{name}"


def test_digests_are_of_canonical_json():
    assert digest({"b": 1, "a": "é"}) == digest({"a": "é", "b": 1})
    assert digest(ABSENT) == digest(None)


def test_render_keeps_types_and_maps_lists():
    args = {"path": "p", "entities": [{"name": "A"}, {"name": "B"}], "before": {"content": "c"}}
    assert render({"names": "{entities[*].name}", "content": "{before.content}", "n": 3}, args) == {
        "names": ["A", "B"],
        "content": "c",
        "n": 3,
    }


def test_the_decorator_declares_the_pre_image_and_its_restore_function():
    @undolog_tool(
        tier=ToolTier.COMPENSABLE, before=lambda path: None, restore=lambda path, before: None
    )
    def write(path: str, content: str) -> None: ...

    body = write.undolog_spec.to_dict()
    assert body["compensation"]["fn_name"] == "preimage.write"
    assert set(body["pre_image"]) >= {"before", "restore", "max_bytes", "over_bound"}
    with pytest.raises(ValueError):
        undolog_tool(tier=ToolTier.COMPENSABLE, restore=lambda: None)(lambda: None)
    with pytest.raises(ValueError):
        undolog_tool(tier=ToolTier.SAFE, before=lambda: None, restore=lambda: None)(lambda: None)
