"""Shortcuts that depend on other libraries' private internals, kept because they measurably pay (README.md)."""
