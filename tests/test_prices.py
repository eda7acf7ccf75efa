"""GPU prices: every built-in profile has one with a source and a date; a user's file overrides entry by entry; bad
files fail with one-line errors that name the file, the entry and the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from costmodel.hardware import NOT_PROFILES, PROFILES_DIR
from costmodel.prices import PRICES_FILE, Price, builtin_prices_path, load_prices, price_of

PROFILES = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if p.stem not in NOT_PROFILES)  # a new profile included


def write(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def entry(usd: object = 2.5, **fields: object) -> dict[str, object]:
    return {"usd_per_gpu_hour": usd, "source": "https://example.com/pricing", "date": "2026-11", **fields}


def test_the_builtin_file_is_the_one_beside_the_profiles() -> None:
    assert builtin_prices_path() == PROFILES_DIR / PRICES_FILE
    assert PROFILES, "no hardware profiles found"


@pytest.mark.parametrize("name", PROFILES)
def test_every_builtin_profile_has_a_price(name: str) -> None:
    price = price_of(load_prices(), name)
    assert 0.1 < price.usd_per_gpu_hour < 50  # dollars per GPU-hour: a cents or a thousands slip fails


def test_every_price_is_of_a_shipped_profile() -> None:
    assert set(load_prices()) <= set(PROFILES)
    # the profiles of one device (NAME.datasheet, NAME.sglang, NAME.trtllm) take NAME's price unless they have their own
    devices = {name.split(".")[0] for name in PROFILES}
    assert devices <= set(load_prices())


def test_a_profile_of_a_device_takes_the_device_price_unless_it_has_its_own() -> None:
    prices = load_prices()
    assert price_of(prices, "H100-SXM.sglang") == prices["h100-sxm"] == price_of(prices, "h100-sxm.datasheet")
    assert price_of(prices, "a100-80g.vidur") == prices["a100-80g.vidur"]
    with pytest.raises(ValueError, match="no GPU price for hardware 'tpu.v5'"):
        price_of(prices, "tpu.v5")


@pytest.mark.parametrize("name", sorted(load_prices()))
def test_every_price_has_a_source_url_a_month_and_a_note(name: str) -> None:
    price = load_prices()[name]
    assert re.fullmatch(r"https://[\w.-]+\.[a-z]{2,}(/\S*)?", price.source), price.source
    year, month = (int(x) for x in price.date.split("-"))
    assert 2023 <= year <= 2100 and 1 <= month <= 12
    assert len(price.note) > 20  # how the number was derived


def test_the_file_quotes_its_dates_and_says_it_holds_assumptions() -> None:
    text = builtin_prices_path().read_text()
    assert "assumption" in text.lower() and "--prices" in text
    raw = yaml.safe_load(text)
    assert all(isinstance(e["date"], str) for e in raw.values())


def test_a_user_file_replaces_one_entry_and_keeps_the_rest(tmp_path: Path) -> None:
    builtin = load_prices()
    mine = write(tmp_path, yaml.safe_dump({"h100-sxm": entry(2.1, note="our reserved price")}))
    merged = load_prices(mine)
    assert merged["h100-sxm"] == Price(**entry(2.1, note="our reserved price"))
    assert merged["h100-sxm"] != builtin["h100-sxm"]
    assert {k: v for k, v in merged.items() if k != "h100-sxm"} == {k: v for k, v in builtin.items() if k != "h100-sxm"}
    assert load_prices() == builtin  # the built-ins themselves are untouched


def test_a_user_file_adds_a_profile_of_its_own_case_insensitively(tmp_path: Path) -> None:
    mine = write(tmp_path, yaml.safe_dump({"Lab-A100": entry(1.2)}))
    prices = load_prices(str(mine))
    assert price_of(prices, "lab-a100").usd_per_gpu_hour == 1.2
    assert price_of(prices, " LAB-A100 ") == price_of(prices, "lab-a100")
    assert set(prices) == set(load_prices()) | {"lab-a100"}


def test_note_is_optional_and_an_empty_file_changes_nothing(tmp_path: Path) -> None:
    assert load_prices(write(tmp_path, yaml.safe_dump({"l40s": entry()})))["l40s"].note == ""
    assert load_prices(write(tmp_path, "# nothing yet\n", "empty.yaml")) == load_prices()


def test_a_missing_price_says_to_add_it_with_prices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no GPU price for hardware 'tpu-v5'.*h100-sxm.*--prices FILE.*tpu-v5:"):
        price_of(load_prices(), "tpu-v5")


def test_price_is_frozen() -> None:
    price = load_prices()["h100-sxm"]
    with pytest.raises(ValueError):
        price.usd_per_gpu_hour = 0.01  # type: ignore[misc]


BAD_ENTRIES = [
    ({"h100-sxm": entry(-1.0)}, r"entry 'h100-sxm': usd_per_gpu_hour: .*greater than 0 \(got -1\.0\)"),
    ({"h100-sxm": entry(0)}, r"entry 'h100-sxm': usd_per_gpu_hour: .*greater than 0"),
    ({"h100-sxm": entry(float("inf"))}, r"usd_per_gpu_hour: .*finite number"),
    ({"h100-sxm": entry("2.5")}, r"usd_per_gpu_hour: must be a number .*\(got '2\.5'\)"),
    ({"h100-sxm": entry(True)}, r"usd_per_gpu_hour: must be a number"),
    ({"h100-sxm": {"usd_per_gpu_hour": 2.0, "date": "2026-11"}}, r"entry 'h100-sxm': source: missing"),
    ({"b200": {"source": "x", "date": "2026-11"}}, r"entry 'b200': usd_per_gpu_hour: missing"),
    ({"h200": entry(region="us-east-1")}, r"entry 'h200': region: unknown field \(allowed: usd_per_gpu_hour, source"),
    ({"h200": entry(date="2026-13")}, r"entry 'h200': date: must be a year and month"),
    ({"h200": entry(date="Nov 2026")}, r"entry 'h200': date: must be a year and month.*got 'Nov 2026'"),
    ({"h200": entry(source="")}, r"entry 'h200': source: .*at least 1 character"),
    ({"mi300x": 1.99}, r"entry 'mi300x': expected a mapping with usd_per_gpu_hour, source, date.*got float"),
    ({"mi300x": entry(), "MI300X": entry()}, r"hardware 'mi300x' is listed twice"),
]


@pytest.mark.parametrize(("data", "message"), BAD_ENTRIES)
def test_bad_entries_name_the_file_entry_and_field(tmp_path: Path, data: dict[str, object], message: str) -> None:
    path = write(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message) as info:
        load_prices(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and "\n" not in text


def test_an_unquoted_full_date_is_rejected_with_the_format(tmp_path: Path) -> None:
    path = write(tmp_path, "h100-sxm: {usd_per_gpu_hour: 2.0, source: x, date: 2026-11-05}\n")
    with pytest.raises(ValueError, match=r'date: must be a year and month, "YYYY-MM"'):
        load_prices(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- h100-sxm\n- b200\n", r"expected a mapping of hardware name to price entry .* got list"),
        ("just a sentence\n", r"expected a mapping of hardware name to price entry .* got str"),
        ("h100-sxm: {usd_per_gpu_hour: 2.0\n  source: [\n", r"not valid YAML: .*\(line \d+, column \d+\)"),
        ("42: {usd_per_gpu_hour: 2.0, source: x, date: '2026-11'}\n", r"entry 42: a hardware name must be"),
    ],
)
def test_bad_files_say_what_is_wrong_on_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as info:
        load_prices(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"prices file .*nope\.yaml does not exist"):
        load_prices(tmp_path / "nope.yaml")
