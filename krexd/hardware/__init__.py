"""The host's hardware: GPU inventory (NVIDIA, AMD: KFD, HIP), vendors, MPS, the
driver lock and its ledger, CPU slices and reserved cores.
"""
