"""Page tests reuse billing's known month (October 2026) for the PDF statements."""

from tests.billing.conftest import _no_live_state, october

__all__ = ["_no_live_state", "october"]
