from __future__ import annotations

import asyncio
import inspect

import pytest

from undolog import CompensationDescriptor, ToolTier, spec_of, undolog_tool
from undolog.decorator import declared_tool


def undo_email() -> CompensationDescriptor:
    return CompensationDescriptor.new("undo_send_email", {"to": "{to}"})


def test_it_rejects_compensable_without_compensation() -> None:
    with pytest.raises(ValueError, match="CompensationDescriptor"):
        @undolog_tool(tier=ToolTier.COMPENSABLE)
        def send_email(to: str) -> None: ...


@pytest.mark.parametrize("reason", [None, "", "   "])
def test_it_rejects_irreversible_without_reason(reason: str | None) -> None:
    with pytest.raises(ValueError, match="reason"):
        @undolog_tool(tier=ToolTier.IRREVERSIBLE, reason=reason)
        def delete_database(db_name: str) -> None: ...


@pytest.mark.parametrize("options", [
    {"tier": "safe", "compensation": CompensationDescriptor.new("undo")},
    {"tier": "irreversible", "reason": "x", "compensation": CompensationDescriptor.new("undo")},
    {"tier": "safe", "reason": "nothing to approve"},
    {"tier": "compensable", "compensation": CompensationDescriptor.new("undo"),
     "risk_tags": ["data-loss"]},
    {"tier": "safe", "irreversible": True},
    {"tier": "irreversible", "reason": "x", "irreversible": False},
    {"tier": "safe", "cost_weight": -1},
    {"tier": "compensable", "compensation": CompensationDescriptor.new("undo", {"to": "{too}"})},
    {"tier": "irreversible", "reason": "x", "estimated_impact": "drops {database}"},
    {"tier": "bogus"},
])
def test_it_rejects_inconsistent_declarations(options: dict) -> None:
    with pytest.raises(ValueError):
        undolog_tool(tier=options.pop("tier"), **options)(lambda to, db_name=None: None)


def test_it_rejects_a_compensation_version_that_is_not_semver() -> None:
    with pytest.raises(ValueError, match="semver"):
        CompensationDescriptor.new("undo_send_email", fn_version="1.0")


def test_compensation_defaults_follow_the_reference() -> None:
    descriptor = CompensationDescriptor.new("undo_send_email", {"to": "{to}"})
    assert descriptor.to_dict() == {"fn_name": "undo_send_email", "fn_version": "1.0.0",
                                    "args": {"to": "{to}"}, "max_retries": 3,
                                    "retry_backoff_ms": 1000}


def test_it_keeps_name_docstring_and_signature_of_sync_and_async_functions() -> None:
    @undolog_tool(tier=ToolTier.SAFE)
    async def search_web(query: str, limit: int = 10) -> str:
        """Search the web."""
        return query

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=undo_email())
    def send_email(to: str, subject: str) -> dict:
        """Send an email."""
        return {}

    assert search_web.__name__ == "search_web" and search_web.__doc__ == "Search the web."
    # Annotations are strings here (this module uses `from __future__ import annotations`).
    assert str(inspect.signature(search_web)) == "(query: 'str', limit: 'int' = 10) -> 'str'"
    assert inspect.iscoroutinefunction(search_web)
    assert send_email.__name__ == "send_email" and send_email.__doc__ == "Send an email."
    assert inspect.signature(send_email) == inspect.signature(send_email.__wrapped__)
    assert list(inspect.signature(send_email).parameters) == ["to", "subject"]
    assert not inspect.iscoroutinefunction(send_email)


def test_outside_a_session_a_tool_is_the_plain_function() -> None:
    @undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Deletes the database for good")
    async def delete_database(db_name: str) -> dict:
        return {"dropped": db_name}

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=undo_email())
    def send_email(to: str) -> str:
        return f"sent to {to}"

    assert asyncio.run(delete_database("prod")) == {"dropped": "prod"}
    assert send_email("a@x.io") == "sent to a@x.io"


def test_it_binds_positional_keyword_and_default_arguments_by_name() -> None:
    @undolog_tool(tier=ToolTier.SAFE)
    def read(path: str, encoding: str = "utf-8", *, limit: int = 5) -> None: ...

    tool = declared_tool(read)
    assert tool.bind(("a.txt",), {}) == {"path": "a.txt", "encoding": "utf-8", "limit": 5}
    assert tool.bind(("a.txt", "latin-1"), {"limit": 1}) == {
        "path": "a.txt", "encoding": "latin-1", "limit": 1}
    with pytest.raises(TypeError):
        tool.bind((), {})


def test_it_drops_self_and_flattens_extra_keyword_arguments() -> None:
    class Mailer:
        @undolog_tool(tier=ToolTier.SAFE)
        def lookup(self, who: str, **filters: str) -> None: ...

    tool = declared_tool(Mailer.lookup)
    assert tool.bind((Mailer(), "bob"), {"team": "ops"}) == {"who": "bob", "team": "ops"}


def test_spec_is_the_registration_body_of_the_contract() -> None:
    @undolog_tool(tier=ToolTier.SAFE, cost_weight=0.01, description="")
    def list_inactive_accounts() -> list[str]: ...

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=undo_email(), description="")
    async def send_email(to: str, subject: str) -> dict: ...

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Deletes an account for good",
                  risk_tags=["data-loss"], estimated_impact="account {account_id} and its data",
                  approval_timeout_s=900, auto_approve_on_timeout=False, cost_weight=5.0,
                  annotations={"destructiveHint": True}, description="")
    async def delete_account(account_id: str) -> dict: ...

    assert [spec_of(t).to_dict() for t in (list_inactive_accounts, send_email, delete_account)] == [
        {"name": "list_inactive_accounts", "tier": "safe", "cost_weight": 0.01},
        {"name": "send_email", "tier": "compensable", "cost_weight": 1.0,
         "compensation": {"fn_name": "undo_send_email", "fn_version": "1.0.0",
                          "args": {"to": "{to}"}, "max_retries": 3, "retry_backoff_ms": 1000}},
        {"name": "delete_account", "tier": "irreversible", "cost_weight": 5.0,
         "approval": {"reason": "Deletes an account for good", "risk_tags": ["data-loss"],
                      "estimated_impact": "account {account_id} and its data",
                      "timeout_s": 900, "auto_approve_on_timeout": False},
         "annotations": {"destructiveHint": True}},
    ]


def test_spec_takes_description_irreversible_flag_and_mcp_style_annotations() -> None:
    class Hints:  # shaped like mcp 2.x ToolAnnotations (snake_case attributes)
        read_only_hint = None
        destructive_hint = False
        idempotent_hint = None
        open_world_hint = True
        title = "Transfer"

    @undolog_tool(tier="compensable", irreversible=True, annotations=Hints(),
                  compensation=CompensationDescriptor.new("refund", {"amount": "{amount}"}))
    def transfer_funds(amount: int) -> dict:
        """Move money.

        Details nobody needs in the registry."""
        return {}

    body = spec_of(transfer_funds).to_dict()
    assert body["description"] == "Move money."
    assert body["irreversible"] is True
    assert body["annotations"] == {"destructiveHint": False, "openWorldHint": True,
                                   "title": "Transfer"}


@pytest.mark.parametrize(("args", "kwargs"), [
    ((), {"a": 1}), ((1,), {}), ((1, 2), {}), ((1,), {"b": 3, "c": 4}), ((), {"c": 0, "a": 9}),
    ((1, 2, 3), {}), ((), {}), ((1,), {"a": 2}), ((1,), {"zzz": 2}), ((), {"b": 1}),
])
def test_the_fast_binder_agrees_with_signature_bind(args: tuple, kwargs: dict) -> None:
    def plain(a: int, b: int = 2, *, c: int = 3) -> None: ...

    tool = declared_tool(undolog_tool(plain, tier="safe"))
    try:
        expected = tool._bind_slowly(args, kwargs)
    except TypeError:
        with pytest.raises(TypeError):
            tool.bind(args, kwargs)
        return
    assert tool.bind(args, kwargs) == expected
