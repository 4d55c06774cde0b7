"""Real examples for the OpenAPI schema: the intercept's bodies and answers, a commit, the
budget's refusal (the guide's message, word for word)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample

_EFFECT = {"id": "5b0e5a4e-1d7c-4b8e-9d0e-2f8f3c2f9a11", "session": "0c6f4f7e-8c8a-4a53-9a8e-3a3d2f0d6b21",
           "tool": "send_email", "tier": "compensable", "state": "executing", "step_index": 3,
           "call_signature": "9f2b5c0e" * 8, "args": {"to": "a@x.io", "subject": "hi"}, "result": None,
           "error": None, "created": "2026-01-31T08:00:00+00:00", "updated": "2026-01-31T08:00:00+00:00"}
BUDGET_REFUSAL = OpenApiExample("refused by the budget", status_codes=["429"], response_only=True, value={
    "decision": "refused", "kind": "budget", "limit": "max_irreversible_per_run",
    "message": "Budget limit max_irreversible_per_run reached (limit 2); tool call 'delete_account' was not "
               "executed. Stop calling tools and give your final answer.",
    "limit_value": 2, "current": 2, "refusal": "7d1c9a52-0b7e-4d52-8f11-6a0c2b9e4f30"})
INTERCEPT_EXAMPLES = [
    OpenApiExample("a compensable call", request_only=True, value={
        "tool": "send_email", "args": {"to": "a@x.io", "subject": "hi"}, "step_index": 3,
        "reasoning": "Tell the user their account is inactive.",
        "safe_calls": [{"tool": "list_inactive_accounts", "step_index": 2, "args": {}}]}),
    OpenApiExample("an irreversible call", request_only=True, value={
        "tool": "delete_account", "args": {"account_id": "acct-101"}, "step_index": 4}),
    OpenApiExample("execute", status_codes=["201"], response_only=True, value={
        "decision": "execute", "effect": _EFFECT, "undo_entry": {
            "id": "c3d1b2a0-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "session": _EFFECT["session"], "effect": _EFFECT["id"],
            "step_index": 3, "fn_name": "undo_send_email", "fn_version": "1.0.0", "args": {"to": "a@x.io"},
            "state": "pending", "attempts": 0, "max_retries": 3, "retry_backoff_ms": 1000, "next_attempt_at": None,
            "last_error": None, "last_status_code": None, "resolution_note": None, "resolved_by": None,
            "resolved_at": None, "updated": "2026-01-31T08:00:00+00:00"}}),
    OpenApiExample("await_approval", status_codes=["202"], response_only=True, value={
        "decision": "await_approval",
        "effect": {**_EFFECT, "tool": "delete_account", "tier": "irreversible", "state": "pending",
                   "step_index": 4, "args": {"account_id": "acct-101"}, "executor": False},
        "approval": {"id": "e2a7c9d4-3b1f-4e8a-9c6d-5f0b1a2c3d4e", "state": "pending",
                     "timeout_at": "2026-01-31T08:15:00+00:00"}}),
    OpenApiExample("replay", status_codes=["200"], response_only=True, value={
        "decision": "replay", "effect": {**_EFFECT, "state": "committed", "result": {"message_id": "m-42"}}}),
]
COMMITTED = OpenApiExample("committed", response_only=True, status_codes=["200"], value={
    "effect": {**_EFFECT, "state": "committed", "result": {"message_id": "m-42"}}})
