from rest_framework.routers import SimpleRouter

from lifecycle import api

router = SimpleRouter(trailing_slash=False)
router.register("sessions", api.SessionViewSet, basename="session")
router.register("effects", api.EffectViewSet, basename="effect")
router.register("undo-entries", api.UndoEntryViewSet, basename="undo-entry")

urlpatterns = router.urls
