#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from django.conf import settings
    from django.core.management import execute_from_command_line

    if settings.EMBEDDED_DATABASE:
        from portal.embedded_db import EmbeddedDatabaseError, start_for_command

        try:
            start_for_command(settings.VAR_DIR)
        except EmbeddedDatabaseError as exc:
            sys.exit(f"manage.py: {exc}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
