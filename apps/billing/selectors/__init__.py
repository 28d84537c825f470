"""Reads for billing, one module per seam: the calendar (`months`), `pricing`, what is not billed yet
(`unbilled`), telemetry's `utilization`, month-to-date `usage` and budgets, monthly `reports`, the Costs pages'
`charts` and `teams`.

The names other apps and the views use are re-exported here (`selectors.team_month_cost(...)`); modules of this
package import each other directly.
"""

from apps.billing.selectors.charts import burn_down, daily_costs, month_comparison, utilization_heatmap
from apps.billing.selectors.months import (
    ZERO,
    closed_months,
    current_month,
    local_tz,
    month_close_of,
    month_label,
    open_since,
    parse_month,
)
from apps.billing.selectors.pricing import (
    PriceBook,
    estimate_cost,
    list_prices,
    price_at,
    price_book,
    price_points,
    prices_visible_to,
)
from apps.billing.selectors.reports import (
    CSV_ALL_TEAMS,
    CSV_COLUMNS,
    monthly_figures,
    monthly_report,
    report_csv_rows,
    report_figures,
    report_teams_for,
    sum_aggs,
)
from apps.billing.selectors.teams import is_manager_of, notifications_for, team_page_visible, teams_of_user
from apps.billing.selectors.unbilled import (
    OpenAllocation,
    billable_allocations,
    billed_starts,
    teams_with_unbilled_time,
    unbilled_allocations,
    unbilled_pieces,
)
from apps.billing.selectors.usage import (
    HOURS_PLACES,
    UTIL_PLACES,
    Budget,
    MonthUsage,
    rounded_hours,
    source_usage,
    source_utilization,
    team_budget,
    team_month_cost,
    team_month_costs,
    team_month_usage,
    teams_month_usage,
    usage_payload,
    usage_records,
    usage_summary,
)
from apps.billing.selectors.utilization import (
    job_part_utilizations,
    mean_utilizations,
    reservation_part_minutes,
    reservation_part_utilizations,
)

__all__ = [
    "CSV_ALL_TEAMS",
    "CSV_COLUMNS",
    "HOURS_PLACES",
    "UTIL_PLACES",
    "ZERO",
    "Budget",
    "MonthUsage",
    "OpenAllocation",
    "PriceBook",
    "billable_allocations",
    "billed_starts",
    "burn_down",
    "closed_months",
    "current_month",
    "daily_costs",
    "estimate_cost",
    "is_manager_of",
    "job_part_utilizations",
    "list_prices",
    "local_tz",
    "mean_utilizations",
    "month_close_of",
    "month_comparison",
    "month_label",
    "monthly_figures",
    "monthly_report",
    "notifications_for",
    "open_since",
    "parse_month",
    "price_at",
    "price_book",
    "price_points",
    "prices_visible_to",
    "report_csv_rows",
    "report_figures",
    "report_teams_for",
    "reservation_part_minutes",
    "reservation_part_utilizations",
    "rounded_hours",
    "source_usage",
    "source_utilization",
    "sum_aggs",
    "team_budget",
    "team_month_cost",
    "team_month_costs",
    "team_month_usage",
    "team_page_visible",
    "teams_month_usage",
    "teams_of_user",
    "teams_with_unbilled_time",
    "unbilled_allocations",
    "unbilled_pieces",
    "usage_payload",
    "usage_records",
    "usage_summary",
    "utilization_heatmap",
]
