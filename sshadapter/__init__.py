"""sshadapter: named SSH operations for AI agents, with every result validated."""

from sshadapter.strict_json import StrictJSONError, strict_loads

__version__ = "0.1.0"

__all__ = ["StrictJSONError", "__version__", "strict_loads"]
