"""`servimg policy export`: policy.json + registries.d/ (podman, skopeo, CRI-O), a Kyverno ClusterPolicy and
a policy-controller ClusterImagePolicy, from the policy `servimg check` enforces (judging.export)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from servimg.core.atomic import atomic_write
from servimg.core.errors import UsageError
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt
from servimg.judging import export
from servimg.judging.policy import Policy
from servimg.signing.dsse import DsseError, VerifyKey


def policy_export(p: params.PolicyExport, ctx: Context) -> Iterator[Outcome]:
    def run() -> Outcome:
        files = _documents(p)
        p.out.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            path = p.out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
        written = sorted(str(p.out / name) for name in files)
        return Outcome(str(p.out), {"written": written})

    yield attempt(str(p.out), run)


def _documents(p: params.PolicyExport) -> dict[str, bytes]:
    """Every file, made before any is written: a bad key or flag writes nothing."""
    if not (p.runtime or p.kyverno or p.policy_controller):
        raise UsageError(
            "nothing to export", hint="--runtime containers, --kyverno and/or --policy-controller"
        )
    files: dict[str, bytes] = {}
    if p.runtime == "containers":
        if len(p.key) != 1:
            raise UsageError(f"--runtime containers takes exactly one --key, not {len(p.key)}")
        if not p.key[0].is_file():
            raise UsageError(f"--key {p.key[0]}: no such file", hint="the path of a public key file")
        key = export.containers_key(p.signatures, str(p.key[0]), p.key[0].read_bytes())
        policy = export.containers_policy(p.signatures, key, p.registry)
        files["policy.json"] = json.dumps(policy, indent=2).encode() + b"\n"
        files["registries.d/servimg.yaml"] = export.to_yaml(
            export.registries_d(p.signatures, p.registry, p.lookaside)
        )
    if p.kyverno or p.policy_controller:
        admission = _admission(p)
        if p.kyverno:
            files["kyverno-clusterpolicy.yaml"] = export.to_yaml(export.kyverno_policy(admission))
        if p.policy_controller:
            files["clusterimagepolicy.yaml"] = export.to_yaml(export.policy_controller_policy(admission))
    return files


def _admission(p: params.PolicyExport) -> export.Admission:
    loaded = Policy.load(p.policy) if p.policy is not None else Policy()
    policy = loaded.merged(ladders=p.require_ladder, keys=p.key)
    pems = []
    for path in policy.all_keys():
        try:
            pems.append(VerifyKey.load(path).to_pem().decode())
        except DsseError as exc:
            raise UsageError(
                f"{path}: {exc.message}", hint="admission policies take PEM public keys"
            ) from None
    name = p.policy.stem if p.policy is not None else "default"
    return export.Admission.of(policy, p.registry, list(dict.fromkeys(pems)), name)
