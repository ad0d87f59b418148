"""Masking of secrets for messages, logs and ctl output.

Invariant: a DSN passed through `mask_dsn` never shows its password, whatever characters the
password holds and even when the DSN does not parse: in a URL DSN the password runs from the
first ':' of the user info to the '@' before the host (the netloc's last '@', as urllib splits
it; a password holding '/', '?' or '#' extends to the last '@' before the next of those), and a
`password=` / `pwd=` parameter is masked in URL and key=value DSNs alike.
"""
from __future__ import annotations

import re

MASK = "***"

# password=... / pwd=... in a key=value DSN.
_KV_PASSWORD = re.compile(r"(?P<pre>\b(?:password|passwd|pwd)\s*=\s*)(?P<pw>[^;\s&]*)", re.I)


def mask_dsn(dsn: str) -> str:
    """The DSN with its password replaced by ***; other parts kept so a person can recognise it."""
    if "://" in dsn:
        scheme, sep, rest = dsn.partition("://")
        at = _userinfo_end(rest)
        if at >= 0 and ":" in rest[:at]:
            user = rest[:at].split(":", 1)[0]
            dsn = f"{scheme}{sep}{user}:{MASK}{rest[at:]}"
    return _KV_PASSWORD.sub(lambda m: m.group("pre") + MASK, dsn)


def _netloc_end(text: str, start: int = 0) -> int:
    ends = [i for i in (text.find(c, start) for c in "/?#") if i >= 0]
    return min(ends, default=len(text))


def _userinfo_end(rest: str) -> int:
    """Index of the '@' that ends the user info of `rest` (the URL after '://'), or -1."""
    at = rest.rfind("@", 0, _netloc_end(rest))
    if at < 0 and (first := rest.find("@")) >= 0:
        # The password holds '/', '?' or '#' (urllib would misparse it): rather mask too much.
        at = rest.rfind("@", 0, _netloc_end(rest, first))
    return at
