"""The control plane: the ZeroMQ ROUTER, request lanes, connections (caps, pace,
events, trim), rate limits, Unix sockets, the status report and the metrics endpoint.
"""
