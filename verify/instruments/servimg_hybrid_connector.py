"""servimg's connector instrument: the "any KV connector attached" condition of the seed incident, and
nothing more (issue 47; docs/ladder.md, "The connector ladder").

It belongs to the ladder, never to the image under test: the ladder pins this file's sha256 (it is in the
pre-registration and the receipt) and the runner mounts it read-only into the arm's container, on
PYTHONPATH, where vLLM loads it through `--kv-transfer-config`'s `kv_connector_module_path`.

What it does. It attaches to both roles, declares hybrid support (SupportsHMA: without it vLLM turns the
hybrid KV cache manager off and refuses a hybrid model), reports 0 external tokens for every request and
restores, saves and frees nothing. So an arm with it differs from the arm without it in one variable: a
connector is attached. A correct scheduler then answers exactly as without one.

What it reports (the connector ladder's exercise gates). When the scheduler asks it about a new request,
it is handed the local prefix-cache hit the scheduler chose; it also looks up, read-only, each KV cache
group's own hit (the hybrid coordinator's `find_longest_cache_hit_per_group`, where the release has it).
A request whose full-attention group holds a deeper hit than its recurrent group is inside the divergence
window, the only place the seed bug can act. Counters, rewritten atomically after each request into
`$SERVIMG_INSTRUMENT_DIR/metrics.prom` (Prometheus text, read by the runner beside the server's /metrics),
and one JSON line per request in `requests.jsonl` there:

    servimg_instrument_requests_total                  requests the scheduler asked about
    servimg_instrument_local_hit_tokens_total          the local hits it was handed, summed
    servimg_instrument_divergent_requests_total        requests whose attention hit > recurrent hit
    servimg_instrument_handed_beyond_recurrent_total   requests handed a local hit deeper than the
                                                       recurrent group's: the bug's own act
    servimg_instrument_lookup_unavailable_total        requests where the per-group lookup was missing

Standard library and vLLM only; written for the vLLM v1 connector API of 0.26-0.32.
"""

import json
import os
import sys
import threading

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

_COUNTERS = (
    "requests",
    "local_hit_tokens",
    "divergent_requests",
    "handed_beyond_recurrent",
    "lookup_unavailable",
)


class _NoMetadata(KVConnectorMetadata):
    """Nothing travels from the scheduler to the workers."""


class _Report:
    """The counters and the per-request lines, written where the runner reads them."""

    def __init__(self, directory):
        self.directory = directory
        self.counts = dict.fromkeys(_COUNTERS, 0)
        self.lock = threading.Lock()

    def start(self):
        """Every counter at 0 before the first request, so the first request's delta is its own."""
        if self.directory:
            with self.lock:
                self._write()

    def record(self, line):
        if not self.directory:
            return
        with self.lock:
            self.counts["requests"] += 1
            self.counts["local_hit_tokens"] += line["local_hit"]
            attention, recurrent = line.get("attention_hit"), line.get("recurrent_hit")
            if attention is None:
                self.counts["lookup_unavailable"] += 1
            else:
                self.counts["divergent_requests"] += int(attention > recurrent)
                self.counts["handed_beyond_recurrent"] += int(line["local_hit"] > recurrent)
            with open(os.path.join(self.directory, "requests.jsonl"), "a") as out:
                out.write(json.dumps(line, sort_keys=True) + "\n")
            self._write()

    def _write(self):
        os.makedirs(self.directory, exist_ok=True)
        text = "".join(f"servimg_instrument_{name}_total {value}\n" for name, value in self.counts.items())
        temporary = os.path.join(self.directory, f".metrics.prom.{os.getpid()}")
        with open(temporary, "w") as out:
            out.write(text)
        os.replace(temporary, os.path.join(self.directory, "metrics.prom"))


def _per_group_hits(request):
    """(attention hit, recurrent hit) in tokens, looked up without side effects through the scheduler
    that is asking (the caller's frame); None where the release has no per-group lookup."""
    frame = sys._getframe(2)
    scheduler = frame.f_locals.get("self")
    coordinator = getattr(getattr(scheduler, "kv_cache_manager", None), "coordinator", None)
    lookup = getattr(coordinator, "find_longest_cache_hit_per_group", None)
    if lookup is None:
        return None
    _, hits = lookup(request.block_hashes, request.num_tokens - 1)
    return max(hits), min(hits)


class ServimgHybridConnector(KVConnectorBase_V1, SupportsHMA):
    """Attached, hybrid-capable, restores nothing, reports 0 external tokens."""

    # Says what it is: it restores no recurrent state, so it does NOT opt in to divergent local hybrid
    # hits (the gate's attribute, vllm-project/vllm#50344); a gated scheduler must reconcile for it.
    supports_divergent_local_hybrid_hits = False

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        # Only the scheduler's instance is asked about requests, and only it reports (the worker's
        # would overwrite its counters with zeros).
        scheduler = role == KVConnectorRole.SCHEDULER
        self._report = _Report(os.environ.get("SERVIMG_INSTRUMENT_DIR", "") if scheduler else "")
        self._report.start()

    # -- scheduler side ---------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        line = {"request_tokens": int(request.num_tokens), "local_hit": int(num_computed_tokens)}
        try:
            hits = _per_group_hits(request)
        except Exception as exc:  # an instrument never breaks the server it observes
            hits, line["lookup_error"] = None, repr(exc)[:200]
        if hits is not None:
            line["attention_hit"], line["recurrent_hit"] = int(hits[0]), int(hits[1])
        self._report.record(line)
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return None

    def build_connector_meta(self, scheduler_output):
        return _NoMetadata()

    def request_finished(self, request, block_ids):
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return False, None

    # -- worker side ------------------------------------------------------------------------------
    def start_load_kv(self, forward_context, **kwargs):
        return None

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):
        return None
