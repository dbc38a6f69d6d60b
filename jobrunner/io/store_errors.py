"""The user-facing error for a failure an object store's client raised (s3fs over botocore and
aiohttp), wherever it was raised: the CLI applies it to any error that reaches it, as
`errors.from_os_error`, so a store that cannot be reached is never an internal error (70).

- the store cannot be reached (connection refused or reset, a timeout): 75, the same command
  succeeds once it is back; committed rows are kept;
- the store refuses the credentials, or has none to use (or AWS_PROFILE names no profile), or
  denies the request: 78;
- a bucket that does not exist: 78, naming it;
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
}
_UNTRUSTED = {  # certificate verification failed: no retry helps
    ("ssl", "SSLCertVerificationError"),
    ("aiohttp.client_exceptions", "ClientConnectorCertificateError"),
}
_NO_CREDENTIALS = {("botocore.exceptions", "NoCredentialsError")}
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
    if kinds & _UNTRUSTED or (
        ("botocore.exceptions", "SSLError") in kinds
        and any("CERTIFICATE_VERIFY_FAILED" in str(x).upper().replace(" ", "_") for x in chain)
    ):
        return ConfigError(
            f"the object store's TLS certificate is not trusted{_endpoint()} ({chain[0]}):"
            " point AWS_CA_BUNDLE at the CA that signed it, or fix the endpoint's URL"
        )
    if kinds & _UNREACHABLE:
        return StoreError(
            f"cannot reach the object store{_endpoint()} ({chain[0]}): check that it is up"
            " and reachable from here, then run the same command again (committed rows are kept)"
        )
    if kinds & _NO_CREDENTIALS:
        return ConfigError(
            "no credentials for the object store: set them as for the aws CLI"
            " (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws), or"
            " JOBRUNNER_ANONYMOUS=1 for a public bucket"
        )
    if kinds & _BAD_SETUP:
        return ConfigError(
            f"the object store's credentials: {chain[0]}: fix AWS_PROFILE, the AWS_*"
            " variables or ~/.aws"
        )
    code, error = _client_error(chain)
    if code == "NoSuchBucket":
        bucket = error.get("BucketName") or "the bucket named in input.path or output.path"
        return ConfigError(
            f"bucket {bucket} does not exist{_endpoint()}: create it or fix the path"
        )
    if code in _REFUSED:
        return ConfigError(
            f"the object store refused the request{_endpoint()} ({code}:"
            f" {error.get('Message', '')}): check the credentials (environment, AWS_PROFILE,"
            " ~/.aws) and their permissions on the bucket"
        )
    return None


def _chain(e: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _client_error(chain: list[BaseException]) -> tuple[str, dict]:
    """(the S3 error code, its Error fields) of the first botocore ClientError in `chain`."""
    for x in chain:
        response = getattr(x, "response", None)  # other clients' errors hold objects here
        error = response.get("Error") if isinstance(response, dict) else None
        if isinstance(error, dict) and error.get("Code"):
            return str(error["Code"]), error
    return "", {}


def _endpoint() -> str:
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f" at {url} (AWS_ENDPOINT_URL)" if url else ""
