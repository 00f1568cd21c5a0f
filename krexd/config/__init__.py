"""The configuration: TOML into frozen dataclasses, its value checkers and tables, the slot count.

The lowest room: it imports no other part of krexd.
"""
