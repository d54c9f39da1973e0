"""Helpers the tests share: plain modules, never test modules (a test imports no other)."""
