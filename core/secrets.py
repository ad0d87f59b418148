"""Masking of secrets for messages, logs and ctl output.

Invariant: a DSN passed through `mask_dsn` never shows its password, whatever characters the
password holds (URL DSNs are split like urllib splits them: the password runs to the netloc's
last '@').
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
        netloc, slash, path = rest.partition("/")
        userinfo, at, host = netloc.rpartition("@")
        if at and ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            return f"{scheme}{sep}{user}:{MASK}@{host}{slash}{path}"
        return dsn
    return _KV_PASSWORD.sub(lambda m: m.group("pre") + MASK, dsn)
