"""The unit table of ``short_answer``: each unit's dimension and its factor to SI, with English and
Chinese names. Pure data, no dependencies (no pint): an answer quotes a handful of common units,
and a table a reader can check beats a units library's whole grammar.

A value ``v`` in unit ``u`` is ``v * u.factor + u.offset`` in the SI unit of its dimension (kelvin
for temperatures, hence the offsets). Currency units share a dimension only with the same
currency: no exchange rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["UNITS", "Unit"]


@dataclass(frozen=True)
class Unit:
    """A unit: ``symbol`` names it in messages and decides equality when units are not converted."""

    symbol: str
    dimension: str
    factor: float
    offset: float = 0.0


# (symbol, dimension, factor to SI, names); every name is matched case-insensitively, except that a
# bare lowercase "k" is not kelvin (see quantity.py): "5k" is too often five thousand.
_TABLE: list[tuple[str, str, float, tuple[str, ...]]] = [
    # length, metre
    ("m", "length", 1.0, ("m", "meter", "meters", "metre", "metres", "米", "公尺")),
    ("km", "length", 1e3, ("km", "kilometer", "kilometers", "kilometre", "kilometres", "千米", "公里")),
    ("cm", "length", 1e-2, ("cm", "centimeter", "centimeters", "centimetre", "centimetres", "厘米", "公分")),
    ("mm", "length", 1e-3, ("mm", "millimeter", "millimeters", "millimetre", "millimetres", "毫米")),
    (
        "um",
        "length",
        1e-6,
        ("μm", "um", "micrometer", "micrometers", "micrometre", "micrometres", "micron", "microns", "微米"),
    ),
    ("nm", "length", 1e-9, ("nm", "nanometer", "nanometers", "nanometre", "nanometres", "纳米")),
    ("mi", "length", 1609.344, ("mi", "mile", "miles", "英里")),
    ("nmi", "length", 1852.0, ("nmi", "nautical mile", "nautical miles", "海里")),
    ("ft", "length", 0.3048, ("ft", "foot", "feet", "英尺")),
    ("in", "length", 0.0254, ("inch", "inches", "英寸")),  # not "in": "5 in total"
    ("yd", "length", 0.9144, ("yd", "yard", "yards")),
    ("ly", "length", 9.4607304725808e15, ("ly", "light year", "light years", "light-year", "light-years", "光年")),
    ("li", "length", 500.0, ("里",)),
    # mass, kilogram
    ("kg", "mass", 1.0, ("kg", "kilogram", "kilograms", "kilogramme", "kilogrammes", "千克", "公斤")),
    ("g", "mass", 1e-3, ("g", "gram", "grams", "gramme", "grammes", "克")),
    ("mg", "mass", 1e-6, ("mg", "milligram", "milligrams", "毫克")),
    ("t", "mass", 1e3, ("t", "tonne", "tonnes", "metric ton", "metric tons", "吨")),
    ("lb", "mass", 0.45359237, ("lb", "lbs", "pound", "pounds", "磅")),
    ("oz", "mass", 0.028349523125, ("oz", "ounce", "ounces", "盎司")),
    ("jin", "mass", 0.5, ("斤",)),
    # time, second
    ("s", "time", 1.0, ("s", "sec", "secs", "second", "seconds", "秒", "秒钟")),
    ("ms", "time", 1e-3, ("ms", "millisecond", "milliseconds", "毫秒")),
    ("min", "time", 60.0, ("min", "mins", "minute", "minutes", "分钟")),
    ("h", "time", 3600.0, ("h", "hr", "hrs", "hour", "hours", "小时", "个小时")),
    ("d", "time", 86400.0, ("day", "days", "天", "日")),
    ("week", "time", 604800.0, ("week", "weeks", "周", "星期", "个星期")),
    ("month", "time", 2629800.0, ("month", "months", "个月")),  # a twelfth of a Julian year
    ("year", "time", 31557600.0, ("year", "years", "yr", "yrs", "年")),  # the Julian year, 365.25 days
    # volume, cubic metre
    ("m3", "volume", 1.0, ("m^3", "m3", "cubic meter", "cubic meters", "cubic metre", "cubic metres", "立方米")),
    ("L", "volume", 1e-3, ("l", "liter", "liters", "litre", "litres", "升", "公升")),
    ("mL", "volume", 1e-6, ("ml", "milliliter", "milliliters", "millilitre", "millilitres", "毫升")),
    ("cm3", "volume", 1e-6, ("cm^3", "cm3", "cc", "cubic centimeter", "cubic centimeters", "立方厘米")),
    ("gal", "volume", 3.785411784e-3, ("gal", "gallon", "gallons", "加仑")),  # US gallon
    # area, square metre
    (
        "m2",
        "area",
        1.0,
        ("m^2", "m2", "sq m", "square meter", "square meters", "square metre", "square metres", "平方米"),
    ),
    (
        "km2",
        "area",
        1e6,
        (
            "km^2",
            "km2",
            "sq km",
            "square kilometer",
            "square kilometers",
            "square kilometre",
            "square kilometres",
            "平方公里",
            "平方千米",
        ),
    ),
    (
        "cm2",
        "area",
        1e-4,
        (
            "cm^2",
            "cm2",
            "square centimeter",
            "square centimeters",
            "square centimetre",
            "square centimetres",
            "平方厘米",
        ),
    ),
    ("ha", "area", 1e4, ("ha", "hectare", "hectares", "公顷")),
    ("acre", "area", 4046.8564224, ("acre", "acres", "英亩")),
    ("mu", "area", 10000.0 / 15.0, ("亩",)),
    ("ft2", "area", 0.09290304, ("ft^2", "ft2", "sq ft", "square foot", "square feet", "平方英尺")),
    ("mi2", "area", 2589988.110336, ("mi^2", "mi2", "sq mi", "square mile", "square miles", "平方英里")),
    # speed, metre per second
    ("m/s", "speed", 1.0, ("m/s", "mps", "meters per second", "metres per second", "米/秒", "米每秒")),
    (
        "km/h",
        "speed",
        1.0 / 3.6,
        (
            "km/h",
            "km/hr",
            "kph",
            "kmh",
            "kilometers per hour",
            "kilometres per hour",
            "千米/小时",
            "公里/小时",
            "千米每小时",
            "公里每小时",
        ),
    ),
    ("mph", "speed", 0.44704, ("mph", "mi/h", "miles per hour", "英里/小时", "英里每小时")),
    ("kn", "speed", 1852.0 / 3600.0, ("kn", "knot", "knots", "节")),
    # temperature, kelvin
    ("K", "temperature", 1.0, ("k", "kelvin", "kelvins", "开尔文")),
    ("°C", "temperature", 1.0, ("°c", "degc", "celsius", "degree celsius", "degrees celsius", "摄氏度")),
    ("°F", "temperature", 5.0 / 9.0, ("°f", "degf", "fahrenheit", "degree fahrenheit", "degrees fahrenheit", "华氏度")),
    # angle, radian
    ("deg", "angle", math.pi / 180.0, ("°", "deg", "degree", "degrees")),  # not 度: 100度 is as often a temperature
    ("rad", "angle", 1.0, ("rad", "radian", "radians", "弧度")),
    # energy, joule; power, watt; pressure, pascal; frequency, hertz
    ("J", "energy", 1.0, ("j", "joule", "joules", "焦", "焦耳")),
    ("kJ", "energy", 1e3, ("kj", "kilojoule", "kilojoules", "千焦")),
    ("cal", "energy", 4.184, ("cal", "calorie", "calories", "卡", "卡路里")),  # the thermochemical calorie
    ("kcal", "energy", 4184.0, ("kcal", "kilocalorie", "kilocalories", "千卡", "大卡")),
    ("kWh", "energy", 3.6e6, ("kwh", "kilowatt hour", "kilowatt hours", "千瓦时")),
    ("W", "power", 1.0, ("w", "watt", "watts", "瓦", "瓦特")),
    ("kW", "power", 1e3, ("kw", "kilowatt", "kilowatts", "千瓦")),
    ("MW", "power", 1e6, ("megawatt", "megawatts", "兆瓦")),
    ("hp", "power", 745.69987158227022, ("hp", "horsepower", "马力")),
    ("Pa", "pressure", 1.0, ("pa", "pascal", "pascals", "帕", "帕斯卡")),
    ("kPa", "pressure", 1e3, ("kpa", "kilopascal", "kilopascals", "千帕")),
    ("MPa", "pressure", 1e6, ("mpa", "megapascal", "megapascals", "兆帕")),
    ("atm", "pressure", 101325.0, ("atm", "atmosphere", "atmospheres", "标准大气压", "大气压")),
    ("bar", "pressure", 1e5, ("bar", "bars")),
    ("mmHg", "pressure", 133.322387415, ("mmhg", "毫米汞柱")),
    ("psi", "pressure", 6894.757293168361, ("psi",)),
    ("Hz", "frequency", 1.0, ("hz", "hertz", "赫兹", "赫")),
    ("kHz", "frequency", 1e3, ("khz", "kilohertz", "千赫")),
    ("MHz", "frequency", 1e6, ("mhz", "megahertz", "兆赫")),
    ("GHz", "frequency", 1e9, ("ghz", "gigahertz", "吉赫")),
    # ratios: a percentage is compared as written against a bare number (50% = 50)
    ("%", "ratio", 0.01, ("%", "percent", "per cent", "pct")),
    ("‰", "ratio", 0.001, ("‰", "per mille", "per mil")),
    # money: one dimension per currency, no exchange rates
    ("CNY", "money_cny", 1.0, ("元", "块", "块钱", "yuan", "rmb", "cny", "人民币", "¥")),
    ("USD", "money_usd", 1.0, ("$", "usd", "dollar", "dollars", "美元")),
    ("EUR", "money_eur", 1.0, ("€", "eur", "euro", "euros", "欧元")),
    ("GBP", "money_gbp", 1.0, ("£", "gbp", "pound sterling", "英镑")),
    ("JPY", "money_jpy", 1.0, ("jpy", "yen", "日元")),
    # Chinese measure words: a count of things, equal to the bare number (365天 is a time, 365个 a count)
    (
        "count",
        "count",
        1.0,
        (
            "个",
            "人",
            "名",
            "位",
            "只",
            "头",
            "条",
            "件",
            "本",
            "座",
            "次",
            "种",
            "颗",
            "棵",
            "株",
            "匹",
            "张",
            "台",
            "辆",
            "所",
            "家",
            "部",
            "首",
            "篇",
            "岁",
            "周岁",
        ),
    ),
]

# kelvin's offset: 0 °C = 273.15 K; 0 °F = 273.15 - 32 * 5/9 K
_OFFSETS = {"°C": 273.15, "°F": 273.15 - 32.0 * 5.0 / 9.0}

#: lower-case name -> unit
UNITS: dict[str, Unit] = {}
for _symbol, _dimension, _factor, _names in _TABLE:
    _unit = Unit(_symbol, _dimension, _factor, _OFFSETS.get(_symbol, 0.0))
    for _name in _names:
        if _name in UNITS:
            raise AssertionError(f"unit name {_name!r} is listed twice (for {UNITS[_name].symbol} and {_symbol})")
        UNITS[_name] = _unit
