"""A local S3-compatible HTTP endpoint for tests and benchmarks: moto's server in a child process.

``start_s3_endpoint()`` runs ``python -m tests.helpers.s3_server`` (moto's ``ThreadedMotoServer``
on 127.0.0.1, a free port chosen by the OS), creates one bucket and two IAM users through the
S3/IAM HTTP APIs, then switches the server's IAM enforcement on — from then on every request
must be signed by one of those users and is checked against their policies:

* ``writer``: ``s3:*`` on the bucket;
* ``reader``: ``s3:GetObject`` and ``s3:ListBucket`` only (a write is ``AccessDenied``).

Clients talk to it exactly as to AWS: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and ``AWS_DEFAULT_REGION`` in the environment (:meth:`S3Endpoint.env`),
``s3://BUCKET/...`` URLs, s3fs over HTTP. The child exits when its stdin closes, so a crashed
test run leaves no server behind. Needs the ``test`` and ``s3`` extras (moto[server], s3fs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["S3Endpoint", "start_s3_endpoint", "use_identity"]

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"


@dataclass
class S3Endpoint:
    """A running local S3 endpoint with a bucket and a writer and a reader identity."""

    url: str
    bucket: str
    keys: dict[str, tuple[str, str]] = field(repr=False)
    """identity -> (access key id, secret access key)."""
    proc: subprocess.Popen = field(repr=False)

    def env(self, identity: str) -> dict[str, str]:
        """Environment variables that make boto/s3fs talk to this endpoint as ``identity``."""
        key_id, secret = self.keys[identity]
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
                "AWS_DEFAULT_REGION": REGION}

    def secrets(self) -> list[str]:
        """Every credential string (key ids and secrets): none may ever be written anywhere."""
        return [s for pair in self.keys.values() for s in pair]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _policy(bucket: str, actions: list[str]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": actions,
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]})


def start_s3_endpoint(bucket: str = "osprey-shared") -> S3Endpoint:
    """Start the server, create ``bucket`` and the two users, turn IAM checks on."""
    import boto3

    proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.s3_server"], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"moto server did not start (printed {line!r})")
    url = f"http://127.0.0.1:{int(line.split()[1])}"
    try:
        # Before IAM checks are on, any signature is accepted: set the world up.
        boot = dict(endpoint_url=url, region_name=REGION, aws_access_key_id="setup", aws_secret_access_key="setup")
        boto3.client("s3", **boot).create_bucket(Bucket=bucket)
        iam = boto3.client("iam", **boot)
        keys = {}
        for user, actions in (("writer", ["s3:*"]), ("reader", ["s3:GetObject", "s3:ListBucket"])):
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName=f"{user}-{bucket}", PolicyDocument=_policy(bucket, actions))
            k = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (k["AccessKeyId"], k["SecretAccessKey"])
        req = urllib.request.Request(f"{url}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
    except BaseException:
        proc.kill()
        raise
    return S3Endpoint(url=url, bucket=bucket, keys=keys, proc=proc)


def use_identity(monkeypatch, endpoint: S3Endpoint, identity: str) -> None:
    """Make this process talk to ``endpoint`` as ``identity`` (credentials in the environment).

    s3fs caches filesystem instances by their arguments, not by the environment's credentials,
    so the cache is cleared: the next ``s3://`` access signs as the new identity.
    """
    import s3fs

    for k, v in endpoint.env(identity).items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()


def _serve() -> None:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(f"PORT {server.get_host_and_port()[1]}", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nobody reads the pipe any more: never block on it
    sys.stdin.read()  # until the parent closes stdin (or dies)
    server.stop()


if __name__ == "__main__":
    _serve()
