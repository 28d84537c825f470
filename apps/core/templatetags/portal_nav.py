"""`{% nav_link "app:index" "Label" "namespace" %}`: a navigation link, or a disabled label while the section's
app is not installed yet (so the layout stays stable as apps are added)."""

from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

register = template.Library()


@register.simple_tag(takes_context=True)
def nav_link(context: template.Context, url_name: str, label: str, section: str) -> str:
    try:
        url = reverse(url_name)
    except NoReverseMatch:
        return format_html('<span class="nav-disabled" title="Not available yet">{}</span>', label)
    active = "active" if context.get("nav_section") == section else ""
    return format_html('<a href="{}" class="{}">{}</a>', url, active, label)
