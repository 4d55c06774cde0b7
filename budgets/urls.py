from django.urls import path

from budgets import api

NAME = "<slug:name>"
SESSION = "<uuid:pk>"

urlpatterns = [
    path("agents", api.AgentsView.as_view(), name="agents"),
    path(f"agents/{NAME}/budget", api.AgentBudgetView.as_view(), name="agent-budget"),
    path(f"agents/{NAME}/budget/suggest", api.SuggestView.as_view(), name="agent-budget-suggest"),
    path(f"agents/{NAME}/resume", api.ResumeView.as_view(), name="agent-resume"),
    path(f"agents/{NAME}/suspend", api.SuspendView.as_view(), name="agent-suspend"),
    path(f"sessions/{SESSION}/budget", api.SessionBudgetView.as_view(), name="session-budget"),
    path("org/budget", api.OrgBudgetView.as_view(), name="org-budget"),
    path("org/incident", api.IncidentView.as_view(), name="org-incident"),
    path("refusals", api.RefusalsView.as_view(), name="refusals"),
    path("events", api.EventsView.as_view(), name="events"),
]
