"""Manifest validation: kustomize builds of k8s/, istio/ policy, Dockerfiles (no cluster, no Docker)."""
