"""Each import logs into a file of its own, one per checkpoint (issue 60): every run of that
import appends to it, another import's lines never land in it, and the file lies outside the
checkpoint (a refused import leaves no checkpoint). $LAGLESS_LOG_FILE and --log-file win."""

from __future__ import annotations

import logging
from pathlib import Path

from lagless import logs
from lagless.cli.main import main


def _isolated(monkeypatch, tmp_path: Path) -> Path:
    for name in (logs.LEVEL_ENV, logs.FILE_ENV, logs.JSON_ENV):
        monkeypatch.setenv(name, "")  # restored after the test: configure() exports them
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "lagless"


def test_two_imports_log_apart_and_each_run_of_one_appends(tmp_path, monkeypatch) -> None:
    state = _isolated(monkeypatch, tmp_path)
    orders, payments = str(tmp_path / "ckpt" / "orders"), str(tmp_path / "other" / "orders")

    def run(checkpoint: str, line: str) -> str:
        """A process of its own: configure() exports its file to the processes it starts."""
        monkeypatch.setenv(logs.FILE_ENV, "")
        where = logs.configure("info", checkpoint=checkpoint)
        logging.getLogger("lagless.test").info(line)
        return where

    first = run(orders, "run 1 of orders")
    second = run(payments, "run 1 of the other orders")
    again = run(orders + "/", "run 2 of orders")  # the same folder, spelt otherwise
    logs.configure("info", str(tmp_path / "elsewhere.log"))  # release the file

    assert first == again != second  # same name, another path: another file
    assert Path(first).parent == state / "imports" and Path(first).name.startswith("orders-")
    text = Path(first).read_text()
    assert "run 1 of orders" in text and "run 2 of orders" in text
    assert "other orders" not in text
    assert not Path(orders).exists()  # nothing written into the checkpoint


def test_the_log_file_given_wins_over_the_checkpoint_one(tmp_path, monkeypatch) -> None:
    _isolated(monkeypatch, tmp_path)
    given = tmp_path / "given.log"
    assert logs.configure("info", str(given), checkpoint=str(tmp_path / "c")) == str(given)
    monkeypatch.setenv(logs.FILE_ENV, str(tmp_path / "env.log"))
    assert logs.default_log_file(str(tmp_path / "c")) == str(tmp_path / "env.log")
    monkeypatch.setenv(logs.FILE_ENV, "")
    assert logs.default_log_file() == str(tmp_path / "state" / "lagless" / "lagless.log")


def test_a_refused_import_logs_its_refusal_into_its_own_file(tmp_path, monkeypatch) -> None:
    """From the command line: the refusal (bad input, exit 2) is in the checkpoint's log, and
    no checkpoint folder was made."""
    _isolated(monkeypatch, tmp_path)
    checkpoint = tmp_path / "ckpt"
    code = main(
        ["import", "--bootstrap", "127.0.0.1:9", "--topic", "t", "--sink", "nope:///x",
         "--checkpoint", str(checkpoint)]
    )  # fmt: skip
    log_file = Path(logs.checkpoint_log(str(checkpoint)))
    logs.configure("info", str(tmp_path / "elsewhere.log"))  # release the file
    assert code == 2
    assert "(exit 2)" in log_file.read_text()
    assert not checkpoint.exists()
