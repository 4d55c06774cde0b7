from django.contrib import admin

from approvals.models import ApprovalRequest


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin):
    list_display = ["tool_name", "state", "timeout_at", "decided_by_label", "org", "created"]
    list_filter = ["state", "org"]
    readonly_fields = [f.name for f in ApprovalRequest._meta.fields]
