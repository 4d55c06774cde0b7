# The run's pre-image bytes as a counter on its row (a guarded update keeps the run's bound under
# concurrency), filled from the pre-images runs keep already.

from django.db import migrations, models
from django.db.models import OuterRef, Subquery, Sum


def fill(apps, schema_editor):
    Session = apps.get_model("effects", "Session")
    PreImage = apps.get_model("effects", "PreImage")
    kept = PreImage.objects.filter(dropped_at__isnull=True)
    total = (kept.filter(session=OuterRef("pk")).order_by().values("session")
             .annotate(n=Sum("size")).values("n"))
    Session.objects.filter(pk__in=kept.values("session")).update(pre_image_bytes=Subquery(total))


class Migration(migrations.Migration):

    dependencies = [
        ('effects', '0020_tool_asked'),
    ]

    operations = [
        migrations.AddField(
            model_name='session',
            name='pre_image_bytes',
            field=models.BigIntegerField(default=0, editable=False, help_text='Bytes of the pre-images this run keeps.'),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
