"""sshadapter: named SSH operations for AI agents, with every result validated."""

__version__ = "0.1.0"
