"""holmes_ml.models"""
