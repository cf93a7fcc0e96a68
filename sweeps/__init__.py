"""slabtune.sweeps"""
