"""The ``format`` values supported, as regexes over the decoded string, and over the encoded string body. Each
accepts only valid values (exactly the valid ones, or a subset of them).
"""

from __future__ import annotations

from constrain.compilers.json_schema.regex_ast import _class_text, _merge_ranges
from constrain.compilers.json_schema.values import _ESCAPE

_DATE = (
    r"(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DUR_DATE = r"(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)"
_DURATION = f"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"
# An LDH label of at most 48 characters, without "--" in positions 3-4 (so never an IDNA "xn--" label, whose
# validity depends on Punycode decoding).
_LABEL = (
    r"[A-Za-z0-9](?:[A-Za-z0-9]|[A-Za-z0-9-][A-Za-z0-9]|[A-Za-z0-9-]{2}[A-Za-z0-9]"
    r"|[A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]{0,43}[A-Za-z0-9])?"
)
_HOSTNAME = f"{_LABEL}(?:\\.{_LABEL}){{0,4}}"
_LDH = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"


def _ipv6() -> str:
    h = "[0-9A-Fa-f]{1,4}"
    ls32 = f"(?:{h}:{h}|{_IPV4})"
    forms = [f"(?:{h}:){{6}}{ls32}", f"::(?:{h}:){{5}}{ls32}"]
    tails = {4: f"(?:{h}:){{4}}{ls32}", 3: f"(?:{h}:){{3}}{ls32}", 2: f"(?:{h}:){{2}}{ls32}", 1: f"{h}:{ls32}", 0: ls32}
    for before, tail in ((0, tails[4]), (1, tails[3]), (2, tails[2]), (3, tails[1]), (4, tails[0])):
        head = h if before == 0 else f"(?:{h}:){{0,{before}}}{h}"
        forms.append(f"(?:{head})?::{tail}")
    forms.append(f"(?:(?:{h}:){{0,5}}{h})?::{h}")
    forms.append(f"(?:(?:{h}:){{0,6}}{h})?::")
    return "(?:" + "|".join(forms) + ")"


_IPV6 = _ipv6()
_IPV4_TEXT, _IPV6_TEXT = _IPV4, _IPV6
_QUOTED_LOCAL = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
_EMAIL = (
    f"(?:{_ATEXT}+(?:\\.{_ATEXT}+)*|{_QUOTED_LOCAL})"
    f"@(?:{_LDH}(?:\\.{_LDH})*|\\[{_IPV4_TEXT}\\]|\\[IPv6:{_IPV6_TEXT}\\])"
)
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_PCT = "%[0-9A-Fa-f]{2}"
_PCHAR = f"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_SEG_NC = f"(?:[A-Za-z0-9._~!$&'()*+,;=@-]|{_PCT})"
_AUTHORITY = (
    f"(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|{_PCT})*@)?"
    f"(?:\\[{_IPV6}\\]|{_IPV4}|(?:[A-Za-z0-9._~!$&'()*+,;=-]|{_PCT})*)(?::[0-9]*)?"
)
_PATH_ABEMPTY = f"(?:/{_PCHAR}*)*"
_QUERY_FRAGMENT = f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_HIER = f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|/(?:{_PCHAR}+{_PATH_ABEMPTY})?|{_PCHAR}+{_PATH_ABEMPTY}|)"
_URI = f"[A-Za-z][A-Za-z0-9+.-]*:{_HIER}{_QUERY_FRAGMENT}"
_RELATIVE = (
    f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|/(?:{_PCHAR}+{_PATH_ABEMPTY})?|{_SEG_NC}+{_PATH_ABEMPTY}|){_QUERY_FRAGMENT}"
)
_URI_REFERENCE = f"(?:{_URI}|{_RELATIVE})"
_VARCHAR = f"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
# RFC 6570 literals: ASCII %x21 / %x23-24 / %x26 / %x28-3B / %x3D / %x3F-5B / %x5D / %x5F / %x61-7A / %x7E, and
# RFC 3987 ucschar / iprivate (written as a negated class: the regex parser materialises classes as sets).
_TEMPLATE_LITERAL = _class_text(
    _merge_ranges(
        [
            (0x21, 0x21),
            (0x23, 0x24),
            (0x26, 0x26),
            (0x28, 0x3B),
            (0x3D, 0x3D),
            (0x3F, 0x5B),
            (0x5D, 0x5D),
            (0x5F, 0x5F),
            (0x61, 0x7A),
            (0x7E, 0x7E),
            (0xA0, 0xD7FF),
            (0xE000, 0xFDCF),
            (0xFDF0, 0xFFEF),
        ]
        + [(plane << 16, (plane << 16) + 0xFFFD) for plane in range(1, 14)]
        + [(0xE1000, 0xEFFFD), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)]
    )
)
_URI_TEMPLATE = f"(?:{_TEMPLATE_LITERAL}|{_PCT}|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
_RELATIVE_JSON_POINTER = f"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})"

_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "duration": _DURATION,
    "email": _EMAIL,
    "hostname": _HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uuid": _UUID,
    "uri": _URI,
    "uri-reference": _URI_REFERENCE,
    "uri-template": _URI_TEMPLATE,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": _RELATIVE_JSON_POINTER,
}
#: A valid value of each format of :data:`_FORMATS` (what :func:`~constrain.compilers.warmup.warmup` reads through
#: a schema that uses them all, so that their automata are built before the first request).
FORMAT_EXAMPLES = {
    "date": "2024-01-31",
    "time": "12:30:00Z",
    "date-time": "2024-01-31T12:30:00.5+01:00",
    "duration": "P1Y2M3DT4H",
    "email": "ada@example.org",
    "hostname": "www.example.org",
    "ipv4": "192.168.0.1",
    "ipv6": "2001:db8::1",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "uri": "https://example.org/a/b?c=d#e",
    "uri-reference": "../a/b?c",
    "uri-template": "/users/{id}{?page,size}",
    "json-pointer": "/a/b~1c",
    "relative-json-pointer": "1/a",
}
#: Formats whose characters never need a JSON escape (their regex is also the encoded language).
_ENCODED_QUOTED = r'\\"(?:[ !#-\[\]-~]|\\\\(?:[ !#-\[\]-~]|\\"|\\\\))*\\"'
_ENCODED_POINTER = f'(?:/(?:[^~/"\\\\\\x00-\\x1f]|{_ESCAPE}|~[01])*)*'
#: The formats as regexes over the encoded string body (what appears between the quotes), for the direct path.
_FORMATS_ENCODED = {
    **_FORMATS,
    "email": _EMAIL.replace(_QUOTED_LOCAL, _ENCODED_QUOTED),
    "json-pointer": _ENCODED_POINTER,
    "relative-json-pointer": f"(?:0|[1-9][0-9]*)(?:#|{_ENCODED_POINTER})",
}
_UNSUPPORTED_FORMATS = {"idn-email", "idn-hostname", "iri", "iri-reference", "regex"}
