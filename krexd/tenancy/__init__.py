"""Tenants as records: the registry, their states, quotas, admission slots, memory
records, gate registrations verified, identity rules, flags that pause others.
"""
