from django.contrib import admin

from ops.models import AuditChain, AuditRecord, Retention


@admin.register(Retention)
class RetentionAdmin(admin.ModelAdmin):
    list_display = ("org", "safe_call_days", "transition_days", "event_days", "session_days", "undo_window_hours")


@admin.register(AuditChain)
class AuditChainAdmin(admin.ModelAdmin):
    list_display = ("org", "seq", "sealed_at", "verified_at", "verified_ok", "broken_seq")
    readonly_fields = [f.name for f in AuditChain._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    """Read-only: a record is evidence; the admin must not be the way to rewrite it."""

    list_display = ("org", "seq", "kind", "occurred", "hash")
    list_filter = ("kind",)
    readonly_fields = [f.name for f in AuditRecord._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
