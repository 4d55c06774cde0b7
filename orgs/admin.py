from django.contrib import admin

from orgs.models import Agent, AgentKey, Event, Membership, Organization


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "time_zone", "approval_timeout_s", "auto_approve_on_timeout", "context_window"]
    search_fields = ["slug", "name"]
    fieldsets = [
        (None, {"fields": ["name", "slug", "time_zone"]}),
        ("Approvals", {"fields": ["approval_timeout_s", "auto_approve_on_timeout", "context_window",
                                  "email_notifications"]}),
        ("Webhooks", {"fields": ["webhook_secret"]}),
        ("Rate limits", {"fields": ["rate_limit_per_key", "rate_limit_per_org"]}),
    ]
    inlines = [MembershipInline]


class AgentKeyInline(admin.TabularInline):
    model = AgentKey
    extra = 0
    fields = ["name", "prefix", "created", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created", "last_used_at"]


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["name", "org", "state", "suspend_reason", "created"]
    list_filter = ["state", "org"]
    search_fields = ["name", "org__slug"]
    inlines = [AgentKeyInline]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["created", "kind", "org", "agent", "session_id"]
    list_filter = ["kind", "org"]
    readonly_fields = ["org", "kind", "agent", "session_id", "data", "created"]

    # Append-only, as the README says: the audit chain (ops/audit.py) seals events in order, and
    # only retention (ops/retention.py) deletes them, after archiving and sealing.
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
