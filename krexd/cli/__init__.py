"""The daemon's command-line entry point: ``krexd``."""
