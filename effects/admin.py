from django.contrib import admin

from effects.models import CompensationFunction, Effect, EffectTransition, Session, Tool, UndoEntry


@admin.register(CompensationFunction)
class CompensationFunctionAdmin(admin.ModelAdmin):
    list_display = ["fn_name", "fn_version", "handler", "target", "timeout_ms", "org"]
    list_filter = ["handler", "org"]
    search_fields = ["fn_name", "target"]


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ["name", "tier", "cost_weight", "irreversible", "compensation_fn", "org"]
    list_filter = ["tier", "irreversible", "org"]
    search_fields = ["name", "description"]
    autocomplete_fields = ["compensation_fn"]


class EffectTransitionInline(admin.TabularInline):
    model = EffectTransition
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "actor", "reason", "created"]


@admin.register(Effect)
class EffectAdmin(admin.ModelAdmin):
    list_display = ["tool_name", "tier", "state", "step_index", "session", "created"]
    list_filter = ["state", "tier"]
    search_fields = ["tool_name", "call_signature"]
    readonly_fields = [f.name for f in Effect._meta.fields]
    inlines = [EffectTransitionInline]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["id", "agent", "state", "step_index", "created"]
    list_filter = ["state"]
    readonly_fields = ["org", "agent", "step_index", "tool_calls", "irreversible_calls", "cost", "created"]


@admin.register(UndoEntry)
class UndoEntryAdmin(admin.ModelAdmin):
    list_display = ["fn_name", "fn_version", "state", "attempts", "step_index", "session"]
    list_filter = ["state"]
    readonly_fields = [f.name for f in UndoEntry._meta.fields]
