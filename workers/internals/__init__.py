"""Code that relies on private internals of Celery and kombu, kept because it pays (bench/internals_workers.py).

Each module is one piece; README.md lists, per piece, the upstream internals it depends on and the test that fails
when an upgrade changes them. Nothing outside this package reaches into those libraries' private names. No Django
here: the node agent imports these too.
"""
