"""The tools an agent under test declares with the SDK: the reference guide's account cleanup.

No Django here: the crashing agent (`crashing_agent.py`) imports this module in a process
of its own. Every tool that changes something appends to `RAN` (and, when `SIDE_EFFECTS`
names a file, writes a line there), so a test can tell what really ran, across processes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from undolog import CompensationDescriptor, ToolTier, undolog_tool

RAN: list[str] = []
_lock = threading.Lock()


def did(what: str) -> None:
    with _lock:
        RAN.append(what)
        path = os.environ.get("SIDE_EFFECTS")
        if path:
            with Path(path).open("a") as out:
                out.write(what + "\n")


@undolog_tool(tier=ToolTier.SAFE, cost_weight=0.01)
def list_inactive_accounts() -> list[str]:
    """IDs of accounts with no login for 12 months."""
    return ["acct-101", "acct-102", "acct-103"]


@undolog_tool(tier=ToolTier.COMPENSABLE,
              compensation=CompensationDescriptor.new("undo_send_email", {"to": "{to}"},
                                                      max_retries=2, retry_backoff_ms=100))
def send_email(to: str, subject: str = "Your account") -> dict:
    """Send an email (undone by a follow-up that retracts it)."""
    if to.startswith("bounce"):
        raise RuntimeError(f"mailbox of {to} is full")
    did(f"send_email {to}")
    return {"message_id": f"<{to}>", "subject": subject}


@undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Deletes an account for good",
              risk_tags=["data-loss"], estimated_impact="account {account_id} and its data",
              cost_weight=5.0, annotations={"destructiveHint": True, "idempotentHint": True})
def delete_account(account_id: str) -> str:
    """Permanently delete an account and its data."""
    did(f"delete_account {account_id}")
    return f"deleted {account_id}"


@undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Deletes an account for good",
              risk_tags=["data-loss"], cost_weight=5.0)
async def adelete_account(account_id: str) -> str:
    """The async twin of delete_account."""
    did(f"adelete_account {account_id}")
    return f"deleted {account_id}"


@undolog_tool(tier=ToolTier.IRREVERSIBLE, reason="Purges the backups of an account",
              approval_timeout_s=1, auto_approve_on_timeout=False)
def purge_backups(account_id: str) -> str:
    """Purge backups; nobody has long to object (a 1 s deadline)."""
    did(f"purge_backups {account_id}")
    return f"purged {account_id}"


TOOLS = (list_inactive_accounts, send_email, delete_account, adelete_account, purge_backups)
