"""TEMPORARY-INTEGRATION: DRF's own content negotiation under the name portal/settings.py still gives.

Delete this module once REST_FRAMEWORK no longer sets DEFAULT_CONTENT_NEGOTIATION_CLASS (DRF's default is this
same class).
"""

from rest_framework.negotiation import DefaultContentNegotiation as ContentNegotiation

__all__ = ["ContentNegotiation"]
