"""Warm pools: their registry (registration, placement of their children, status)
and their freeze during every region.
"""
