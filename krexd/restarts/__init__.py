"""Restarts and adoption: the saved state and its files, the state keeper, the
restart marker, adoption, the watchdog, the counters continued across restarts.
"""
