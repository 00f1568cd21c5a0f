"""Command-line entry points: ``krexd``, ``krex``, ``krexctl``."""
