from django.contrib import admin

from approvals.models import ApprovalRequest, OrgWebhook


class ReadOnlyAdmin(admin.ModelAdmin):
    """History is written by the verbs and the worker, never edited by hand."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["tool_name", "state", "timeout_at", "decided_by_label", "org", "created"]
    list_filter = ["state", "org"]
    search_fields = ["tool_name", "decided_by_label", "id"]
    readonly_fields = [f.name for f in ApprovalRequest._meta.fields]


@admin.register(OrgWebhook)
class OrgWebhookAdmin(admin.ModelAdmin):
    list_display = ["url", "org", "event_types", "slack", "active", "created"]
    list_filter = ["active", "slack", "org"]
    search_fields = ["url", "description", "org__slug"]
