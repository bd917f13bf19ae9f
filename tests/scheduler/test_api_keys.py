"""The key check shared by the HTTP and gRPC doors."""

from __future__ import annotations

from scheduler_svc.api.api_keys import MISSING_KEY, WRONG_KEY, ApiKeys


def test_without_keys_everything_is_accepted():
    keys = ApiKeys([])
    assert not keys.required
    assert keys.refusal(None) is None
    assert keys.refusal("Bearer anything") is None


def test_any_configured_key_is_accepted_with_the_bearer_scheme_in_any_case():
    keys = ApiKeys(["first", "second"])
    assert keys.required
    assert keys.refusal("Bearer first") is None
    assert keys.refusal("bearer second") is None
    assert keys.refusal("BEARER  first ") is None


def test_a_missing_key_and_a_wrong_one_are_told_apart():
    keys = ApiKeys(["secret"])
    assert keys.refusal(None) == MISSING_KEY
    assert keys.refusal("") == MISSING_KEY
    assert keys.refusal("secret") == MISSING_KEY  # no scheme
    assert keys.refusal("Basic c2VjcmV0") == MISSING_KEY
    assert keys.refusal("Bearer secre") == WRONG_KEY
    assert keys.refusal("Bearer secret2") == WRONG_KEY
    assert keys.refusal("Bearer ") == WRONG_KEY
