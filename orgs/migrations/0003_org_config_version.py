"""`Organization.config_version` and the PostgreSQL triggers that bump it.

Triggers, not signals: every way a row can change (the ORM's save, a queryset update, the
admin, raw SQL, a bulk load) bumps the version in the same transaction, so the in-process
caches of the intercept's fast path can never serve a lowered cap or a deleted tool.
SQLite has no fast path and gets no trigger.
"""

from django.db import migrations, models

WATCHED = ["effects_tool", "effects_compensationfunction", "budgets_budgetpolicy"]

CREATE = """
CREATE OR REPLACE FUNCTION undolog_bump_config_version() RETURNS trigger AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE orgs_organization SET config_version = config_version + 1 WHERE id = OLD.org_id;
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.org_id IS DISTINCT FROM OLD.org_id) THEN
        UPDATE orgs_organization SET config_version = config_version + 1 WHERE id = NEW.org_id;
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
"""


def create_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(CREATE)
    for table in WATCHED:
        schema_editor.execute(
            f"CREATE TRIGGER {table}_bumps_config AFTER INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION undolog_bump_config_version()")


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in WATCHED:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_bumps_config ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS undolog_bump_config_version()")


class Migration(migrations.Migration):
    dependencies = [
        ("orgs", "0002_key_rotation"),
        ("effects", "0003_templates_from_results_and_agent_side_undo"),
        ("budgets", "0002_budgets_policies_counters_outcomes"),
    ]

    operations = [
        migrations.AddField(model_name="organization", name="config_version",
                            field=models.BigIntegerField(default=0, editable=False)),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
