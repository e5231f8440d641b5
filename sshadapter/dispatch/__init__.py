"""What a dispatch host enforces: its policy, generated here, and the program that enforces it.

``policy`` builds each host's policy from the registry (``sshadapter policy``);
``patterns`` rewrites parameter patterns for the host. ``dispatcher.py`` is
the host's program (``sshadapter-dispatch``: Python 3.9, standard library
only), shipped as a file by ``policy.dispatcher_source()`` and never imported
by the package. Reference: docs/dispatcher.md.
"""
