"""Tests of libkrex_shim: the gate protocol and the driver interposition."""
