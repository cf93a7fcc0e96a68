"""slabtune.tuner"""
