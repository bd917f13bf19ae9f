"""The worker's OpenMP wait policy defaults (worker_svc/wait_policy.py): set at its
start where the user set none, never over the user's, never after libgomp loaded."""

from __future__ import annotations

import sys

from worker_svc.wait_policy import DEFAULT_POLICY, apply_wait_policy


def test_the_default_is_set_where_the_user_set_none(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # as at a worker's start
    environ: dict[str, str] = {"PATH": "/bin"}
    policy, source = apply_wait_policy(environ)
    assert policy == DEFAULT_POLICY.environment and "default" in source
    assert environ["GOMP_SPINCOUNT"] == DEFAULT_POLICY.environment["GOMP_SPINCOUNT"]


def test_what_the_user_set_is_kept(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    for user in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        environ = dict(user)
        assert apply_wait_policy(environ) == (user, "set by the user")
        assert environ == user


def test_nothing_is_set_once_torch_is_loaded():
    environ: dict[str, str] = {}
    assert apply_wait_policy(environ)[0] == {} and environ == {}
