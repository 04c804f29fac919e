"""Whether an MLflow tracking server answers, asked without MLflow: its client retries an
unreachable server for seconds to minutes before it fails, and importing it takes seconds.
Pure: the standard library only."""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request

ANSWER_SECONDS = 2.0


def server_silence(uri: str, seconds: float | None = None) -> str | None:
    """Why no HTTP server answers at `uri` (an http or https URL) within `seconds`, or None
    when one does. Any HTTP answer counts, an error status included: the question is
    whether a server is there, not whether it lets this user in. Proxies are taken from
    the environment as MLflow's client takes them."""
    seconds = ANSWER_SECONDS if seconds is None else seconds
    parts = urllib.parse.urlsplit(uri)
    # No credentials are needed to be answered (`user:password@` would be sent as is).
    where = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    url = where.geturl().rstrip("/") + "/health"  # MLflow's own; any path gets an answer
    # Certificates are MLflow's to check, with its own settings: a server that answers over
    # TLS is there.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(urllib.request.Request(url, method="GET"), timeout=seconds):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as err:
        return _reason(err.reason, seconds)
    except (http.client.HTTPException, OSError, ValueError) as err:
        return _reason(err, seconds)


def _reason(err: object, seconds: float) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, TimeoutError):
        return f"no answer within {seconds:g} s"
    if isinstance(err, socket.gaierror):
        return f"the host name does not resolve: {err.strerror or err}"
    if isinstance(err, ssl.SSLError):
        return f"no TLS answer: {err.reason or err}"
    if isinstance(err, ValueError | http.client.InvalidURL):
        return f"not a URL: {err}"
    if isinstance(err, http.client.RemoteDisconnected):
        return "the connection closed without an HTTP answer"
    if isinstance(err, http.client.HTTPException):
        return "not an HTTP answer"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror[:1].lower() + err.strerror[1:]
    return str(err)
