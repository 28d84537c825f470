"""On PostgreSQL: make overlapping active allocations of one GPU impossible (btree_gist exclusion constraint).

On other databases this migration does nothing: SQLite enforces the same rule with a check inside an IMMEDIATE
transaction (apps.booking.services.allocations_create). The constraint is not in the model state on purpose, so
SQLite can run every migration; its name is `booking_allocation_no_overlap`.
"""

from django.db import migrations

CONSTRAINT = "booking_allocation_no_overlap"

FORWARD = [
    "CREATE EXTENSION IF NOT EXISTS btree_gist",
    f"""ALTER TABLE booking_allocation ADD CONSTRAINT {CONSTRAINT}
        EXCLUDE USING gist (gpu_id WITH =, tstzrange("start", "end", '[)') WITH &&) WHERE (active)""",
]
BACKWARD = [f"ALTER TABLE booking_allocation DROP CONSTRAINT IF EXISTS {CONSTRAINT}"]


def _run(statements: list[str]):
    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        for sql in statements:
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("booking", "0001_initial")]

    operations = [migrations.RunPython(_run(FORWARD), _run(BACKWARD), elidable=False)]
