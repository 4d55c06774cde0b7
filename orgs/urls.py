from django.urls import path

from orgs import api

NAME = "<slug:name>"
PREFIX = "<str:prefix>"

# `agents` itself (GET, and POST to create one) is budgets.api.AgentsView: a new agent's body
# carries its budget, and tenancy sits below budgets.
urlpatterns = [
    path(f"agents/{NAME}/settings", api.AgentSettingsView.as_view(), name="agent-settings"),
    path(f"agents/{NAME}/keys", api.KeysView.as_view(), name="agent-keys"),
    path(f"agents/{NAME}/keys/{PREFIX}/rotate", api.RotateView.as_view(), name="agent-key-rotate"),
    path(f"agents/{NAME}/keys/{PREFIX}/revoke", api.RevokeView.as_view(), name="agent-key-revoke"),
]
