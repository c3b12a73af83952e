"""A Spark Connect server's Python workers serve imports of other processes in turn: the log
settings an import sends (the source's logTo option, logs.settings()) win over what the worker
was configured with before."""

from __future__ import annotations

import logging

from lagless import logs


def test_the_settings_an_import_sends_win_over_the_ones_before(tmp_path, monkeypatch) -> None:
    for name in (logs.LEVEL_ENV, logs.FILE_ENV, logs.JSON_ENV):
        monkeypatch.setenv(name, "")  # restored after the test: configure() exports them
    ours, other = tmp_path / "ours.log", tmp_path / "other.log"
    logs.configure("info", str(ours))
    sent = logs.settings()
    logs.configure("info", str(other))  # the worker served another import since

    logs.configure_from_environment(sent)
    logging.getLogger("lagless.test").info("a line of ours")
    assert "a line of ours" in ours.read_text()
    assert "a line of ours" not in other.read_text()
    assert logs.log_file() == str(ours)
