"""The exclusion constraint of migration 0002 in the model state too (the database has it already), so that the
Allocation model declares every rule the database enforces."""

import django.contrib.postgres.constraints
from django.db import migrations, models

import apps.booking.models


class Migration(migrations.Migration):
    dependencies = [("booking", "0005_gpu_lookup_function")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="allocation",
                    constraint=django.contrib.postgres.constraints.ExclusionConstraint(
                        condition=models.Q(("active", True)),
                        expressions=[("gpu", "="), (apps.booking.models.TsTzRange("start", "end"), "&&")],
                        name="booking_allocation_no_overlap",
                    ),
                )
            ]
        )
    ]
