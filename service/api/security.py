"""API tokens: random secrets shown once, stored as sha256 (enough for 256-bit random secrets; a
slow hash would only matter for guessable passwords), and the admin token compared in constant time.

A token reads ``opx_<8 chars>_<43 chars>``; its first 12 characters are the ``prefix`` shown in
listings and logs.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX_LEN = 12


def new_token() -> tuple[str, str, str]:
    """A fresh token: ``(secret, prefix, sha256 hex)``."""
    token = f"opx_{secrets.token_urlsafe(6)}_{secrets.token_urlsafe(32)}"
    return token, token[:PREFIX_LEN], hash_token(token)


def hash_token(token: str) -> str:
    """sha256 hex of the token (what the database stores)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def is_admin_token(presented: str, admin_token: str | None) -> bool:
    """Constant-time comparison with the configured admin token (never true when none is set)."""
    if not admin_token:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), admin_token.encode("utf-8"))
