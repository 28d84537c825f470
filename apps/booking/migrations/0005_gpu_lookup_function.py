"""The booking's GPU lookup as a PL/pgSQL function that keeps one generic plan.

Why: PostgreSQL plans a prepared statement anew for every execution (a "custom plan" for the parameter values)
while its estimate for a plan made without the values is the higher one, and for this query (an array of GPU
uuids, a time window, two subqueries) it always was. Planning then cost more than running it: ~170 us of
PostgreSQL's CPU against ~70 us of execution, on every booking request, conflicting ones included (measured:
~260 us per lookup as a statement, ~90 us as this function). Inside a function with
`SET plan_cache_mode = force_generic_plan` the query is planned once per connection and the plan reused; the call
itself is trivial to plan. That plan is index lookups by GPU uuid and by (gpu_id, end), whatever the values.
(The quota lock and the booking's write get generic plans from PostgreSQL on its own: they stay statements.)

The clash lookup also changed shape (same answers): active allocations of one GPU never overlap (the exclusion
constraint of migration 0002), so the ones clashing with [start, end) are those ending inside (start, end] plus
at most the first one ending after `end` (if it starts before `end`); both are short range scans of the
(gpu_id, end) index, where `start < end AND "end" > start` read every later allocation of the GPU. Empty
allocations (start = end) overlap nothing and are skipped where they could hide the one after them.

apps/booking/services/gpus.py calls it. A later change to the query is a new
migration that replaces the function (CREATE OR REPLACE), so every installation runs the same SQL.
"""

from django.db import migrations

GPUS = """
CREATE OR REPLACE FUNCTION portal_booking_gpus(p_uuids text[], p_start timestamptz, p_end timestamptz,
                                               p_limit int)
RETURNS TABLE (id bigint, uuid varchar, idx smallint, node_id bigint, node varchar, node_status varchar,
               status varchar, model_id bigint, model varchar, hourly_price numeric, clashes json,
               maintenance boolean)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
SELECT g.id, g.uuid, g."index", g.node_id, n.name, n.status, g.status, m.id, m.name, m.hourly_price,
       (SELECT json_agg(json_build_array(c.team_id, t.slug, c.start, c."end", c.kind, c.reservation_id, c.job_id,
                                         u.username) ORDER BY c.start)
        FROM (SELECT x.* FROM (
                (SELECT a.team_id, a.user_id, a.start, a."end", a.kind, a.reservation_id, a.job_id
                 FROM booking_allocation a
                 WHERE a.gpu_id = g.id AND a.active AND a."end" > p_start AND a."end" <= p_end
                 ORDER BY a."end" LIMIT p_limit)
                UNION ALL
                (SELECT a.team_id, a.user_id, a.start, a."end", a.kind, a.reservation_id, a.job_id
                 FROM booking_allocation a
                 WHERE a.gpu_id = g.id AND a.active AND a."end" > p_end AND a.start < a."end"
                 ORDER BY a."end" LIMIT 1)
              ) x WHERE x.start < p_end ORDER BY x.start LIMIT p_limit) c
        JOIN accounts_team t ON t.id = c.team_id LEFT JOIN auth_user u ON u.id = c.user_id),
       EXISTS (SELECT 1 FROM booking_maintenancewindow w
               WHERE w.start < p_end AND w."end" > p_start
                 AND (w.gpu_id = g.id OR w.node_id = g.node_id OR (w.gpu_id IS NULL AND w.node_id IS NULL)))
FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id JOIN fleet_gpumodel m ON m.id = g.model_id
WHERE g.uuid = ANY(p_uuids);
END
$fn$
"""

FORWARD = [GPUS]
BACKWARD = ["DROP FUNCTION IF EXISTS portal_booking_gpus(text[], timestamptz, timestamptz, int)"]


class Migration(migrations.Migration):
    dependencies = [("booking", "0004_team_fk_index_covered_by_team_start"), ("fleet", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD, elidable=False)]
