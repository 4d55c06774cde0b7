"""The cleanup agent's ops tools, declared with the SDK: the reference guide's ops server,
plus the two tools the third part needs.

| tool | tier | weight | why |
| --- | --- | --- | --- |
| list_inactive_accounts | SAFE | 0.01 | a read: runs at once, reported later |
| delete_account | IRREVERSIBLE | 5 | a hard delete without backup |
| email_owner | IRREVERSIBLE | 5 | additive, but a sent email cannot be recalled |
| notify_owner | COMPENSABLE | 1 | an in-app notice: `recall_notice` withdraws it |
| export_account | SAFE | 0.01 | a read of the account's data (its service is down) |
| soft_delete_account | COMPENSABLE | 1 | `--rewind`: a soft delete, `restore_account` undoes it |

The accounts live in a JSON file, as in the guide; the notices in an outbox in memory,
which the `recall_notice` webhook (served by this demo, see `Recalls`) empties; a soft-deleted
account stays in the file with `deleted: true` until `restore_account` (the same webhook
server) clears it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from undolog import CompensationDescriptor, ToolTier, undolog_tool

INACTIVE = ("acct-101", "acct-102", "acct-103")
FRESH_ACCOUNTS = {
    "acct-101": {"owner": "ana@example.com", "inactive": True},
    "acct-102": {"owner": "ben@example.com", "inactive": True},
    "acct-103": {"owner": "cho@example.com", "inactive": True},
    "acct-200": {"owner": "dee@example.com", "inactive": False},
    "acct-201": {"owner": "eli@example.com", "inactive": False},
}


class Ops:
    """The world the tools change: accounts.json and the notice outbox."""

    def __init__(self, db: Path, say: Any = print) -> None:
        self.db = db
        self.say = say
        self.outbox: dict[str, dict[str, str]] = {}
        self.lock = threading.Lock()

    def reset(self) -> None:
        """What the guide's reset_db.py does: three inactive and two active accounts."""
        self.db.parent.mkdir(parents=True, exist_ok=True)
        self.db.write_text(json.dumps(FRESH_ACCOUNTS, indent=2))

    def accounts(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.db.read_text())

    def live(self) -> list[str]:
        """The accounts that are neither deleted nor soft-deleted."""
        return sorted(a for a, info in self.accounts().items() if not info.get("deleted"))

    def save(self, accounts: dict[str, dict[str, Any]]) -> None:
        self.db.write_text(json.dumps(accounts, indent=2))


OPS: Ops | None = None


def use(ops: Ops) -> None:
    global OPS
    OPS = ops


def _ops() -> Ops:
    if OPS is None:
        raise RuntimeError("call ops.use(Ops(...)) first")
    return OPS


class ExportServiceDown(Exception):
    """The data-export service did not answer."""


@undolog_tool(tier=ToolTier.SAFE, cost_weight=0.01,
              annotations={"readOnlyHint": True})
def list_inactive_accounts() -> list[str]:
    """IDs of accounts with no login for 12 months."""
    accounts = _ops().accounts()
    return [a for a, info in accounts.items() if info["inactive"] and not info.get("deleted")]


@undolog_tool(tier=ToolTier.IRREVERSIBLE, cost_weight=5.0,
              reason="Permanently deletes an account and its data; there is no backup.",
              risk_tags=["data-loss"], estimated_impact="account {account_id} and all its data",
              annotations={"destructiveHint": True, "idempotentHint": True})
def delete_account(account_id: str) -> str:
    """Permanently delete an account and its data. This cannot be undone."""
    ops = _ops()
    with ops.lock:
        accounts = ops.accounts()
        if accounts.pop(account_id, None) is None:
            return f"{account_id} does not exist"
        ops.save(accounts)
    ops.say(f"  ops: deleted {account_id}")
    return f"deleted {account_id}"


@undolog_tool(tier=ToolTier.IRREVERSIBLE, cost_weight=5.0,
              reason="Emails the account owner; a sent email can't be recalled.",
              risk_tags=["external-message"],
              estimated_impact="an email to the owner of {account_id}",
              annotations={"destructiveHint": False, "openWorldHint": True})
def email_owner(account_id: str, message: str) -> str:
    """Email the account owner. A sent email can't be recalled."""
    _ops().say(f"  ops: emailed the owner of {account_id}")
    return f"email sent to the owner of {account_id}"


@undolog_tool(tier=ToolTier.COMPENSABLE, cost_weight=1.0,
              compensation=CompensationDescriptor.new(
                  "recall_notice", {"account_id": "{account_id}"}, max_retries=3,
                  retry_backoff_ms=200))
def notify_owner(account_id: str, message: str) -> dict[str, str]:
    """Post an in-app notice to the owner. Until it is read it can be recalled."""
    ops = _ops()
    owner = ops.accounts()[account_id]["owner"]
    notice = {"id": f"notice-{account_id}", "to": owner, "message": message}
    with ops.lock:
        ops.outbox[account_id] = notice
    ops.say(f"  ops: notice to {owner} about {account_id} sent")
    return notice


@undolog_tool(tier=ToolTier.SAFE, cost_weight=0.01, annotations={"readOnlyHint": True})
def export_account(account_id: str) -> dict[str, str]:
    """Export an account's data before it is deleted."""
    raise ExportServiceDown(f"export service unavailable (HTTP 503) while exporting {account_id}")


@undolog_tool(tier=ToolTier.COMPENSABLE, cost_weight=1.0,
              compensation=CompensationDescriptor.new(
                  "restore_account", {"account_id": "{account_id}"}, max_retries=3,
                  retry_backoff_ms=200))
def soft_delete_account(account_id: str) -> str:
    """Delete an account softly: it is hidden at once and can be restored."""
    ops = _ops()
    with ops.lock:
        accounts = ops.accounts()
        accounts[account_id]["deleted"] = True
        ops.save(accounts)
    ops.say(f"  ops: soft-deleted {account_id} (restorable)")
    return f"deleted {account_id}"


TOOLS = (list_inactive_accounts, delete_account, email_owner, notify_owner, export_account)
REWIND_TOOLS = (list_inactive_accounts, soft_delete_account, notify_owner, email_owner)


class Recalls:
    """The `recall_notice` and `restore_account` compensations: webhooks served on 127.0.0.1
    by this demo (`/recall` and `/restore`).

    Like a careful receiver (effects/README.md): it verifies `Undolog-Signature` with the
    org's webhook secret, deduplicates by `Idempotency-Key`, and treats "nothing to recall"
    as success.
    """

    def __init__(self, ops: Ops, secret: str) -> None:
        self.ops, self.secret = ops, secret
        self.handled: dict[str, str] = {}
        recalls = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                undo = recalls.restore if self.path.endswith("/restore") else recalls.recall
                status = recalls.handle(raw, self.headers.get("Undolog-Signature", ""),
                                        self.headers.get("Idempotency-Key", ""), undo)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/recall"

    @property
    def restore_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/restore"

    def handle(self, raw: bytes, signature: str, key: str, undo: Any = None) -> int:
        if not verify(self.secret, signature, raw):
            self.ops.say("  undo: bad signature, refused (401)")
            return 401
        account = json.loads(raw)["args"]["account_id"]
        with self.ops.lock:
            if key in self.handled:
                return 200  # a redelivery: already undone
            name, what = (undo or self.recall)(account)
            self.handled[key] = account
        self.ops.say(f"  undo: {name}(account_id={account!r}) -> {what} "
                     f"[signature ok, Idempotency-Key {key[:8]}…]")
        return 200

    def recall(self, account: str) -> tuple[str, str]:
        notice = self.ops.outbox.pop(account, None)
        return "recall_notice", (f"withdrew the notice to {notice['to']}" if notice
                                 else "nothing to recall")

    def restore(self, account: str) -> tuple[str, str]:
        accounts = self.ops.accounts()
        if not accounts.get(account, {}).pop("deleted", False):
            return "restore_account", "nothing to restore"
        self.ops.save(accounts)
        return "restore_account", f"restored {account}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def verify(secret: str, header: str, raw: bytes, tolerance_s: int = 300) -> bool:
    """`Undolog-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t." + body>` (effects/README.md)."""
    fields = dict(part.strip().split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance_s:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()
    # During a rotation's overlap the header carries one v1= per secret: any may be ours.
    candidates = [part.strip()[3:] for part in header.split(",") if part.strip().startswith("v1=")]
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
