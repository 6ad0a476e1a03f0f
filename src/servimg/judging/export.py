"""`servimg policy export`: the deploy side's own policy files, made from what `servimg check` enforces, so
that a runtime or an admission controller refuses an unqualified image without servimg (issue 31).

- **containers** (`--runtime containers`): `policy.json` (containers-policy.json(5)) and `registries.d/`
  (containers-registries.d(5)), the files podman and skopeo take with `--policy`/`--registries.d` and
  CRI-O reads from /etc/containers. `--signatures gpg`: a `signedBy` requirement (`keyType: GPGKeys`)
  with signatures from the lookaside URL; `--signatures sigstore`: `sigstoreSigned` with the public key,
  and `use-sigstore-attachments: true` (cosign's `.sig` tags). Everything else is rejected (`default:
  reject`): a policy that admits any image without a signature proves nothing.
- **Kyverno** (`--kyverno`): a ClusterPolicy (kyverno.io/v1) whose `verifyImages` rule checks cosign
  signatures with the trusted keys (no transparency log: servimg's signatures are key-based and offline)
  and, per predicate type the policy requires, attestations with conditions on the predicate.
- **policy-controller** (`--policy-controller`): a ClusterImagePolicy (policy.sigstore.dev/v1beta1): a
  key authority per trusted key (no `ctlog`: tlog verification off) with CUE policies on the attestations.

Pure: documents in, documents out; the command writes them (atomically).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from servimg.core.errors import ServimgError
from servimg.judging.policy import Policy
from servimg.statements import attest
from servimg.statements import derived as provenance

RUNTIMES = ("containers",)
SIGNATURES = ("gpg", "sigstore")


class ExportError(ServimgError):
    """A policy cannot be exported as asked (a missing key, a registry scope that is not one)."""


# A registries.d / policy.json scope: a host[:port], optionally with a repository path (no tag, digest).
_SCOPE = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._/-][a-z0-9]+)*)?")


def check_scope(registry: str) -> str:
    if not _SCOPE.fullmatch(registry):
        raise ExportError(
            f"--registry {registry!r} is not a registry scope",
            hint="HOST[:PORT] or HOST[:PORT]/REPO (no scheme, tag or digest), e.g. 127.0.0.1:5000/servimg",
        )
    return registry


# ------------------------------------------------------------------------------------------- containers


_PGP_ARMOR = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"
_PEM_PUBLIC = b"-----BEGIN PUBLIC KEY-----"


def key_kind(data: bytes) -> str | None:
    """`gpg` for an OpenPGP public key (armored, or binary: its first packet a public key, tag 6), `pem` for
    a PEM public key, None for anything else."""
    text = data.lstrip()
    if text.startswith(_PGP_ARMOR):
        return "gpg"
    if text.startswith(_PEM_PUBLIC):
        return "pem"
    if data[:1] and data[0] & 0x80:  # an OpenPGP packet header (RFC 4880 §4.2): old or new format
        tag = data[0] & 0x3F if data[0] & 0x40 else (data[0] >> 2) & 0x0F
        return "gpg" if tag == 6 else None
    return None


def containers_key(signatures: str, key_file: str, data: bytes) -> bytes:
    """The key a containers policy can use for `signatures`, refused with the way out when it is of the
    other kind: a PEM key under `signedBy` (GPGKeys) makes skopeo and podman refuse every image ("No public
    keys imported") while the export looked fine (issue 48 item 3)."""
    wanted = "gpg" if signatures == "gpg" else "pem"
    found = key_kind(data)
    if found == wanted:
        return data
    said = {"gpg": "an OpenPGP (GPG) public key", "pem": "a PEM public key", None: "no public key we know"}
    hint = (
        "pass the armored GPG public key of the key `servimg push --gpg-key FPR` signs with "
        "(gpg --export --armor FPR > key.asc), or use --signatures sigstore for a PEM key"
        if wanted == "gpg"
        else "pass the PEM public key (`servimg key generate` writes it as NAME.pub), or use "
        "--signatures gpg for a GPG key"
    )
    raise ExportError(
        f"--key {key_file} is {said[found]}, but --signatures {signatures} needs {said[wanted]}", hint=hint
    )


def containers_policy(signatures: str, key: bytes, registry: str) -> dict[str, object]:
    """policy.json: the servimg registry scope needs a signature by the key, every other image is refused.
    The key is in the file (`keyData`, containers-policy.json(5)), not a path on this machine: the folder is
    complete and can be copied to the nodes as it is."""
    key_data = base64.b64encode(key).decode()
    if signatures == "gpg":
        requirement: dict[str, object] = {"type": "signedBy", "keyType": "GPGKeys", "keyData": key_data}
    else:
        # cosign's identity is the repository (its payload's docker-reference has no tag).
        requirement = {
            "type": "sigstoreSigned",
            "keyData": key_data,
            "signedIdentity": {"type": "matchRepository"},
        }
    return {"default": [{"type": "reject"}], "transports": {"docker": {check_scope(registry): [requirement]}}}


def registries_d(signatures: str, registry: str, lookaside: str | None) -> dict[str, object]:
    entry: dict[str, object]
    if signatures == "gpg":
        if not lookaside:
            raise ExportError(
                "--signatures gpg needs --lookaside URL (where the signatures are served)",
                hint="the DIR given to `servimg push --lookaside`, served over HTTP (or file:///DIR)",
            )
        entry = {"lookaside": lookaside}
    else:
        entry = {"use-sigstore-attachments": True}
    return {"docker": {check_scope(registry): entry}}


# ---------------------------------------------------------------------------------------------- kyverno


@dataclass(frozen=True)
class Admission:
    """What an admission policy requires, from a check policy: trusted keys (PEM), how many must sign,
    the registry scope, and conditions per predicate type."""

    name: str
    registry: str
    keys: tuple[str, ...]  # PEM public keys
    threshold: int
    require: tuple[str, ...]  # predicate type URIs
    ladders: tuple[str, ...]
    builders: tuple[str, ...] = (provenance.DEFAULT_BUILDER_ID,)

    @classmethod
    def of(cls, policy: Policy, registry: str, keys: Sequence[str], name: str) -> Admission:
        if not keys:
            raise ExportError(
                "no trusted public key: an admission policy without one admits anything",
                hint="pass --key PUB.pem, or name keys in the policy file (keys:)",
            )
        require = [attest.PROVENANCE_V1] if "provenance" in policy.require else []
        if "verify" in policy.require or policy.ladders:
            require.append(attest.TEST_RESULT_V01)
        if "vsa" in policy.require:
            require.append(attest.VSA_V1)
        if "sbom" in policy.require:
            require.append(attest.CYCLONEDX_BOM)
        require += [r for r in policy.require if "/" in r]
        slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50] or "policy"
        return cls(
            f"servimg-{slug}",
            check_scope(registry),
            tuple(keys),
            policy.threshold,
            tuple(dict.fromkeys(require)),
            policy.ladders,
            policy.builders,
        )


def _kyverno_conditions(admission: Admission, predicate_type: str) -> list[dict[str, object]]:
    """Kyverno evaluates conditions (JMESPath over the predicate) on each statement of the type."""
    if predicate_type == attest.TEST_RESULT_V01:
        # Every test-result (the verify result, each ladder receipt) must have PASSED; the ones that count
        # are servimg's (a verify result, or one of the required ladders).
        roles = [
            {
                "key": "{{ configuration[?annotations.role=='verify'] | length(@) }}",
                "operator": "GreaterThan",
                "value": 0,
            }
        ]
        roles += [
            {
                "key": "{{ configuration[?annotations.role=='ladder'].annotations.ladder | [0] || '' }}",
                "operator": "Equals",
                "value": ladder,
            }
            for ladder in admission.ladders
        ]
        return [{"all": [{"key": "{{ result }}", "operator": "Equals", "value": "PASSED"}], "any": roles}]
    if predicate_type == attest.VSA_V1:
        return [{"all": [{"key": "{{ verificationResult }}", "operator": "Equals", "value": "PASSED"}]}]
    if predicate_type == attest.PROVENANCE_V1:
        builder = "{{ runDetails.builder.id }}"
        return [{"any": [{"key": builder, "operator": "Equals", "value": b} for b in admission.builders]}]
    return []


def _attestors(admission: Admission) -> list[dict[str, object]]:
    entries = [
        {
            "keys": {
                "publicKeys": pem,
                "signatureAlgorithm": "sha256",
                "rekor": {"ignoreTlog": True},
                "ctlog": {"ignoreSCT": True},
            }
        }
        for pem in admission.keys
    ]
    return [{"count": admission.threshold, "entries": entries}]


def kyverno_policy(admission: Admission) -> dict[str, object]:
    attestations = []
    for predicate_type in admission.require:
        item: dict[str, object] = {"type": predicate_type, "attestors": _attestors(admission)}
        conditions = _kyverno_conditions(admission, predicate_type)
        if conditions:
            item["conditions"] = conditions
        attestations.append(item)
    verify: dict[str, object] = {
        "imageReferences": [f"{admission.registry}/*"],
        "mutateDigest": True,
        "verifyDigest": True,
        "required": True,
        "attestors": _attestors(admission),
        "attestations": attestations,
    }
    return {
        "apiVersion": "kyverno.io/v1",
        "kind": "ClusterPolicy",
        "metadata": {
            "name": admission.name,
            "annotations": {
                "policies.kyverno.io/title": "servimg: signed, qualified images only",
                "policies.kyverno.io/description": "Exported by `servimg policy export --kyverno` from the "
                "policy `servimg check` enforces (docs/ecosystem.md).",
            },
        },
        "spec": {
            "validationFailureAction": "Enforce",
            "background": False,
            "webhookTimeoutSeconds": 30,
            "rules": [
                {
                    "name": "servimg-evidence",
                    "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                    "verifyImages": [verify],
                }
            ],
        },
    }


# ------------------------------------------------------------------------------------ policy-controller


def _cue(admission: Admission, predicate_type: str) -> str:
    lines = [f"predicateType: {json.dumps(predicate_type)}"]
    if predicate_type == attest.TEST_RESULT_V01:
        lines.append('predicate: result: "PASSED"')
    elif predicate_type == attest.VSA_V1:
        lines.append('predicate: verificationResult: "PASSED"')
    elif predicate_type == attest.PROVENANCE_V1:
        builders = " | ".join(json.dumps(b) for b in admission.builders)
        lines.append(f"predicate: runDetails: builder: id: {builders}")
    return "\n".join(lines) + "\n"


def policy_controller_policy(admission: Admission) -> dict[str, object]:
    if admission.threshold > 1:
        raise ExportError(
            f"threshold {admission.threshold}: a ClusterImagePolicy admits an image when any one authority "
            "matches, so N distinct signers cannot be required there",
            hint="export it with --kyverno (its attestors take a count), or lower the threshold to 1",
        )
    authorities = []
    for i, pem in enumerate(admission.keys):
        attestations = [
            {
                "name": f"{attest.KINDS.get(t, 'custom')}-{n}",
                "predicateType": t,
                "policy": {"type": "cue", "data": _cue(admission, t)},
            }
            for n, t in enumerate(admission.require)
        ]
        # No ctlog: policy-controller then skips transparency-log verification (pkg/webhook/validator.go).
        authorities.append(
            {
                "name": f"servimg-key-{i}",
                "key": {"data": pem, "hashAlgorithm": "sha256"},
                "attestations": attestations,
            }
        )
    spec = {"images": [{"glob": f"{admission.registry}/**"}], "authorities": authorities, "mode": "enforce"}
    return {
        "apiVersion": "policy.sigstore.dev/v1beta1",
        "kind": "ClusterImagePolicy",
        "metadata": {"name": admission.name},
        "spec": spec,
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PEM keys, CUE policies) as literal blocks, the way people write them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def to_yaml(doc: Mapping[str, object]) -> bytes:
    return yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False, width=1000).encode()
