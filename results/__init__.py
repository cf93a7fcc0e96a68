"""slabtune.results"""
