from decimal import Decimal

from django.db import migrations, models


class Migration(migrations.Migration):
    """Quota holds count GPUs as fractions (a share or MIG instance is its fraction of a GPU). Existing holds
    counted each device as one GPU: they keep that (gpus = gpu_count), so what they give back when cut or released
    is what they counted."""

    dependencies = [
        ("booking", "0007_reservation_released_reason"),
    ]

    operations = [
        migrations.AddField(
            model_name="quotahold",
            name="gpus",
            field=models.DecimalField(
                decimal_places=6,
                default=Decimal("1"),
                help_text="GPUs counted against the quota: a whole GPU 1, a part its fraction (1g MIG = 1/7)",
                max_digits=10,
            ),
            preserve_default=False,
        ),
        migrations.RunSQL("UPDATE booking_quotahold SET gpus = gpu_count", reverse_sql=migrations.RunSQL.noop),
    ]
