"""Eager against compiled: the runs, the float64 verdict, bisect (docs/guide/compare.md)."""
