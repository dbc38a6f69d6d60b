"""The user-facing error for a failure an object store's client raised (s3fs over botocore and
aiohttp, gcsfs over aiohttp, adlfs over azure-core), wherever it was raised: the CLI applies it
to any error that reaches it, as `errors.from_os_error`, so a store that cannot be reached is
never an internal error (70).

- the store cannot be reached (connection refused or reset, a timeout): 75, the same command
  succeeds once it is back; committed rows are kept;
- the store refuses the credentials, or has none to use (or AWS_PROFILE names no profile), or
  denies the request: 78;
- a bucket (an Azure container) that does not exist: 78, naming it;
- a TLS certificate the client does not trust (a private CA, an http endpoint named https):
  78, since running again cannot change it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from jobrunner.errors import ConfigError, JobError, StoreError

# Exception classes (by module and name, anywhere in an error's MRO) that mean the store was
# not reached or did not answer; none of them is imported unless a store is used.
_UNREACHABLE = {
    ("botocore.exceptions", "ConnectionError"),  # EndpointConnectionError, ConnectTimeoutError
    ("botocore.exceptions", "HTTPClientError"),  # ConnectionClosedError, ReadTimeoutError
    ("aiohttp.client_exceptions", "ClientConnectionError"),  # ServerDisconnectedError
    ("fsspec.exceptions", "FSTimeoutError"),
    ("azure.core.exceptions", "ServiceRequestError"),  # connection refused, DNS, TLS set-up
    ("azure.core.exceptions", "ServiceResponseError"),  # the connection cut mid-answer
}
_UNTRUSTED = {  # certificate verification failed: no retry helps
    ("ssl", "SSLCertVerificationError"),
    ("aiohttp.client_exceptions", "ClientConnectorCertificateError"),
}
_NO_CREDENTIALS = {("botocore.exceptions", "NoCredentialsError")}
# azure-identity's chain found no credential (no status: nothing was asked of the store)
_AZURE_AUTH = ("azure.core.exceptions", "ClientAuthenticationError")
# The client's own set-up is wrong (AWS_PROFILE names no profile, a key without its secret).
_BAD_SETUP = {
    ("botocore.exceptions", "ProfileNotFound"),
    ("botocore.exceptions", "PartialCredentialsError"),
}
_REFUSED = {
    "AccessDenied",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidToken",
    "SignatureDoesNotMatch",
}


def from_store_error(e: BaseException, where: str = "") -> JobError | None:
    """The JobError for a store client's failure in `e` or its causes; None for anything else.
    `where`: the URL the failed request was for, when the caller knows it."""
    user = _classify(list(_chain(e)))
    if user is not None and where:
        user = type(user)(f"{where}: {user}")
    return user


def _classify(chain: list[BaseException]) -> JobError | None:
    kinds = {(c.__module__, c.__name__) for x in chain for c in type(x).__mro__}
    store = _store(chain, kinds)
    if kinds & _UNTRUSTED or (
        ("botocore.exceptions", "SSLError") in kinds
        and any("CERTIFICATE_VERIFY_FAILED" in str(x).upper().replace(" ", "_") for x in chain)
    ):
        return ConfigError(
            f"the object store's TLS certificate is not trusted{_endpoint(store)} ({chain[0]}):"
            " point AWS_CA_BUNDLE at the CA that signed it, or fix the endpoint's URL"
        )
    if kinds & _UNREACHABLE:
        return StoreError(
            f"cannot reach the object store{_endpoint(store)} ({chain[0]}): check that it is up"
            " and reachable from here, then run the same command again (committed rows are kept)"
        )
    if kinds & _NO_CREDENTIALS or (_AZURE_AUTH in kinds and _status(chain) is None):
        return ConfigError(
            f"no credentials for the object store: set them {_HINTS[store]}, or"
            " JOBRUNNER_ANONYMOUS=1 for a public bucket"
        )
    if kinds & _BAD_SETUP:
        return ConfigError(
            f"the object store's credentials: {chain[0]}: fix AWS_PROFILE, the AWS_*"
            " variables or ~/.aws"
        )
    code, error = _client_error(chain)
    if code in ("NoSuchBucket", "ContainerNotFound"):
        what = "container" if code == "ContainerNotFound" else "bucket"
        bucket = error.get("BucketName") or f"the {what} named in input.path or output.path"
        return ConfigError(
            f"{what} {bucket} does not exist{_endpoint(store)}: create it or fix the path"
        )
    if code in _REFUSED or _status(chain) in (401, 403) or _forbidden(chain):
        said = f"{code}: {error.get('Message', '')}" if code else str(chain[0]).split("\n")[0]
        return ConfigError(
            f"the object store refused the request{_endpoint(store)} ({said}): check the"
            f" credentials (set {_HINTS[store]}) and their permissions on the bucket"
        )
    return None


# Where each store's client takes its credentials from, for the messages above.
_HINTS = {
    "s3": "as for the aws CLI: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws",
    "gs": "as for gcloud: GOOGLE_APPLICATION_CREDENTIALS or gcloud auth application-default login",
    "az": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with"
    " AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN",
}


def _store(chain: list[BaseException], kinds: set[tuple[str, str]]) -> str:
    """Which client raised: "az", "gs" or "s3", by the modules of the error's classes and of
    the code it passed through (gcsfs and s3fs both raise aiohttp's errors)."""
    modules = {m.split(".", 1)[0] for m, _ in kinds}
    for x in chain:
        tb = x.__traceback__
        while tb is not None:
            modules.add(str(tb.tb_frame.f_globals.get("__name__", "")).split(".", 1)[0])
            tb = tb.tb_next
    if modules & {"azure", "adlfs"}:
        return "az"
    return "gs" if modules & {"gcsfs", "google"} else "s3"


def _status(chain: list[BaseException]) -> int | None:
    """The HTTP status of the first azure-core or gcsfs error in `chain` (`status_code`,
    `code`), None where none holds one."""
    for x in chain:
        mod = type(x).__module__
        status = getattr(x, "status_code", None) if mod.startswith("azure.") else None
        if mod == "gcsfs.retry":
            status = getattr(x, "code", None)
        if isinstance(status, int):
            return status
    return None


def _forbidden(chain: list[BaseException]) -> bool:
    """gcsfs raises a 403 as a plain OSError("Forbidden: <url>\n<message>")."""
    return any(type(x) is OSError and str(x).startswith("Forbidden: ") for x in chain)


def _chain(e: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _client_error(chain: list[BaseException]) -> tuple[str, dict]:
    """(the error code, its Error fields) of the first botocore ClientError in `chain`, or of
    the first azure-core HttpResponseError (its `error_code`, `Message` its reason)."""
    for x in chain:
        response = getattr(x, "response", None)  # other clients' errors hold objects here
        error = response.get("Error") if isinstance(response, dict) else None
        if isinstance(error, dict) and error.get("Code"):
            return str(error["Code"]), error
        code = getattr(x, "error_code", None) if type(x).__module__.startswith("azure.") else None
        if code:
            return str(getattr(code, "value", code)), {"Message": getattr(x, "reason", "")}
    return "", {}


def _endpoint(store: str) -> str:
    """The endpoint the environment points `store`'s client at, where it names one (Azure's
    is inside a connection string that holds the key: never shown)."""
    if store == "gs":
        url = os.environ.get("STORAGE_EMULATOR_HOST")
        return f" at {url} (STORAGE_EMULATOR_HOST)" if url else ""
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f" at {url} (AWS_ENDPOINT_URL)" if url and store == "s3" else ""
