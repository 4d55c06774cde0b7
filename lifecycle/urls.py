from django.urls import path
from rest_framework.routers import SimpleRouter

from lifecycle import api, preimages

router = SimpleRouter(trailing_slash=False)
router.register("sessions", api.SessionViewSet, basename="session")
router.register("effects", api.EffectViewSet, basename="effect")
router.register("undo-entries", api.UndoEntryViewSet, basename="undo-entry")

urlpatterns = [
    path("agents/<slug:name>/rollback", api.AgentRollbackView.as_view(), name="agent-rollback"),
    path("agents/<slug:name>/rollbacks", api.AgentRollbacksView.as_view(), name="agent-rollbacks"),
    path("agents/<slug:name>/rollbacks/<str:rollback_id>", api.AgentRollbackDetailView.as_view(),
         name="agent-rollback-detail"),
    path("effects/<str:pk>/pre-image", preimages.EffectPreImageView.as_view(), name="effect-pre-image"),
    path("effects/<str:pk>/after-image", preimages.EffectAfterImageView.as_view(), name="effect-after-image"),
    *router.urls,
]
