"""Make overlapping active allocations of one GPU impossible (btree_gist exclusion constraint
`booking_allocation_no_overlap`). The writers check first under the GPUs' advisory locks
(apps.booking.services.allocations) and report what clashes; the constraint is the guard behind them.
"""

from django.db import migrations

CONSTRAINT = "booking_allocation_no_overlap"

FORWARD = [
    "CREATE EXTENSION IF NOT EXISTS btree_gist",
    f"""ALTER TABLE booking_allocation ADD CONSTRAINT {CONSTRAINT}
        EXCLUDE USING gist (gpu_id WITH =, tstzrange("start", "end", '[)') WITH &&) WHERE (active)""",
]
BACKWARD = [f"ALTER TABLE booking_allocation DROP CONSTRAINT IF EXISTS {CONSTRAINT}"]


class Migration(migrations.Migration):
    dependencies = [("booking", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD, elidable=False)]
