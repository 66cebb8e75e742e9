"""Scaler service: the gateways' demand summed per model and subset, served over KEDA's external-scaler API."""
