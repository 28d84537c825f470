"""Job.log_base: where the current log epoch's line 1 is stored (seq = log_base + the agent's line number).

Lines used to be stored one after another whatever number the agent gave them, so for existing jobs the current
epoch began at log_seq - log_agent_seq."""

from django.db import migrations, models
from django.db.models import F


def fill_log_base(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model("jobs", "Job")
    Job.objects.filter(log_seq__gt=F("log_agent_seq")).update(log_base=F("log_seq") - F("log_agent_seq"))


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]

    operations = [
        migrations.AddField(model_name="job", name="log_base", field=models.BigIntegerField(default=0)),
        migrations.RunPython(fill_log_base, migrations.RunPython.noop, elidable=True),
    ]
