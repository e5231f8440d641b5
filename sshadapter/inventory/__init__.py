"""The fleet: host aliases and groups, and the importer that writes them from other tools.

Reference: docs/operations.md "Inventory" and "Import". ``fleet`` resolves every group to
a closed set at load; ``importer`` writes an inventory file from what Ansible's JSON or
``ssh -G`` say (``sources``). Leaves only: the daemon, the policy and the CLI read it.
"""
