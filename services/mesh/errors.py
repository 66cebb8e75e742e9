"""The one error type of the mesh renderer: it names the file and the field at fault."""

from __future__ import annotations


class MeshConfigError(ValueError):
    """An `istio/` resource or a topology the local mesh cannot render; the message names file and field."""
