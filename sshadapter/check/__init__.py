"""``sshadapter check``: every fixture and derived near-miss through the contract, offline.

``report.check_registry`` runs them and ``report.format_table`` prints the
result; ``fixtures`` reads the fixture format, ``nearmiss`` derives the cases.
Reference: docs/fixtures.md. The other offline tool, ``sshadapter inventory import``,
lives with the inventory it writes (``sshadapter.inventory.importer``).
"""
