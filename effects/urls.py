from django.urls import path

from effects import api

# The registry. The runs' routes (sessions, effects, undo entries) are lifecycle/urls.py, included after these.
urlpatterns = [
    path("tools", api.ToolsView.as_view(), name="tools"),
    path("compensations", api.CompensationsView.as_view(), name="compensations"),
]
