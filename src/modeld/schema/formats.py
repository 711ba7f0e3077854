"""``format`` values modeld checks a reply's strings against, once the reply is complete.

JSON Schema 2020-12 makes ``format`` an annotation unless a validator opts in; modeld opts in
for the formats below (the ones pydantic, zod and OpenAI's strict schemas send). Four of them
also have a grammar (:data:`modeld.schema.keywords.FORMATS`), which holds their shape while the
model writes; the check here is then what the grammar cannot hold (February 30th). Every check
is a regular expression without nested quantifiers (linear time: a reply cannot make it slow)
plus, where the syntax is not enough, the calendar or an :mod:`ipaddress` test. A format not listed
here is reported as not checked (:mod:`modeld.schema.validate`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})\Z")
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))\Z")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
# ISO 8601 durations as RFC 3339's appendix A writes them, with ISO's leniency that pydantic
# relies on: units may be skipped (P1Y2D) and the seconds may have a fraction (PT0.5S).
_DURATION = re.compile(r"P(?:\d+W|(?=\d|T\d)(?:\d+Y)?(?:\d+M)?(?:\d+D)?"
                       r"(?:T(?=\d)(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?)\Z")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
_ATOM = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+\Z")  # RFC 5322 atext
_QUOTED = re.compile(r'"(?:[\x20\x21\x23-\x5B\x5D-\x7E]|\\[\x20-\x7E])*"\Z')
_IPV4 = re.compile(r"(?:0|[1-9]\d{0,2})(?:\.(?:0|[1-9]\d{0,2})){3}\Z")
# RFC 3986: a scheme, then only characters a URI may hold (unreserved, reserved, %XX)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_URI_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#\[\]]|%[0-9A-Fa-f]{2})*\Z")
_POINTER = re.compile(r"(?:/(?:[^~/]|~[01])*)*\Z")
_RELATIVE = re.compile(r"(?:0|[1-9]\d*)(?:#|(?:/(?:[^~/]|~[01])*)*)\Z")


def _date(text: str) -> bool:
    m = _DATE.match(text)
    if not m:
        return False
    year, month, day = int(m[1]), int(m[2]), int(m[3])
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)  # year 0000 too (RFC 3339)
    return 1 <= day <= (29 if month == 2 and leap else _DAYS[month - 1])


def _time(text: str) -> bool:
    m = _TIME.match(text)
    if not m:
        return False
    hour, minute, second = int(m[1]), int(m[2]), int(m[3])
    offset_ok = m[4] is None or (int(m[4]) <= 23 and int(m[5]) <= 59)
    return hour <= 23 and minute <= 59 and second <= 60 and offset_ok  # 60: a leap second


def _date_time(text: str) -> bool:
    date, sep, time = text.partition("T") if "T" in text else text.partition("t")
    return bool(sep) and _date(date) and _time(time)


def _hostname(text: str) -> bool:
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    return 0 < len(text) <= 253 and all(_LABEL.match(label) for label in labels)


def _email(text: str) -> bool:
    local, at, domain = text.rpartition("@")
    if not at or not local or len(local) > 64:
        return False
    local_ok = bool(_QUOTED.match(local)) or all(_ATOM.match(p) for p in local.split("."))
    if domain.startswith("[") and domain.endswith("]"):
        literal = domain[1:-1]
        domain_ok = _ipv6(literal[5:]) if literal.startswith("IPv6:") else _ipv4(literal)
    else:
        domain_ok = _hostname(domain)
    return local_ok and domain_ok


def _ipv4(text: str) -> bool:
    return bool(_IPV4.match(text)) and all(int(p) <= 255 for p in text.split("."))


def _ipv6(text: str) -> bool:
    if not text or "%" in text or not text.isascii() or text != text.strip():
        return False  # a zone id (fe80::1%eth0) is not part of the format
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _uri_reference(text: str) -> bool:
    return text.count("#") <= 1 and bool(_URI_CHARS.match(text))


def _uri(text: str) -> bool:
    return bool(_SCHEME.match(text)) and _uri_reference(text)


#: Format name -> whether a string is in that format.
CHECKS: dict[str, Callable[[str], bool]] = {
    "date": _date,
    "time": _time,
    "date-time": _date_time,
    "uuid": lambda text: bool(_UUID.match(text)),
    "duration": lambda text: bool(_DURATION.match(text)),
    "email": _email,
    "hostname": _hostname,
    "ipv4": _ipv4,
    "ipv6": _ipv6,
    "uri": _uri,
    "uri-reference": _uri_reference,
    "json-pointer": lambda text: bool(_POINTER.match(text)),
    "relative-json-pointer": lambda text: bool(_RELATIVE.match(text)),
}
