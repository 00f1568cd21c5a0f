"""GPU memory in krexd: one part per role, each handed only to the callers that use it.

The parts (one line each in docs/design/architecture.md's module map) are
built by ``krexd.assembly`` in dependency order; the decisions are in
docs/design/memory.md.  The package itself imports nothing, so importing
one part pulls in no other.
"""
