"""Tests and helpers for the fake CUDA driver (tests/fakecuda/README.md)."""
