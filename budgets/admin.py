from django.contrib import admin

from budgets.models import BudgetPolicy, DayCounter, PolicyChange, Refusal, RunOutcome


@admin.register(BudgetPolicy)
class BudgetPolicyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "org", "mode", "on_exceeded", "max_irreversible_per_run", "max_cost_per_day",
                    "incident", "updated"]
    list_filter = ["mode", "on_exceeded", "incident", "org"]
    search_fields = ["agent__name", "org__slug"]
    readonly_fields = ["incident_changed_at", "incident_changed_by", "updated", "updated_by"]


@admin.register(DayCounter)
class DayCounterAdmin(admin.ModelAdmin):
    list_display = ["agent", "day", "tool_calls", "irreversible_calls", "cost", "updated"]
    list_filter = ["day", "org"]
    search_fields = ["agent__name"]
    readonly_fields = [f.name for f in DayCounter._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Refusal)
class RefusalAdmin(ReadOnlyAdmin):
    list_display = ["created", "kind", "agent", "tool_name", "limit", "observed", "decided_by"]
    list_filter = ["kind", "observed", "limit", "org"]
    search_fields = ["tool_name", "agent__name", "reason"]


@admin.register(PolicyChange)
class PolicyChangeAdmin(ReadOnlyAdmin):
    list_display = ["created", "org", "agent", "actor", "changes"]
    list_filter = ["org"]


@admin.register(RunOutcome)
class RunOutcomeAdmin(ReadOnlyAdmin):
    list_display = ["created", "session", "action"]
    list_filter = ["action"]
