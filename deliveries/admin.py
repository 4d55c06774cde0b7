from django.contrib import admin

from deliveries.models import Delivery, DeliveryAttempt


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    readonly_fields = ["number", "started_at", "duration_ms", "ok", "status_code", "error"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    """Every outgoing call in one list: webhooks' events, executors, escalations, emails.
    Written by the verbs and the worker, never edited by hand."""

    list_display = ["purpose", "kind", "url", "state", "attempts", "last_status_code", "next_attempt_at", "org",
                    "created"]
    list_filter = ["purpose", "state", "kind", "org"]
    search_fields = ["url", "id", "last_error", "kind"]
    readonly_fields = [f.name for f in Delivery._meta.fields]
    inlines = [DeliveryAttemptInline]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
