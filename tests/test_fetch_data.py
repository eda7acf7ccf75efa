"""`ferry fetch-data`: the public files some examples read, each checked against its published SHA-256, written whole
or not at all, never over a file that differs. (The real download needs GitHub; here the files come from a mirror the
test writes, with the same checks.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import experiments.commands.fetch_data as fetch
from experiments.cli import main


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "mirror"
    made = {"traces/a.csv": b"arrived_at,num_prefill_tokens\n0.5,10\n", "vidur-profiling/x/mlp.csv": b"n_embd\n4096\n"}
    for place, data in made.items():
        (src / place).parent.mkdir(parents=True, exist_ok=True)
        (src / place).write_bytes(data)
    digests = {place: hashlib.sha256(data).hexdigest() for place, data in made.items()}
    monkeypatch.setattr(fetch, "files", lambda: digests)
    return src


def test_files_are_fetched_checked_and_kept(mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dest = tmp_path / "data"
    assert main(["fetch-data", "--dest", str(dest), "--mirror", mirror.as_uri()]) == 0
    assert (dest / "traces/a.csv").read_bytes() == (mirror / "traces/a.csv").read_bytes()
    assert "2 files fetched, 0 already there" in capsys.readouterr().out
    assert main(["fetch-data", "--dest", str(dest), "--mirror", mirror.as_uri()]) == 0
    assert "0 files fetched, 2 already there" in capsys.readouterr().out


def test_a_file_that_is_not_the_published_one_is_refused(mirror: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    dest = tmp_path / "data"
    (mirror / "traces/a.csv").write_bytes(b"tampered\n")
    assert main(["fetch-data", "--dest", str(dest), "--mirror", mirror.as_uri()]) == 2
    assert "its SHA-256 is not the published file's" in capsys.readouterr().err
    assert not (dest / "traces/a.csv").exists() and not list(dest.rglob("*.partial"))
    (dest / "traces").mkdir(parents=True)
    (dest / "traces/a.csv").write_text("my own\n")  # a file of the user's is never replaced
    assert main(["fetch-data", "--dest", str(dest), "--mirror", mirror.as_uri()]) == 2
    assert "is there with other contents than the published file" in capsys.readouterr().err
    assert (dest / "traces/a.csv").read_text() == "my own\n"


def test_nothing_to_fetch_from_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["fetch-data", "--dest", str(tmp_path / "d"), "--mirror", (tmp_path / "none").as_uri()]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ferry fetch-data: error: file://") and "cannot download" in err and "\n" not in err


def test_the_published_files_are_those_the_examples_read() -> None:
    places = fetch.files()
    assert len(places) == 33 and all(len(d) == 64 for d in places.values())
    for name in ("traces/splitwise_conv.csv", "traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
                 "traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                 "vidur-profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"):  # fmt: skip
        assert name in places
    assert fetch.source("traces/splitwise_conv.csv").startswith("https://raw.githubusercontent.com/microsoft/vidur/")
    assert "sarathi-serve" in fetch.source("traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
