from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    """limit/offset with a ceiling, so one request cannot ask for a million rows."""

    default_limit = 100
    max_limit = 1000
