"""Secrets kept out of what the library prints: credentials and signed-URL parameters in URLs.

:func:`redact` finds the URLs in any text (an error message, a note, a log line, a label) and
masks their secrets; :func:`redact_exception` does the same, in place, to an exception a network
read raised (and to the exceptions it was raised from), so that the object the user catches, its
notes, its ``repr`` and its causes name the URL without its secrets. The user's own data (the URLs a
pipe yields) is never changed: only what the library writes about it.

What is masked (``***``), in every ``scheme://`` URL found in the text:

- the userinfo, whole: ``https://user:password@host/`` and ``https://TOKEN@host/`` become
  ``https://***@host/``;
- the value of a query or fragment parameter whose name, compared without case, is one of
  :data:`SECRET_PARAMS` or contains one of :data:`SECRET_PARTS` (``X-Amz-Signature``,
  ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``X-Goog-Signature``, ``sig``, ``Signature``,
  ``Policy``, ``Key-Pair-Id``, ``token``, ``access_token``, ``key``, ...): ``?sig=abc&x=1``
  becomes ``?sig=***&x=1``;
- the same in a URL given as a parameter's value (``?url=https://u:p@h/``).

Not masked: text outside URLs (``token=abc`` in prose, a local path with an ``@``), and URLs spelled
without a scheme or percent-encoded inside another URL. Headers are masked by name (``Authorization``,
``Cookie``, ...) where an exception carries them (aiohttp's ``request_info``).

Text without ``://`` is returned as it is after one substring test, so calling :func:`redact` on
every message the library writes costs nothing worth measuring.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

__all__ = ["MASK", "SECRET_HEADERS", "SECRET_PARAMS", "SECRET_PARTS", "redact", "redact_exception"]

#: what replaces a secret
MASK = "***"

#: Query and fragment parameters whose value is a secret (lower case): AWS SigV4 and SigV2, Google
#: Cloud Storage, Azure SAS (``sig``), CloudFront (``Signature``, ``Policy``, ``Key-Pair-Id``) and
#: the usual API keys and tokens.
SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "awsaccesskeyid", "signature",
    "x-goog-signature", "x-goog-credential", "googleaccessid",
    "sig",
    "policy", "key-pair-id",
    "token", "access_token", "refresh_token", "id_token", "jwt", "auth", "authorization", "code_verifier",
    "key", "apikey", "api_key", "api-key", "password", "passwd", "pwd", "secret", "client_secret",
    "sessionid", "session_id",
})

#: Parameter names that contain one of these (lower case) are secret too (``SessionToken``,
#: ``x-amz-security-token``, ``my_api_key``, ``upload_signature``).
SECRET_PARTS = ("token", "secret", "signature", "password", "credential", "apikey", "api_key", "api-key",
                "accesskey", "access_key", "private")

#: Headers whose value is a secret (lower case), wherever an exception carries headers; any header
#: whose name contains one of :data:`SECRET_PARTS` is masked too.
SECRET_HEADERS = frozenset({
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "x-auth-token",
    "x-amz-security-token", "x-goog-api-key",
})

# A URL: a scheme, "://", then anything up to white space, a quote, an angle bracket or a backslash
# (which is how URLs end inside messages, reprs and log lines).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`\\]*")
# One parameter of a query or fragment: its separator, its name, its value.
_PARAM = re.compile(r"([?&;#])([^=&;#?]*)=([^&;#]*)")


def _secret_name(name: str) -> bool:
    key = (unquote(name) if "%" in name else name).strip().lower()
    return key in SECRET_PARAMS or any(part in key for part in SECRET_PARTS)


def _param(m: re.Match[str]) -> str:
    sep, name, value = m.group(1), m.group(2), m.group(3)
    if _secret_name(name):
        return f"{sep}{name}={MASK}"
    if "://" in value:  # a URL as a parameter (a redirect target, a proxied URL)
        return f"{sep}{name}={redact(value)}"
    return m.group(0)


def _url(m: re.Match[str]) -> str:
    url = m.group(0)
    start = url.index("://") + 3
    end = len(url)  # the authority ends at the first "/", "?" or "#"
    for sep in "/?#":
        i = url.find(sep, start, end)
        if i != -1:
            end = i
    at = url.rfind("@", start, end)
    if at != -1:
        url = f"{url[:start]}{MASK}{url[at:]}"
        end -= at - start - len(MASK)
    q = min((i for i in (url.find("?", end), url.find("#", end)) if i != -1), default=-1)
    if q != -1:
        url = url[:q] + _PARAM.sub(_param, url[q:])
    return url


def redact(text: Any) -> str:
    """``str(text)`` with the secrets of every URL in it masked (see the module docstring).

    >>> redact("503, url='https://user:pw@host/a.tar?X-Amz-Signature=abc&part=3'")
    "503, url='https://***@host/a.tar?X-Amz-Signature=***&part=3'"
    >>> redact("no URL here: token=abc")
    'no URL here: token=abc'
    """
    if not isinstance(text, str):
        text = str(text)
    if "://" not in text:
        return text
    return _URL.sub(_url, text)


# -- exceptions ------------------------------------------------------------------------------------

_CHAIN_LIMIT = 16  # exceptions looked at in one chain (causes, contexts, group members)


def _headers(headers: Any) -> Any:
    """A copy of a multidict of headers (aiohttp's), secret ones masked and URLs redacted."""
    from multidict import CIMultiDict, CIMultiDictProxy

    items = []
    changed = False
    for name, value in headers.items():
        key = str(name).lower()
        new = MASK if key in SECRET_HEADERS or any(p in key for p in SECRET_PARTS) else redact(value)
        changed |= new != value
        items.append((name, new))
    if not changed:
        return headers
    copy = CIMultiDict(items)
    return CIMultiDictProxy(copy) if isinstance(headers, CIMultiDictProxy) else copy


def _is_url(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ == "URL" and cls.__module__.startswith("yarl")


def _shows_secret(value: Any) -> bool:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an object whose repr fails shows nothing
        return False
    return redact(text) != text


def _clean(value: Any, seen: set[int]) -> Any:
    """``value`` with its secrets masked: the same object where it shows none, else a cleaned copy
    of the same type (a str, a yarl URL, aiohttp's RequestInfo, a multidict of headers, a tuple or
    list of them); an exception (aiohttp keeps the ``OSError`` under a connection error) is cleaned
    in place. An object of another kind that shows a secret in its repr is left out of a tuple or
    list (aiohttp's ``history`` of responses) and, alone, replaced by its redacted repr."""
    if isinstance(value, str):
        clean = redact(value)
        return value if clean == value else clean
    if value is None or isinstance(value, (int, float, bytes)):
        return value
    if isinstance(value, BaseException):
        if id(value) not in seen and len(seen) < _CHAIN_LIMIT:
            seen.add(id(value))
            _clean_one(value, seen)
        return value
    if _is_url(value):
        text = str(value)
        clean = redact(text)
        return value if clean == text else type(value)(clean, encoded=True)
    if hasattr(value, "real_url") and hasattr(value, "_replace"):  # aiohttp's RequestInfo
        url, real = _clean(value.url, seen), _clean(value.real_url, seen)
        headers = _headers(value.headers) if hasattr(value.headers, "items") else value.headers
        if url is value.url and real is value.real_url and headers is value.headers:
            return value
        return value._replace(url=url, real_url=real, headers=headers)
    if hasattr(value, "getall") and hasattr(value, "items"):  # a multidict of headers
        return _headers(value)
    if type(value) in (tuple, list):
        items = []
        changed = False
        for item in value:
            new = _clean(item, seen)
            if new is not item and not isinstance(item, (str, tuple, list)) and isinstance(new, str):
                changed = True  # an object that shows a secret: left out
                continue
            changed |= new is not item
            items.append(new)
        return type(value)(items) if changed else value
    if _shows_secret(value):
        return redact(repr(value))
    return value


def _clean_one(exc: BaseException, seen: set[int]) -> None:
    """Mask the secrets of one exception, in place: its args, its own attributes, an ``OSError``'s
    fields. A field that cannot be set is left as it is; the others are still cleaned."""
    args = exc.args
    cleaned = tuple(_clean(a, seen) for a in args)
    if any(new is not old for new, old in zip(cleaned, args)):
        exc.args = cleaned
    attrs: dict[str, Any] = getattr(exc, "__dict__", None) or {}
    for name, value in list(attrs.items()):
        new = _clean(value, seen)
        if new is not value:
            attrs[name] = new  # the instance's own attribute (request_info, message, __notes__, ...)
    if isinstance(exc, OSError):
        for name in ("strerror", "filename", "filename2"):
            value = getattr(exc, name, None)
            if isinstance(value, str) and redact(value) != value:
                try:
                    setattr(exc, name, redact(value))
                except (AttributeError, TypeError):
                    pass


def redact_exception(exc: BaseException) -> BaseException:
    """Mask, in place, the secrets of the URLs ``exc`` carries: in its args and message, its
    attributes (aiohttp's ``request_info`` with its headers, ``message``, ``headers``; an
    ``OSError``'s ``filename``), its notes, and the same in the exceptions it was raised from or
    while handling (``__cause__``, ``__context__``) and, for a group, in its members. Returns
    ``exc``: the same object, type and traceback, so ``except`` clauses and ``e.status`` work as
    before; a response in aiohttp's ``history`` that would show a secret is dropped from it.

    For exceptions raised by the network clients under the library's own reads: a user's exception
    passes through untouched (its message is redacted only where the library prints it).
    """
    cleaned: set[int] = set()  # exceptions cleaned (in the chain, or held in an attribute)
    walked: set[int] = set()  # exceptions whose causes and contexts were queued
    todo: list[BaseException | None] = [exc]
    while todo and len(walked) < _CHAIN_LIMIT:
        e = todo.pop()
        if e is None or id(e) in walked:
            continue
        walked.add(id(e))
        if id(e) not in cleaned:
            cleaned.add(id(e))
            try:
                _clean_one(e, cleaned)
            except Exception:  # noqa: BLE001 - a field that cannot be cleaned: the chain's others still are
                pass
        todo += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            todo += e.exceptions
    return exc
