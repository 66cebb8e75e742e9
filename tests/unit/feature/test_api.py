"""services/feature/api.py, the only thing other services import from the feature service: its names are the
client's and the domain types', re-exported as they are."""

from __future__ import annotations

from services.feature import api, client, domain


def test_the_api_re_exports_the_client_and_its_plain_types() -> None:
    assert set(api.__all__) == {"FeatureClient", "FeatureMatrix", "FeatureSetInfo", "FieldValue", "to_row"}
    assert api.FeatureClient is client.FeatureClient and api.to_row is client.to_row
    for name in ("FeatureMatrix", "FeatureSetInfo", "FieldValue"):
        assert getattr(api, name) is getattr(domain, name), name
