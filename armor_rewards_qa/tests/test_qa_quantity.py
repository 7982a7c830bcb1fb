"""Numbers, Chinese numerals, units and tolerances, against hand-computed conversions."""

import pytest
from armor_rewards_qa.quantity import find_quantities, parse_quantity, parse_zh_number, same_quantity
from armor_rewards_qa.units import UNITS


@pytest.mark.parametrize(
    "text, value, unit",
    [
        ("5 km", 5.0, "km"),
        ("5km", 5.0, "km"),
        ("5 kilometres", 5.0, "km"),
        ("about 5 kilometers", 5.0, "km"),
        ("1,000", 1000.0, None),
        ("-2.5", -2.5, None),
        ("144.0", 144.0, None),
        (".5", 0.5, None),
        ("3e8 m/s", 3e8, "m/s"),
        ("3×10^8 m/s", 3e8, "m/s"),
        ("3 x 10^8 m/s", 3e8, "m/s"),
        ("3×10⁸ m/s", 3e8, "m/s"),
        ("2.5 million", 2.5e6, None),
        ("2100万", 2.1e7, None),
        ("1.5亿", 1.5e8, None),
        ("5万公里", 5e4, "km"),
        ("8.848千米", 8.848, "km"),  # 千米 is a unit (km), not 千 (thousand) + 米
        ("5千元", 5000.0, "CNY"),  # no unit 千元: 千 multiplies
        ("约8849米", 8849.0, "m"),
        ("8849米左右", 8849.0, "m"),
        ("三百六十五天", 365.0, "d"),
        ("100 °C", 100.0, "°C"),
        ("100℃", 100.0, "°C"),
        ("212°F", 212.0, "°F"),
        ("100 degrees Celsius", 100.0, "°C"),
        ("273 K", 273.0, "K"),
        ("$5", 5.0, "USD"),
        ("5 m²", 5.0, "m2"),
        ("约2189万人", 2.189e7, "count"),
    ],
)
def test_parse_quantity(text, value, unit):
    q = parse_quantity(text)
    assert q is not None and q.value == pytest.approx(value)
    assert (q.unit.symbol if q.unit else None) == unit


@pytest.mark.parametrize("text", ["H2O", "5k", "5 km long", "km", "", "five", "5 km 3 m", "CO2"])
def test_not_one_quantity(text):
    assert parse_quantity(text) is None


@pytest.mark.parametrize(
    "text, value",
    [
        ("三百六十五", 365),
        ("十", 10),
        ("十五", 15),
        ("二十", 20),
        ("一百零五", 105),
        ("十万", 100_000),
        ("两千一百万", 21_000_000),
        ("一亿两千万", 120_000_000),
        ("一九四五", 1945),
        ("零", 0),
    ],
)
def test_chinese_numerals(text, value):
    assert parse_zh_number(text) == value


def test_chinese_numerals_count_only_where_no_digits_are_written():
    assert [q.value for q in find_quantities("一年有365天")] == [365.0]
    assert [q.value for q in find_quantities("平年有三百六十五天")] == [365.0]
    assert [q.value for q in find_quantities("12 x 12 = 144")] == [12.0, 12.0, 144.0]
    assert find_quantities("H2O and CO2") == []


def q(text):
    out = parse_quantity(text)
    assert out is not None, text
    return out


@pytest.mark.parametrize(
    "a, b, convert, rel_tol, same",
    [
        ("5 km", "5000 m", True, 0.0, True),
        ("5 km", "5000 m", False, 0.0, False),  # without units: true, another unit is not converted
        ("5 km", "5 kilometres", False, 0.0, True),  # ... but any name of the same unit is fine
        ("5 km", "5", False, 0.0, True),  # a bare number on either side: the numbers are compared
        ("50%", "50", True, 0.0, True),
        ("100 °C", "212 °F", True, 0.0, True),  # 373.15 K both
        ("0 °C", "273.15 K", True, 0.0, True),
        ("1 mi", "1609.344 m", True, 0.0, True),
        ("5 km", "5 kg", True, 0.0, False),  # different dimensions
        ("5 USD", "5 EUR", True, 0.0, False),  # no exchange rates
        ("2.5 kg", "5.5 lb", True, 0.0, False),  # 5.5 lb = 2.49476 kg: 0.2% off
        ("2.5 kg", "5.5 lb", True, 0.01, True),  # ... inside 1%
        ("10 ft", "3.048 m", True, 0.0, True),  # float rounding (0.3048 * 10) is not a difference
        ("2 ha", "20000 平方米", True, 0.0, True),
        ("100 km/h", "62 mph", True, 0.01, True),  # 62 mph = 99.78 km/h
        ("60 min", "1 h", True, 0.0, True),
    ],
)
def test_same_quantity(a, b, convert, rel_tol, same):
    assert same_quantity(q(a), q(b), convert=convert, rel_tol=rel_tol) is same
    assert same_quantity(q(b), q(a), convert=convert, rel_tol=rel_tol) is same


def test_abs_tol():
    assert same_quantity(q("100"), q("100.4"), convert=False, abs_tol=0.5)
    assert not same_quantity(q("100"), q("100.6"), convert=False, abs_tol=0.5)


def test_every_unit_name_is_lower_case_and_unique():
    # the table refuses duplicates when it is built; lookups are by lower-case name
    assert all(name == name.lower() for name in UNITS)
