"""A ladder's arms as independent chains: the unit one scheduler job runs (docs/ladder.md, "on a cluster").

An arm that reuses another arm's server (`server: reuse:<arm>`) or its retained cache
(`caches: {x: retain-from:<arm>}`) must run after that arm, on the same host, while the server runs or the
cache directory is there: the two belong to one chain. Arms linked by neither are independent and may run
at the same time on different nodes. Chains keep the ladder's declared order inside, and are numbered by
their first arm's position, so the plan is a pure function of the definition.
"""

from __future__ import annotations

from dataclasses import dataclass

from servimg.ladder.definition import ArmSpec, LadderDefinition


@dataclass(frozen=True)
class Chain:
    """Arms that must run one after another in one job; `index` numbers the job (0, 1, …)."""

    index: int
    arms: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"chain-{self.index}"


def depends_on(arm: ArmSpec) -> tuple[str, ...]:
    """The earlier arms `arm` needs on its host: the server it reuses, the caches it retains."""
    needed = [arm.reuses] if arm.reuses is not None else []
    needed += [mode.removeprefix("retain-from:") for mode in arm.caches.values() if mode != "wipe"]
    return tuple(sorted(set(needed)))


def chains(ladder: LadderDefinition) -> tuple[Chain, ...]:
    """Connected components of the dependency graph (union-find over arm ids), in declared order."""
    parent = {a.id: a.id for a in ladder.arms}

    def root(arm_id: str) -> str:
        while parent[arm_id] != arm_id:
            parent[arm_id] = parent[parent[arm_id]]
            arm_id = parent[arm_id]
        return arm_id

    for arm in ladder.arms:
        for needed in depends_on(arm):
            parent[root(arm.id)] = root(needed)
    groups: dict[str, list[str]] = {}
    for arm in ladder.arms:
        groups.setdefault(root(arm.id), []).append(arm.id)
    return tuple(Chain(i, tuple(ids)) for i, ids in enumerate(groups.values()))
