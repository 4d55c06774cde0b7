from django.urls import path

from orgs import api

NAME = "<slug:name>"
PREFIX = "<str:prefix>"

# Included before budgets.urls: `agents` (GET there, POST here) is one view, orgs.api.AgentsView.
urlpatterns = [
    path("agents", api.AgentsView.as_view(), name="agents-create"),
    path(f"agents/{NAME}/settings", api.AgentSettingsView.as_view(), name="agent-settings"),
    path(f"agents/{NAME}/keys", api.KeysView.as_view(), name="agent-keys"),
    path(f"agents/{NAME}/keys/{PREFIX}/rotate", api.RotateView.as_view(), name="agent-key-rotate"),
    path(f"agents/{NAME}/keys/{PREFIX}/revoke", api.RevokeView.as_view(), name="agent-key-revoke"),
]
