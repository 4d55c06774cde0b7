from django.urls import path
from rest_framework.routers import SimpleRouter

from effects import api

router = SimpleRouter(trailing_slash=False)
router.register("sessions", api.SessionViewSet, basename="session")
router.register("effects", api.EffectViewSet, basename="effect")
router.register("undo-entries", api.UndoEntryViewSet, basename="undo-entry")

urlpatterns = [
    path("tools", api.ToolsView.as_view(), name="tools"),
    path("compensations", api.CompensationsView.as_view(), name="compensations"),
    path("agents/<slug:name>/rollback", api.AgentRollbackView.as_view(), name="agent-rollback"),
    *router.urls,
]
