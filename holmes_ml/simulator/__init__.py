"""holmes_ml.simulator"""
