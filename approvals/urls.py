"""Reviewer API routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from approvals import api, groups_api, rules_api

router = SimpleRouter(trailing_slash=False)
router.register("approvals", api.ApprovalViewSet, basename="approval")
router.register("webhooks", api.WebhookViewSet, basename="webhook")
router.register("rules", rules_api.RuleViewSet, basename="rule")
router.register("grants", api.GrantViewSet, basename="grant")
router.register("reviewer-groups", groups_api.ReviewerGroupViewSet, basename="reviewer-group")

urlpatterns = [
    path("org/settings", api.OrgSettingsView.as_view(), name="org-settings"),
    path("org/slack", api.SlackView.as_view(), name="org-slack"),
    path("org/webhook-secret", api.OrgWebhookSecretView.as_view(), name="org-webhook-secret"),
    path("org/webhook-secret/rotate", api.RotateWebhookSecretView.as_view(), name="org-webhook-secret-rotate"),
    *router.urls,
]
