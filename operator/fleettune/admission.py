"""What the operator lets a TuningRun put into its trial Jobs (pure).

A TuningRun author can create Jobs only through the operator, with the operator's rights:
so which images trials may run, as whom, and whether they may run privileged is the
cluster admin's decision, made in the operator's own configuration (environment variables
the Helm chart sets from ``trialPolicy`` values), never the run's:

* ``FLEETTUNE_ALLOW_PRIVILEGED_TRIALS`` (``true``/``false``, default false):
  ``spec.targets[].allowPrivileged`` is refused unless it is true;
* ``FLEETTUNE_ALLOWED_IMAGES``: comma-separated image patterns a run may name in
  ``spec.jobTemplate.image`` or ``spec.targets[].image``. A pattern with ``*``/``?``/``[``
  is a glob over the whole reference; one ending in ``/`` allows every repository under
  it; anything else is a repository (any tag or digest of exactly it). The repository of
  the operator's own job image (``FLEETTUNE_JOB_IMAGE``) is always allowed, and is all
  that is allowed when the variable is unset;
* ``FLEETTUNE_JOB_IMAGE``: the image of trials whose run names none (`default_job_image`);
* ``FLEETTUNE_TRIAL_RUN_AS_USER``: the UID, GID and fsGroup of trial Pods (default 10001);
  empty: none set, the platform assigns them (OpenShift's restricted-v2 SCC). Either way
  the Pods run as non-root, read-only, without privilege escalation or capabilities;
* ``FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS``: comma-separated Secret names (in the run's
  namespace) added to every trial Pod's imagePullSecrets; a run adds its own
  (``spec.jobTemplate.imagePullSecrets``, ``spec.targets[].imagePullSecrets``) freely, since
  the images themselves are what the allow-list restricts;
* ``FLEETTUNE_TRIAL_SERVICE_ACCOUNT``: the ServiceAccount of trial Pods (default: none set,
  the namespace's ``default``); its token is never mounted;
* ``FLEETTUNE_DEFAULT_QUEUE``: the Kueue LocalQueue of trial Jobs whose run names none
  (``spec.queue``); unset: such Jobs go to no queue (docs/operations/multikueue.md);
* ``FLEETTUNE_ALLOWED_SERVICE_ACCOUNTS``: comma-separated ServiceAccount names (or globs;
  ``*``: any) a run may name in ``spec.jobTemplate.serviceAccountName``, since a
  ServiceAccount can carry privileges (an SCC, a PSA exemption, cloud IAM). Unset: only
  ``FLEETTUNE_TRIAL_SERVICE_ACCOUNT`` itself.

A value the operator cannot read is a configuration error, never a silent default
(`OperatorConfigError`, naming the variable): the operator checks its policy at start-up
(`TrialPolicy.from_env`, which raises it), and should it meet one later, every run it
configures fails with ``Ready=False, reason=InvalidOperatorConfig`` and the same message.
(``FLEETTUNE_ALLOW_PRIVILEGED_TRIALS`` is the exception: any value but a clear "true" is
false, so a typo never opens the door.)

Also here: node selectors the API server would refuse in a Pod (an invalid label key or
value can match no node and would only make every Job creation fail).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from fleettune.api import DNS_LABEL, TuningRunSpec
from fleettune.names import bounded

ALLOW_PRIVILEGED_ENV = "FLEETTUNE_ALLOW_PRIVILEGED_TRIALS"
ALLOWED_IMAGES_ENV = "FLEETTUNE_ALLOWED_IMAGES"
JOB_IMAGE_ENV = "FLEETTUNE_JOB_IMAGE"
RUN_AS_USER_ENV = "FLEETTUNE_TRIAL_RUN_AS_USER"
IMAGE_PULL_SECRETS_ENV = "FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS"
SERVICE_ACCOUNT_ENV = "FLEETTUNE_TRIAL_SERVICE_ACCOUNT"
ALLOWED_SERVICE_ACCOUNTS_ENV = "FLEETTUNE_ALLOWED_SERVICE_ACCOUNTS"
DEFAULT_QUEUE_ENV = "FLEETTUNE_DEFAULT_QUEUE"
DEFAULT_JOB_IMAGE = "ghcr.io/fleettune/job:0.1.0"
DEFAULT_RUN_AS_USER = 10001
MAX_ID = 2**31 - 1  # Kubernetes' bound on runAsUser, runAsGroup and fsGroup
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(DNS_LABEL)  # a LocalQueue name, as spec.queue.name takes it
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def default_job_image() -> str:
    """The image of runs that name none: the chart sets FLEETTUNE_JOB_IMAGE on the operator."""
    return os.environ.get(JOB_IMAGE_ENV) or DEFAULT_JOB_IMAGE


class AdmissionError(ValueError):
    """A run the operator will not turn into Jobs; the message names the field. ``reason`` is
    the Ready condition's: Forbidden (the operator's configuration does not allow it),
    InvalidSpec (it cannot work) or InvalidOperatorConfig (`OperatorConfigError`)."""

    def __init__(self, message: str, reason: str = "Forbidden") -> None:
        super().__init__(message)
        self.reason = reason


class OperatorConfigError(AdmissionError):
    """The operator's own trial policy (its environment) holds a value it cannot read. Raised
    by `TrialPolicy.from_env` (at start-up); a run configured under it fails with this reason."""

    def __init__(self, message: str) -> None:
        super().__init__(f"the operator's configuration: {message}", "InvalidOperatorConfig")


def repository(image: str) -> str:
    """The image reference without its tag or digest (``host:5000/a/b:1.0`` → ``host:5000/a/b``)."""
    ref = image.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    return ref[:colon] if colon > slash else ref


def _has_host(image: str) -> bool:
    first, sep, _ = image.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def normalize(image: str) -> str:
    """Docker's short forms spelled out, so that ``alpine`` and ``docker.io/library/alpine``
    are one image to the allow-list (and cannot slip past it by spelling)."""
    image = image.strip()
    if not _has_host(image):
        image = f"docker.io/{image}"
    if image.startswith("index.docker.io/"):
        image = "docker.io/" + image.removeprefix("index.docker.io/")
    if image.startswith("docker.io/") and "/" not in image.removeprefix("docker.io/"):
        image = "docker.io/library/" + image.removeprefix("docker.io/")
    return image


def _names(env: Mapping[str, str], var: str, chart_value: str, problems: list[str]) -> tuple[str, ...]:
    """A comma-separated list of object names (DNS subdomains), each checked."""
    names = tuple(dict.fromkeys(n.strip() for n in env.get(var, "").split(",") if n.strip()))
    bad = [n for n in names if len(n) > 253 or not _DNS_SUBDOMAIN.match(n)]
    if bad:
        problems.append(f"{var}: {', '.join(repr(bounded(n, 80)) for n in bad)} is not an object name (lower-case "
                        f"letters, digits, '-' and '.', at most 253 characters; the chart value {chart_value})")
    return names


def _run_as_user(env: Mapping[str, str], problems: list[str]) -> int | None:
    raw = env.get(RUN_AS_USER_ENV)
    if raw is None:
        return DEFAULT_RUN_AS_USER
    raw = raw.strip()
    if not raw:
        return None  # the platform assigns one
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_ID:
        return int(raw)
    problems.append(f"{RUN_AS_USER_ENV}={bounded(raw, 40)!r}: expected a non-root UID from 1 to {MAX_ID}, or empty "
                    "to let the platform assign one (the chart value trialPolicy.runAsUser, null to omit it)")
    return None


@dataclass(frozen=True)
class TrialPolicy:
    allow_privileged: bool = False
    allowed_images: tuple[str, ...] = ()
    job_image: str = ""
    # UID, GID and fsGroup of trial Pods; None: left to the platform (runAsNonRoot stays).
    run_as_user: int | None = DEFAULT_RUN_AS_USER
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str | None = None
    allowed_service_accounts: tuple[str, ...] = ()
    default_queue: str | None = None  # Kueue LocalQueue of runs that name none

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrialPolicy:
        """The policy in the operator's environment; raises OperatorConfigError naming every
        variable whose value it cannot read."""
        env = os.environ if env is None else env
        raw = env.get(ALLOW_PRIVILEGED_ENV, "").strip().lower()
        if raw not in _TRUE | _FALSE:
            # A typo must not open the door: anything but a clear "true" is false.
            raw = "false"
        patterns = tuple(p.strip() for p in env.get(ALLOWED_IMAGES_ENV, "").split(",") if p.strip())
        job_image = env.get(JOB_IMAGE_ENV) or default_job_image()
        problems: list[str] = []
        run_as_user = _run_as_user(env, problems)
        secrets = _names(env, IMAGE_PULL_SECRETS_ENV, "trialPolicy.imagePullSecrets", problems)
        accounts = _names(env, SERVICE_ACCOUNT_ENV, "trialPolicy.serviceAccountName", problems)
        if len(accounts) > 1:
            problems.append(f"{SERVICE_ACCOUNT_ENV}: one ServiceAccount name, not {len(accounts)} "
                            "(the chart value trialPolicy.serviceAccountName)")
        allowed_accounts = tuple(
            dict.fromkeys(p.strip() for p in env.get(ALLOWED_SERVICE_ACCOUNTS_ENV, "").split(",") if p.strip())
        )
        queue = env.get(DEFAULT_QUEUE_ENV, "").strip() or None
        if queue is not None and (len(queue) > 63 or not _DNS_LABEL.match(queue)):
            problems.append(f"{DEFAULT_QUEUE_ENV}={bounded(queue, 80)!r}: not a LocalQueue name (lower-case letters, "
                            "digits and '-', at most 63 characters; the chart value trialPolicy.queue)")
        if problems:
            raise OperatorConfigError("; ".join(problems))
        return cls(default_queue=queue, allow_privileged=raw in _TRUE, allowed_images=patterns, job_image=job_image,
                   run_as_user=run_as_user, image_pull_secrets=secrets,
                   service_account=accounts[0] if accounts else None,
                   allowed_service_accounts=allowed_accounts)

    def service_account_allowed(self, name: str) -> bool:
        """Whether a run may name ServiceAccount ``name``: the policy's own (the namespace's
        ``default`` when it sets none), or one matching FLEETTUNE_ALLOWED_SERVICE_ACCOUNTS."""
        if name == (self.service_account or "default"):
            return True
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.allowed_service_accounts)

    def image_allowed(self, image: str) -> bool:
        wanted = normalize(image)
        for pattern in (repository(self.job_image), *self.allowed_images):
            if any(c in pattern for c in "*?["):
                if fnmatch.fnmatchcase(image, pattern) or fnmatch.fnmatchcase(wanted, normalize(pattern)):
                    return True
            elif pattern.endswith("/"):
                prefix = pattern if _has_host(pattern) else normalize(pattern + "x")[:-1]
                if wanted.startswith(prefix):
                    return True
            elif repository(wanted) == normalize(repository(pattern)):
                return True
        return False

    def describe(self) -> str:
        allowed = [repository(self.job_image), *self.allowed_images]
        return ", ".join(dict.fromkeys(allowed))


def check_trial_policy(spec: TuningRunSpec, policy: TrialPolicy) -> None:
    """Raise AdmissionError naming the first field that asks for more than ``policy`` allows."""
    template = spec.job_template.image
    account = spec.job_template.service_account_name
    if account and not policy.service_account_allowed(account):
        allowed = ", ".join(dict.fromkeys([policy.service_account or "default", *policy.allowed_service_accounts]))
        raise AdmissionError(f"spec.jobTemplate.serviceAccountName: ServiceAccount {bounded(account, 100)!r} is not "
                             f"allowed by the operator's configuration (allowed: {bounded(allowed, 300)}; the chart "
                             "value trialPolicy.allowedServiceAccounts)")
    if template and not policy.image_allowed(template):
        raise AdmissionError(f"spec.jobTemplate.image: image {bounded(template, 200)!r} is not allowed by the "
                          f"operator's configuration (allowed: {bounded(policy.describe(), 300)}; the chart "
                          "value trialPolicy.allowedImages)")
    for i, target in enumerate(spec.targets):
        if target.allow_privileged and not policy.allow_privileged:
            raise AdmissionError(f"spec.targets[{i}].allowPrivileged: privileged trials are disabled by the "
                              "operator's configuration (the chart value trialPolicy.allowPrivileged)")
        if target.image and not policy.image_allowed(target.image):
            raise AdmissionError(f"spec.targets[{i}].image: image {bounded(target.image, 200)!r} is not allowed "
                              f"by the operator's configuration (allowed: {bounded(policy.describe(), 300)}; "
                              "the chart value trialPolicy.allowedImages)")


def _label_key_problem(key: str) -> str | None:
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "its prefix is not a DNS subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return "not a valid label key (at most 63 characters: letters, digits, '-', '_', '.')"
    return None


def check_node_selectors(spec: TuningRunSpec) -> None:
    """A node selector that is not made of valid label keys and values matches no node, and
    the API server refuses a Job that carries it: say so once, naming the field."""
    for i, target in enumerate(spec.targets):
        for key, value in (target.node_selector or {}).items():
            where = f"spec.targets[{i}].nodeSelector"
            if (problem := _label_key_problem(key)) is not None:
                raise AdmissionError(f"{where}: key {bounded(key, 100)!r}: {problem}", "InvalidSpec")
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise AdmissionError(f"{where}: the value of {bounded(key, 100)!r} ({bounded(value, 80)!r}, "
                                  f"{len(value)} characters) is not a valid label value (at most 63 characters: "
                                  "letters, digits, '-', '_', '.')", "InvalidSpec")
