"""The audit trail and the quarantine: the daemon writes them, ``sshadapter audit`` reads them.

Reference: docs/audit.md. The writer appends hash-chained JSON lines and keeps rejected
bytes; verify and show read the trail (rotated files too) without the daemon. Leaves and
the contract's timestamp only: what a call's records hold is the daemon's (daemon/records.py).
"""
