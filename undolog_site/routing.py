"""Websocket routes; each app that has consumers contributes its own patterns."""

from approvals.routing import websocket_urlpatterns as approvals_patterns

websocket_urlpatterns = [*approvals_patterns]
