"""The dashboard's websocket: one per open page, joined to its org's Channels group.

Events reach the group from `core/fanout.py` as `{"type": "<event kind>", "payload": {...}}`
(after the change committed): every kind in `approvals.models.EVENT_KINDS`, that is every
`Event.record` kind plus `session.updated`. The consumer forwards each to the browser unchanged,
and drops a kind it does not know. It reads the database once, to check the membership in
`connect()`, and never writes to it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from redis.exceptions import RedisError

from approvals.models import EVENT_KINDS
from core.fanout import EVENT_BATCH, SESSION_UPDATES, group_name
from orgs.auth import resolve_membership
from orgs.models import Membership

log = logging.getLogger(__name__)

# Close codes the page's script understands (4000-4999 are the application's).
NOT_LOGGED_IN = 4401
NOT_A_MEMBER = 4403
LAYER_DOWN = 1011  # the server cannot go on: the page reconnects (and fetches what it missed)


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Forwards the org's events to one dashboard page."""

    group: str | None = None

    async def __call__(self, scope, receive, send) -> None:
        """The channel layer's Redis timing out or going away is an outage, not a bug: one log
        line (not a traceback per socket), and the socket is closed so that the page reconnects,
        as it does after any drop, and fetches the pending list it may have missed meanwhile."""
        try:
            await super().__call__(scope, receive, send)
        except (RedisError, OSError) as exc:
            log.warning("dashboard websocket closed: the channel layer's Redis is unreachable (%s: %s); "
                        "the page reconnects", type(exc).__name__, exc)
            with contextlib.suppress(Exception):  # the client may be gone too
                await send({"type": "websocket.close", "code": LAYER_DOWN})

    async def connect(self) -> None:
        """1. Refuse anonymous users (the handshake is closed before it is accepted).
        2. Find the membership: the org named in `?org=`, else the session's chosen org, else the
           user's only org. Not a member of it: refused.
        3. Join only that org's group, accept, and say hello with the org and role.
        """
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=NOT_LOGGED_IN)
            return
        membership = await self._membership(user)
        if membership is None:
            await self.close(code=NOT_A_MEMBER)
            return
        self.group = group_name(membership.org_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "payload": {"org": membership.org.slug, "role": membership.role}})

    @database_sync_to_async
    def _membership(self, user) -> Membership | None:
        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        slug = (query.get("org") or [""])[0] or (self.scope.get("session") or {}).get("org")
        return resolve_membership(user, slug)[0]

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs) -> None:
        # The page only pings, to notice a connection that died without a close frame.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "payload": {}})

    async def dispatch(self, message: dict) -> None:
        """Ignore group messages of a kind this consumer has no handler for (a newer server
        may publish kinds an older one does not know): drop them, keep the socket open."""
        kind = message.get("type", "")
        if not isinstance(kind, str) or (not kind.startswith("websocket.") and kind not in GROUP_KINDS):
            log.debug("dashboard consumer ignores a %r message", kind)
            return
        await super().dispatch(message)

    async def forward(self, message: dict) -> None:
        await self.send_json({"type": message["type"], "payload": message.get("payload") or {}})

    # One handler per event kind (Channels maps "approval.requested" to approval_requested).

    async def approval_requested(self, message: dict) -> None:
        await self.forward(message)

    async def approval_decided(self, message: dict) -> None:
        await self.forward(message)

    async def approval_expired(self, message: dict) -> None:
        await self.forward(message)

    async def approval_extended(self, message: dict) -> None:
        await self.forward(message)

    async def approval_counted(self, message: dict) -> None:
        await self.forward(message)

    async def rule_changed(self, message: dict) -> None:
        await self.forward(message)

    async def rule_observed(self, message: dict) -> None:
        await self.forward(message)

    async def reviewer_group_changed(self, message: dict) -> None:
        await self.forward(message)

    async def compensation_failed(self, message: dict) -> None:
        await self.forward(message)

    async def permission_denied(self, message: dict) -> None:
        await self.forward(message)

    async def budget_exceeded(self, message: dict) -> None:
        await self.forward(message)

    async def agent_suspended(self, message: dict) -> None:
        await self.forward(message)

    async def agent_resumed(self, message: dict) -> None:
        await self.forward(message)

    async def incident_changed(self, message: dict) -> None:
        await self.forward(message)

    async def session_abandoned(self, message: dict) -> None:
        await self.forward(message)

    async def session_updated(self, message: dict) -> None:
        await self.forward(message)

    async def session_updates(self, message: dict) -> None:
        """One window's `session.updated` payloads of this org (core/fanout.py): one frame each,
        as the page knows them."""
        for payload in message.get("payloads") or []:
            await self.send_json({"type": "session.updated", "payload": payload})

    async def event_batch(self, message: dict) -> None:
        """Several events of this org sent together (core.fanout.publish_many): one frame each, as
        if each had come alone, a kind this consumer does not know dropped."""
        for one in message.get("messages") or []:
            if isinstance(one, dict) and one.get("type") in EVENT_HANDLERS:
                await self.forward(one)

    async def grant_issued(self, message: dict) -> None:
        await self.forward(message)

    async def grant_revoked(self, message: dict) -> None:
        await self.forward(message)

    async def policy_changed(self, message: dict) -> None:
        await self.forward(message)

    async def policy_retention_changed(self, message: dict) -> None:
        await self.forward(message)

    async def undo_entry_resolved(self, message: dict) -> None:
        await self.forward(message)

    async def session_compensated(self, message: dict) -> None:
        await self.forward(message)

    async def agent_rolled_back(self, message: dict) -> None:
        await self.forward(message)

    async def session_rewound(self, message: dict) -> None:
        await self.forward(message)


# The kinds forwarded: the server's list (a test checks each has its handler above).
EVENT_HANDLERS = frozenset(EVENT_KINDS)
GROUP_KINDS = EVENT_HANDLERS | {SESSION_UPDATES, EVENT_BATCH}
