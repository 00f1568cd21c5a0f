"""Tests and helpers for the fake HIP runtime (tests/fakehip/README.md)."""
