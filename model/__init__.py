"""slabtune.model"""
