"""Rewriting: patterns, the rewrite engine and its strategies, and the rule sets as data.

Empty until the rewrite-engine issue lands; the package exists so the layout of DESIGN.md holds.
"""
