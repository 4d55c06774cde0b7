from django.urls import path
from rest_framework.routers import SimpleRouter

from lifecycle import api

router = SimpleRouter(trailing_slash=False)
router.register("sessions", api.SessionViewSet, basename="session")
router.register("effects", api.EffectViewSet, basename="effect")
router.register("undo-entries", api.UndoEntryViewSet, basename="undo-entry")

urlpatterns = [
    path("agents/<slug:name>/rollback", api.AgentRollbackView.as_view(), name="agent-rollback"),
    path("agents/<slug:name>/rollbacks", api.AgentRollbacksView.as_view(), name="agent-rollbacks"),
    path("agents/<slug:name>/rollbacks/<str:rollback_id>", api.AgentRollbackDetailView.as_view(),
         name="agent-rollback-detail"),
    *router.urls,
]
