"""``python -m sshadapter.cli``: the console script ``sshadapter``."""

import sys

from sshadapter.cli import main

sys.exit(main())
