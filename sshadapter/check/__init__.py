"""``sshadapter check``: every fixture and derived near-miss through the contract, offline.

``report.check_registry`` runs them and ``report.format_table`` prints the
result; ``fixtures`` reads the fixture format, ``nearmiss`` derives the cases.
Reference: docs/fixtures.md. ``importer`` and ``import_sources`` are the other offline tool,
``sshadapter inventory import`` (docs/operations.md "Import").
"""
