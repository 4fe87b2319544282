"""The adapters' "warn once": keyed by the condition, not the message, and bounded."""

from __future__ import annotations

import logging

from tunecache.integrations import _common


def test_a_condition_recurring_with_new_details_is_said_once(caplog):
    caplog.set_level(logging.DEBUG, logger="tunecache")
    for i in range(50):
        _common.warn_once("test recurring", f"tunecache: failure number {i}")
    said = [r for r in caplog.records if "failure number" in r.getMessage() and r.levelno == logging.WARNING]
    assert [r.getMessage() for r in said] == ["tunecache: failure number 0"]


def test_the_set_of_conditions_is_bounded(caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="tunecache")
    monkeypatch.setattr(_common, "_warned", set())
    for i in range(_common.MAX_CONDITIONS + 100):
        _common.warn_once(f"test bound {i}", f"tunecache: condition {i}")
    assert len(_common._warned) == _common.MAX_CONDITIONS
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "condition" in r.getMessage()]
    assert len(warned) == _common.MAX_CONDITIONS
