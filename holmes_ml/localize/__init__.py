"""holmes_ml.localize"""
