"""An org's own API rate limits, and a trigger that bumps `config_version` when they change.

The fast path (effects/fastpath.py) keeps the limits in its per-process `OrgConfig`, stamped
with the org's `config_version`; its one statement checks that number, so a node holding old
limits falls back to the pipeline (which reads the org afresh) on the next call. A BEFORE
trigger on the org's own row, so every way the columns change (the API, the admin, SQL) bumps
it. SQLite has no fast path and gets no trigger.
"""

from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION undolog_bump_config_on_rate_limits() RETURNS trigger AS $$
BEGIN
    IF NEW.rate_limit_per_key IS DISTINCT FROM OLD.rate_limit_per_key
       OR NEW.rate_limit_per_org IS DISTINCT FROM OLD.rate_limit_per_org THEN
        NEW.config_version := OLD.config_version + 1;
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER orgs_organization_rate_limits_bump_config BEFORE UPDATE ON orgs_organization
    FOR EACH ROW EXECUTE FUNCTION undolog_bump_config_on_rate_limits();
"""


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS orgs_organization_rate_limits_bump_config ON orgs_organization")
        schema_editor.execute("DROP FUNCTION IF EXISTS undolog_bump_config_on_rate_limits()")


class Migration(migrations.Migration):
    dependencies = [
        ("orgs", "0005_outbox_and_run_idle_timeouts"),
    ]

    operations = [
        migrations.AddField(
            model_name="organization", name="rate_limit_per_key",
            field=models.PositiveIntegerField(
                blank=True, null=True,
                help_text="Requests per minute per API key or person; empty: the server's default.")),
        migrations.AddField(
            model_name="organization", name="rate_limit_per_org",
            field=models.PositiveIntegerField(
                blank=True, null=True,
                help_text="Requests per minute for the whole organization; empty: the server's default.")),
        migrations.RunPython(create_trigger, drop_trigger),
    ]
