"""Credentials never go in a URL: a job config ends up in logs and checkpoints, and an error
would echo them. These checks need nothing but the string, so the config layer and the
sources share them; the secret is never printed, only where it is."""

from __future__ import annotations

from zephon_titan.errors import ConfigError

CREDENTIALS_HINT = (
    "credentials belong in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, or "
    "AWS_PROFILE and ~/.aws), never in the job config, which ends up in logs and checkpoints"
)


def userinfo(url: str) -> str | None:
    """The `user:secret` part of a URL (`scheme://user:secret@host/...`), or None."""
    rest = url.split("://", 1)[1] if "://" in url else url
    authority = rest.split("/", 1)[0]
    return authority.rpartition("@")[0] if "@" in authority else None


def redact(url: str) -> str:
    """`url` with its credentials replaced by ***, safe to print."""
    if userinfo(url) is None:
        return url
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    authority, slash, tail = rest.partition("/")
    return f"{scheme}{sep}***@{authority.rpartition('@')[2]}{slash}{tail}"


def refuse_credentials(url: str, where: str) -> None:
    """Refuse a URL with credentials in it, printing it redacted. `where` names the setting."""
    if userinfo(url) is not None:
        raise ConfigError(f"{where} {redact(url)!r} has credentials in it; {CREDENTIALS_HINT}")
