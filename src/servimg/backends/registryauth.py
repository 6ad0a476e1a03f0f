"""Registry authorization: the `WWW-Authenticate` challenge (basic, or a bearer token from the realm),

Security: credentials are sent only in `Authorization` headers (or the token request's body); no exception
message, log line or repr ever holds a password, a base64 `auth` value or a token: every message passes
through `Auth.redact` as a last line of defence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from servimg.backends import credentials as creds_module
from servimg.backends.credentials import Credentials, HelperRunner, run_helper
from servimg.backends.registrywire import CHALLENGE_PARAM, Transient, describe, is_loopback, retry_after
from servimg.core.errors import RegistryError
from servimg.core.lazy import LazyModule

if TYPE_CHECKING:
    import requests
else:  # a build that reads and writes no registry never imports it (≈0.1 s)
    requests = LazyModule("requests")

log = logging.getLogger("servimg.backends.registry")  # one logger for the whole client

# ------------------------------------------------------------------------------------------------------- auth


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="…",service="…",scope="…"` → ("bearer", {...}) (RFC 7235 §4.1)."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) or m.group(3) or "" for m in CHALLENGE_PARAM.finditer(rest)}
    return scheme.lower(), params


class Auth:
    """Answers 401 challenges: Basic with the configured credentials, or the Bearer token flow.

    Tokens are cached per scope set, so a push to one repository fetches one token, not one per request.
    """

    def __init__(
        self,
        registry: str,
        config: Path,
        session: requests.Session,
        timeout: float,
        helpers: HelperRunner = run_helper,
    ) -> None:
        self._registry = registry
        self._config = config
        self._helpers = helpers
        self._session = session
        self._timeout = timeout
        self._loaded = False
        self._creds: Credentials | None = None
        self._basic = False
        self._tokens: dict[str, str] = {}
        self._secrets: set[str] = set()

    def __repr__(self) -> str:
        return f"Auth({self._registry!r})"

    @property
    def config(self) -> Path:
        return self._config

    @property
    def source(self) -> str:
        """Where the credentials came from (a config key or a helper), or the config file searched."""
        return self._creds.source if self._creds is not None else str(self._config)

    def credentials(self) -> Credentials | None:
        # Loaded lazily: an anonymous registry never needs the config file (or a helper) at all.
        if not self._loaded:
            self._loaded = True
            self._creds = creds_module.lookup(self._registry, self._config, self._helpers)
            if self._creds is not None:
                self._secrets.update(self._creds.secrets())
        return self._creds

    def header(self, scopes: Sequence[str]) -> str | None:
        token = self._tokens.get(" ".join(sorted(scopes)))
        if token is not None:
            return f"Bearer {token}"
        creds = self._creds
        if self._basic and creds is not None:
            return f"Basic {creds.basic()}"
        return None

    def answer(self, response: requests.Response, scopes: Sequence[str]) -> bool:
        """Learn from a 401; True if resending the request with new authorization can succeed."""
        scheme, params = parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if scheme == "basic":
            creds = self.credentials()
            if self._basic or creds is None or creds.identity_token:
                return False  # the credentials we sent were refused, or there are none for basic
            self._basic = True
            return True
        if scheme == "bearer" and params.get("realm"):
            self._tokens[" ".join(sorted(scopes))] = self._fetch_token(params, scopes)
            return True
        return False

    def _fetch_token(self, params: Mapping[str, str], scopes: Sequence[str]) -> str:
        """GET the realm with service and scope (distribution "Token Authentication Specification")."""
        realm = urlsplit(params["realm"])
        where = f"{realm.scheme}://{realm.netloc}{realm.path}"
        if realm.scheme not in ("http", "https"):
            raise RegistryError(f"token realm {where!r} is not an http(s) URL")
        wanted = sorted(set(scopes) | set(params.get("scope", "").split()))
        query = [("service", params["service"])] if params.get("service") else []
        query += [("scope", scope) for scope in wanted]
        creds = self.credentials()
        if creds is not None and not (realm.scheme == "https" or is_loopback(realm.hostname or "")):
            # Never hand a password or token to a remote realm over plain http.
            log.warning("not sending credentials to %s over plain http; asking for an anonymous token", where)
            creds = None
        try:
            if creds is not None and creds.identity_token:
                resp = self._refresh_token_request(params, wanted, creds)
            else:
                auth = (creds.username, creds.password) if creds is not None else None
                resp = self._session.get(params["realm"], params=query, auth=auth, timeout=self._timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise Transient(f"token service {where}: {describe(exc)}") from None
        with resp:
            if resp.status_code == 429 or resp.status_code >= 500:
                raise Transient(f"token service {where} answered {resp.status_code}", retry_after(resp))
            if resp.status_code != 200:
                raise RegistryError(
                    f"token service {where} refused ({resp.status_code} {resp.reason})",
                    hint=f"check the credentials for {self._registry} from {self.source} (`docker login`)",
                )
            token = token_of(resp)
        self._secrets.add(token)
        return token

    def _refresh_token_request(
        self, params: Mapping[str, str], scopes: Sequence[str], creds: Credentials
    ) -> requests.Response:
        """The OAuth2 flow an identity token calls for (distribution "Token Authentication Implementation
        using OAuth2"): POST grant_type=refresh_token; the answer's `access_token` is the bearer token."""
        form = {"grant_type": "refresh_token", "refresh_token": creds.password, "client_id": "servimg"}
        if params.get("service"):
            form["service"] = params["service"]
        if scopes:
            form["scope"] = " ".join(scopes)
        return self._session.post(params["realm"], data=form, timeout=self._timeout)

    def redact(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


def token_of(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deeply (a hostile server)
        body = None
    token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        raise RegistryError("the token service answered without a token")
    return token
